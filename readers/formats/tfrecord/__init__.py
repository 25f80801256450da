"""Everything TFRecord: wire codec (`wire`), shard encoder (`writer`), reader adapter (`reader`)."""
