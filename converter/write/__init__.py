"""Stage 4: write shards: the one shard writer (`base.ShardWriter`); each format's encoder lives in its home, `readers/formats/<format>/writer.py`."""
