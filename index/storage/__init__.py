"""Storage helpers under both sides of index: one Redis client with a circuit (redis_link), sealed
values (sealed), soft failures (softfail), recovery of a damaged diskcache (recover), WAL
checkpoints (wal) and what kvgate takes from the environment (env: the model cache, secrets named
by variable, the offline defaults). Imports neither index.kv nor index.responses."""
