"""Stage 2: plan shards (incremental diff, shard arithmetic) and source fingerprints."""
