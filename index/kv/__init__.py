"""The KV side of index, shared by the router and the engines: chained block hashes (hashing),
prompts to hashes (prompt, tokenizer), which replica holds which blocks (prefix), vLLM's KV events
(kv_events) and the KV chunk store with its tiers (chunks). May import index.storage, never
index.responses (an engine process loads this side without the response store)."""
