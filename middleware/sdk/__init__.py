"""The Python faces: `Gateway` (litellm.completion's kwargs, sync and async) and the LiteLLM plugin.

May import: kvgate.middleware.build, the pipeline and the shared core; never kvgate.middleware.server.
"""
