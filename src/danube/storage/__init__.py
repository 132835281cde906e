"""Per-topic storage: WAL + durable segments (local | shared_fs | object_store), tiered reads, seal/resume."""
