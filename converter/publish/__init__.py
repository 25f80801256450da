"""Stage 5: publish the manifest atomically, reports, TFDS metadata."""
