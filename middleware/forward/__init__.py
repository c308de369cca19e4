"""Forwarding a miss: one `Forwarder` per route owns the transport (the relay or LiteLLM), the
replica choice (it asks the router), failover, mid-stream resume and the record after the answer.

May import: the shared core (kvgate.middleware.config, errors, request, outcome, answers, litellm_env),
kvgate.middleware.routing and kvgate.middleware.telemetry; never cache/ (it reaches the response cache only
through outcome.AnswerSink), the pipeline or a face.
"""
