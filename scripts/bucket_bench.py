#!/usr/bin/env python
"""Conversion into a bucket against conversion into a local folder: the numbers behind the
object-storage section of docs/SCALING.md.

Starts a moto S3 server on 127.0.0.1 (``pip install -e '.[test]'``), generates N real-size
1920x1080 PNG pairs (`converter.testing.synth.make_bench_dataset`) and runs ``imgshard convert``
(the CLI, 2 workers) into a fresh local folder and into a fresh ``s3://`` prefix, interleaved,
--repeats times each. Reports the medians of the wall time and samples/s, the ratio, and for the
bucket runs the time the upload threads were busy (from the run report): if uploads did not
overlap the conversion, a bucket run would take about the local time plus that busy time.

    python scripts/bucket_bench.py --n 48 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _moto() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    for _ in range(600):
        try:
            urllib.request.urlopen(url, timeout=2)
            break
        except urllib.error.HTTPError:
            break
        except OSError:
            time.sleep(0.1)
    os.environ.update({"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"})
    return proc, url


def _convert(src: Path, out: str, args: argparse.Namespace) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "converter.cli", "convert", str(src), out, "--size", args.size,
                    "--workers", str(args.workers), "-q"], check=True, env=env, cwd=ROOT)
    return time.perf_counter() - t0


def _report(url: str) -> dict:
    from readers.storage import open_store

    store = open_store(url)
    name = [i.name for i in store.list("reports")][-1]
    return json.loads(store.read(name))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=48)
    p.add_argument("--size", default="512x512")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "imgshard-bench-src"))
    args = p.parse_args()
    from converter.testing import synth

    import fsspec

    src = synth.make_bench_dataset(Path(args.cache) / f"n{args.n}", n=args.n).root
    proc, _ = _moto()
    work = Path(tempfile.mkdtemp(prefix="imgshard-bucket-bench-"))
    try:
        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        fs.mkdir("bench")
        local, bucket, busy, shards, local_shards = [], [], [], [], []
        for i in range(args.repeats):
            local.append(_convert(src, str(work / f"local-{i}"), args))
            report = next((work / f"local-{i}" / "reports").glob("convert-*.json"))
            local_shards.append(json.loads(report.read_text())["timings"]["write_shards"])
            url = f"s3://bench/run-{i}"
            bucket.append(_convert(src, url, args))
            rep = _report(url)
            busy.append(rep["uploads"]["upload_busy_seconds"])
            shards.append(rep["timings"]["write_shards"])
        lm, bm = statistics.median(local), statistics.median(bucket)
        print(f"{args.n} pairs 1920x1080 -> {args.size}, {args.workers} workers, {args.repeats} interleaved runs")
        print(f"local folder : {lm:6.2f} s  {args.n / lm:6.1f} samples/s   runs {[round(t, 2) for t in local]}")
        print(f"s3 (moto)    : {bm:6.2f} s  {args.n / bm:6.1f} samples/s   runs {[round(t, 2) for t in bucket]}")
        print(f"ratio s3/local wall time: {bm / lm:.2f}")
        print(f"shard stage (conversion; in a bucket run also every upload but the last shard's): local "
              f"{statistics.median(local_shards):.2f} s, s3 {statistics.median(shards):.2f} s")
        print(f"bucket runs: upload threads busy {statistics.median(busy):.2f} s; uploads after the conversion would "
              f"take about {lm + statistics.median(busy):.2f} s")
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
