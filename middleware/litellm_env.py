"""LiteLLM, imported the one way kvgate imports it: `from kvgate.middleware.litellm_env import litellm`.

Two of LiteLLM's settings exist only as environment variables that it reads once, when it is
imported, and offer no switch to set later; this module is the one place in the library that sets
them, as defaults (an operator's own value wins), just before that import:

- LITELLM_LOCAL_MODEL_COST_MAP: otherwise importing LiteLLM fetches its model price list over the
  network, which stalls or fails on a machine without access; the copy it ships is enough for us.
- AIOHTTP_KEEPALIVE_TIMEOUT (seconds, read into litellm.constants): LiteLLM keeps idle backend
  connections 120 s, while uvicorn-based servers (vLLM, our replicas) close them after 5 s, and
  reusing a connection the server is closing fails the request ("Connection error"). Idle for less
  than the servers' timeout, a pooled connection is never one they have dropped.

Any module that imports from `litellm` (litellm.types..., litellm.integrations...) imports this
module first, so those variables are in place whichever kvgate module loads LiteLLM first.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("AIOHTTP_KEEPALIVE_TIMEOUT", "3")

import litellm  # noqa: E402

litellm.suppress_debug_info = True  # its banners go to stdout; our errors say what failed

__all__ = ["litellm"]
