"""Storage helpers under both sides of index: one Redis client with a circuit (redis_link), sealed
values (sealed), soft failures (softfail), recovery of a damaged diskcache (recover) and WAL
checkpoints (wal). Imports neither index.kv nor index.responses."""
