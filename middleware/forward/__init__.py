"""Forwarding a miss: one `Forwarder` per route owns the transport (the relay or LiteLLM), the
replica choice (it asks the router), failover and mid-stream resume; it hands the answer back to
the pipeline (a `Forwarded`), which records it and then tells the forwarder it is done.

May import: the shared core (kvgate.middleware.config, errors, request, outcome, answers,
text_answers, litellm_env), kvgate.middleware.routing and kvgate.middleware.telemetry; never cache/
(the pipeline is where the two meet), the pipeline or a face.
"""
