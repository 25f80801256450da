"""Run the shard tasks: local fork and loky runners, Dask, the worker task, the output lock."""
