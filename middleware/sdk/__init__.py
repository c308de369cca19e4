"""The Python faces: `Gateway` (litellm.completion's kwargs, sync and async) and the LiteLLM plugin.

May import: middleware.build, the pipeline and the shared core; never middleware.server.
"""
