"""The reference CPU replica: SmolLM2-135M whose KV prefix is loaded from / saved to an index.chunks.ChunkStore (`kvgate replica`)."""
