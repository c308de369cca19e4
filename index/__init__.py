"""kvgate's data structures and stores, the bottom layer: it imports no other kvgate package.

Two sides, kept apart (import-linter contract):
    kv/          the KV side, shared with the engines: block hashing, prompts and tokenizers, the
                 prefix index, vLLM's KV events, the KV chunk store and its tiers
    responses/   the response store: entries, the semantic index and its vectors, eviction,
                 embedders, the verifier and the wrong-hit bound
    storage/     what both sides use to keep bytes: Redis link, sealed values, soft failures,
                 diskcache recovery and WAL checkpoints; what kvgate reads from the
                 environment (the model cache, secrets named by variable); a model dir's
                 tokenizer files as transformers reads them
"""
