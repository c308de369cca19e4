"""The reference CPU replica: SmolLM2-135M whose KV prefix is loaded from / saved to an kvgate.index.kv.chunks.ChunkStore (`kvgate replica`)."""
