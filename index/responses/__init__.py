"""The response store of index: cached answers and how they are found. Entry stores (entries), the
semantic index (semantic, vectors), eviction, cross-process following (follow), embedders, the
verifier, wrong-hit feedback (tighten, observations) and the `max_error_rate` rule (trust).
May import index.storage, never index.kv."""
