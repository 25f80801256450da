"""Stage 4: write shards (one base writer; one encoder per format)."""
