"""The response cache: exact and semantic lookup, the verifier and the trust gate, storing
answers, the request log, feedback, erasing a tenant and invalidating tags (governance.py), and
where the cache's steps run (loop or worker thread).

Owns: `ResponseCache` (response_cache.py) and what it decides with. May import: index/, the shared
core (kvgate.middleware.config, errors, request, tags, outcome, answers, replay, litellm_env) and
kvgate.middleware.telemetry; never forward/, routing/, the pipeline or a face.
"""
