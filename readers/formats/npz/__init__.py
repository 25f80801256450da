"""Everything NPZ: shard encoder (`writer`), reader adapter (`reader`)."""
