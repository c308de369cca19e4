"""kvgate's data structures and stores: embedders, the semantic index (later: block hashing,
prefix index, KV chunk store)."""
