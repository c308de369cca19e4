"""Storage helpers under both sides of index: one Redis client with a circuit (redis_link), sealed
values (sealed), soft failures (softfail), recovery of a damaged diskcache (recover), WAL
checkpoints (wal), what kvgate takes from the environment (env: the model cache, secrets named
by variable, the offline defaults) and a model dir's tokenizer files as transformers reads them
(tokenizer_files: without transformers, both sides tokenize with them). Imports neither index.kv
nor index.responses."""
