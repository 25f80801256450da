"""Reading throughput from a bucket vs a local folder, side by side in one run.

Starts a moto S3 server on 127.0.0.1 (loopback: no network latency or bandwidth limit,
so the numbers show the reading path's own cost, not a cloud's), converts a synthetic
dataset locally, uploads it, and times full passes over the train split, interleaved
round-robin so that machine noise hits every variant alike:

* ``tf_dataset`` (float32 one-hot batches): local; s3 without cache (one whole GET per
  shard per epoch); s3 with ``cache_dir`` warm (epochs after the first; the first, cold
  epoch is reported apart);
* ``keras_dataset`` (every batch by index; one PyDataset per variant, as `model.fit` keeps
  it): local; s3 ranged GETs; s3 cached. Deflated NPZ and gzip TFRecord shards are read
  whole and kept in memory per process by the random-access readers, so their later
  epochs make no requests at all: use ``--compression none`` to time ranged reads.

Usage::

    python scripts/remote_read_bench.py --samples 192 --size 128x192 --repeats 5 [--format npz]

Prints a Markdown table of medians (samples/s, MB/s of shard bytes) and the ratio to local.
Needs the ``test`` extra (moto[server], s3fs) and TensorFlow.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))


def _tf_epoch(ds, batch: int) -> int:
    n = 0
    for x, _ in ds.tf_dataset("train", batch, seed=0):
        n += int(x.shape[0])
    return n


def _keras_epoch(seq) -> int:
    n = 0
    for i in range(len(seq)):
        n += len(seq[i][0])
    return n


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=192)
    ap.add_argument("--size", default="128x192")
    ap.add_argument("--shard-size", default="1MB")
    ap.add_argument("--format", default="tfrecord", choices=["tfrecord", "npz"])
    ap.add_argument("--compression", default="none")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    import _objstore
    import readers
    from converter import cli
    from converter.testing import synth
    from readers.storage import open_store

    h, w = (int(v) for v in args.size.split("x"))
    port = _objstore._free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = _objstore._start([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], endpoint,
                              "moto S3")
    os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1"})
    try:
        with tempfile.TemporaryDirectory() as tmp:
            src = synth.make_camvid(os.path.join(tmp, "src"), splits={"train": args.samples}, size=[(h, w)], seed=0)
            out = os.path.join(tmp, "out")
            if cli.main(["convert", str(src.root), out, "--size", args.size, "--workers", "1", "--format",
                         args.format, "--compression", args.compression, "--shard-size", args.shard_size]) != 0:
                return 1
            url = _objstore.new_bucket("s3") + "/out"
            store = open_store(url)
            for name in sorted(os.listdir(out)):
                if os.path.isfile(os.path.join(out, name)):
                    store.put_file(name, os.path.join(out, name))
            local = readers.open(out)
            remote = readers.open(url)
            cache_dir = os.path.join(tmp, "cache")
            cached = readers.open(url, cache_dir=cache_dir)
            shard_bytes = sum(s.entry.bytes for s in local.shards("train"))
            _tf_epoch(local, args.batch)  # TensorFlow's first-use costs, kept out of the cold epoch
            cold = _timed(lambda: _tf_epoch(cached, args.batch))
            variants = {
                "tf_dataset, local": lambda: _tf_epoch(local, args.batch),
                "tf_dataset, s3 no cache": lambda: _tf_epoch(remote, args.batch),
                "tf_dataset, s3 cache (warm)": lambda: _tf_epoch(cached, args.batch),
                # one PyDataset per variant, its epochs timed (as `model.fit` uses it)
                "keras_dataset, local": lambda seq=local.keras_dataset("train", args.batch, seed=0): _keras_epoch(seq),
                "keras_dataset, s3 ranged GETs": lambda seq=remote.keras_dataset("train", args.batch, seed=0):
                    _keras_epoch(seq),
                "keras_dataset, s3 cache (warm)": lambda seq=cached.keras_dataset("train", args.batch, seed=0):
                    _keras_epoch(seq),
            }
            for fn in variants.values():  # warm-up: TensorFlow graphs, thread pools, per-process checks
                fn()
            times: dict[str, list[float]] = {k: [] for k in variants}
            for _ in range(args.repeats):
                for k, fn in variants.items():
                    times[k].append(_timed(fn))
    finally:
        _objstore._stop(server)
    n = args.samples
    print(f"\n{args.format}/{args.compression}, {n} samples of {h}x{w}, {len(local.shards('train'))} shards, "
          f"{shard_bytes / 1e6:.1f} MB; medians of {args.repeats} passes\n")
    print("| pass | s | samples/s | MB/s | vs local |")
    print("|---|---:|---:|---:|---:|")
    print(f"| tf_dataset, s3 cache (cold: first epoch, downloads) | {cold:.2f} | {n / cold:.0f} | "
          f"{shard_bytes / cold / 1e6:.0f} | |")
    for k, ts in times.items():
        med = statistics.median(ts)
        base = statistics.median(times[k.split(",")[0] + ", local"])
        print(f"| {k} | {med:.2f} | {n / med:.0f} | {shard_bytes / med / 1e6:.0f} | {base / med:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
