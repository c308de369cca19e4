"""The Python faces: `Gateway` (litellm.completion's kwargs, sync and async), the LiteLLM plugin,
and `AdminClient` (a running proxy's admin API; `kvgate admin`).

May import: kvgate.middleware.build, the pipeline and the shared core; never kvgate.middleware.server.
"""
