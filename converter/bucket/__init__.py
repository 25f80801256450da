"""Output into an object store (``imgshard convert SRC s3://bucket/out``, ``gs://``).

A run into a bucket works in a local staging folder and keeps every cron promise of a
local run with the mechanisms an object store offers (no rename, no fsync, no flock):

* `converter.bucket.lock`: the run lock is an object created with a conditional create,
  renewed by a heartbeat, taken over safely once it has expired;
* `converter.bucket.uploads`: each shard and its index file go up with one PUT each,
  in a small thread pool, while the next shards are converted;
* `converter.bucket.output`: the staging folder (the remote manifest, the index files
  the planner reads, old shards a rewrite copies from), orphan removal, and the manifest
  published last with a compare-and-swap on the version read at the start;
* `converter.bucket.worker`: a shard task on a Dask worker with no shared filesystem
  (local scratch, direct upload).
"""
