"""The simulated replica: a prefix (KV) cache and timing model behind the OpenAI API (`kvgate sim-replica`)."""
