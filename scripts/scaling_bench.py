#!/usr/bin/env python
"""How conversion time grows with workers and machines: the numbers behind docs/SCALING.md.

On N generated 1920x1080 PNG pairs (`converter.testing.synth.make_bench_dataset`, photo-like
texture, colour masks) converted to --size (default 512x512), it measures in one run:

* the decode floor: reading, hashing and decoding every source once in one process
  (the part of the work that grows with the sources and nothing else);
* `imgshard convert` with the local backend and 1 and 2 worker processes;
* `--backend dask` on a `dask scheduler` with 2 `dask worker` processes on loopback
  (cluster start-up not counted, as on a running cluster), and `--backend dask`
  without --scheduler (a LocalCluster of 2 workers, its start-up counted);
* the bytes that cross the (shared) storage per sample: sources read, shards written;
* the manifest: its bytes per sample (version 3 lists shards only; the per-sample
  fingerprints are in the index files), and the time to load and to write one scaled
  up to --manifest-samples.

With --many N[,N...] it measures instead what per-sample bookkeeping costs at many
tiny samples: build, no-op run, 1% append, `readers.open` (scripts/many_bench.py).

Every configuration runs --repeats times into a fresh folder, interleaved; the median
is reported, with speed-ups against one local worker (these machines are shared and
noisy: compare the ratios). Prints a table and writes JSON (--json).

    python scripts/scaling_bench.py --n 96 --json scaling.json
    python scripts/scaling_bench.py --many 10000,50000,200000 --json many.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CONFIGS = ("local-1", "local-2", "dask-loopback-2", "dask-localcluster-2")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=96, help="source pairs to generate (default 96)")
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "imgshard-scaling-src"),
                   help="where the generated sources live (reused when they match)")
    p.add_argument("--size", default="512x512", help="output size HxW (default 512x512)")
    p.add_argument("--shard-size", default="16MB",
                   help="--shard-size of every conversion (default 16MB: 1 MB samples give 16 per shard, so "
                        "96 samples make 6 shards, enough to keep 2 workers busy)")
    p.add_argument("--repeats", type=int, default=3, help="runs per configuration (default 3)")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {CONFIGS}")
    p.add_argument("--manifest-samples", type=int, default=200_000,
                   help="scale the manifest up to this many samples to time loading it (default 200000)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--many", metavar="N[,N...]",
                   help="instead: per-sample overhead at N tiny 8x8 pairs (build, no-op, 1%% append, open; "
                        "see scripts/many_bench.py), e.g. --many 10000,50000,200000")
    args = p.parse_args(argv)
    if args.many:
        try:
            args.many = [int(x) for x in args.many.split(",")]
        except ValueError:
            p.error(f"--many takes sample counts such as 10000,50000. Received: {args.many!r}")
        if min(args.many) < 100:
            p.error(f"--many counts must be >= 100. Received: {args.many}")
    unknown = set(args.configs.split(",")) - set(CONFIGS)
    if unknown:
        p.error(f"--configs must be a subset of {CONFIGS}. Received: {sorted(unknown)}")
    if args.n < 1 or args.repeats < 1:
        p.error(f"--n and --repeats must be >= 1. Received: --n {args.n} --repeats {args.repeats}")
    return args


def decode_floor(sources) -> tuple[float, float]:
    """(wall, CPU) seconds to read + hash + decode every image and mask once, in this process."""
    from converter.transform.decode import decode_image, decode_mask, read_source

    t0, c0 = time.perf_counter(), time.process_time()
    for s in sources.samples:
        decode_image(read_source(str(s.image_path), "i"), 1 << 40)
        mask = decode_mask(read_source(str(s.mask_path), "m"), 1 << 40)
        if mask.rows is not None:  # a colour PNG is only inflated until looked up: unfilter it too
            mask.colors()
    return time.perf_counter() - t0, time.process_time() - c0


def tree_cpu_seconds(root_pid: int | None = None) -> float | None:
    """User + system CPU seconds of a process tree (Linux /proc), reaped children included.

    Wall time on a shared 2-core machine mostly measures the neighbours; CPU seconds per
    sample measure the work (and what the Dask machinery adds to it).
    """
    root_pid = root_pid or os.getpid()
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    stats: dict[int, tuple[int, float]] = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[1] = ppid; utime, stime, cutime, cstime = fields[11:15]
        stats[pid] = (int(fields[1]), sum(int(v) for v in fields[11:15]) / tick)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root_pid]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0.0))[1]
        todo += children.get(pid, [])
    return total


def convert_once(src: str, out: str, size: str, shard_size: str, **run_kw) -> tuple[float, float | None]:
    from converter.convert import convert
    from converter.options import OutputOptions, RunOptions, SourceSpec, parse_bytes

    shutil.rmtree(out, ignore_errors=True)
    cpu0 = tree_cpu_seconds()
    t0 = time.perf_counter()
    result = convert(SourceSpec(root=src), out, OutputOptions(size=size),
                     RunOptions(shard_size_bytes=parse_bytes(shard_size), **run_kw))
    seconds = time.perf_counter() - t0
    cpu1 = tree_cpu_seconds()
    if not result.published:
        raise RuntimeError(f"conversion into {out} published nothing")
    return seconds, (cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None)


class LoopbackCluster:
    """`dask scheduler` + `dask worker` processes on 127.0.0.1 (stopped by `close`)."""

    def __init__(self, folder: str, n_workers: int) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        sched_file = os.path.join(folder, "scheduler.json")
        self.log = open(os.path.join(folder, "cluster.log"), "ab")
        self.procs = [subprocess.Popen(
            [sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
             "--scheduler-file", sched_file], env=env, stdout=self.log, stderr=subprocess.STDOUT)]
        deadline = time.monotonic() + 60
        while not os.path.exists(sched_file):
            if time.monotonic() > deadline:
                raise RuntimeError(f"dask scheduler did not start; see {folder}/cluster.log")
            time.sleep(0.1)
        time.sleep(0.2)
        with open(sched_file) as f:
            self.address = json.load(f)["address"]
        for _ in range(n_workers):
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "dask", "worker", self.address, "--host", "127.0.0.1", "--nthreads", "1",
                 "--no-dashboard"], env=env, stdout=self.log, stderr=subprocess.STDOUT))
        from distributed import Client

        with Client(self.address, timeout=60, set_as_default=False) as client:
            client.wait_for_workers(n_workers, timeout=120)

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.log.close()


def manifest_cost(out: str, target_samples: int) -> dict:
    """Bytes per sample of the manifest, and load/dump time of one scaled to `target_samples`."""
    from readers.manifest import MANIFEST_NAME, Manifest, SplitEntry

    path = os.path.join(out, MANIFEST_NAME)
    manifest = Manifest.load(out)
    n = sum(e.num_samples for e in manifest.splits.values())
    size = os.path.getsize(path)
    shards = [s for _, s in manifest.iter_shards()]
    copies = max(1, target_samples // n)
    big_shards = tuple(
        dataclasses.replace(s, file=f"train-{i * len(shards) + j:05d}.tfrecord")
        for i in range(copies) for j, s in enumerate(shards)
    )
    big = manifest.replace(splits={"train": SplitEntry(big_shards, len(big_shards))})
    t0 = time.perf_counter()
    text = big.dumps()
    dump_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    Manifest.from_json(json.loads(text))
    load_s = time.perf_counter() - t0
    return {"samples": n, "bytes": size, "bytes_per_sample": size / n,
            "scaled_samples": copies * n, "scaled_bytes": len(text.encode()),
            "scaled_dump_s": dump_s, "scaled_load_s": load_s}


def main(args: argparse.Namespace) -> dict:
    from converter.testing import synth

    configs = args.configs.split(",")
    print(f"generating/reusing {args.n} 1920x1080 pairs in {args.data} ...", file=sys.stderr)
    t0 = time.perf_counter()
    sources = synth.make_bench_dataset(args.data, n=args.n, workers=2)
    print(f"  ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    src_bytes = sum(s.image_path.stat().st_size + s.mask_path.stat().st_size for s in sources.samples)

    work = tempfile.mkdtemp(prefix="imgshard-scaling-")
    cluster = LoopbackCluster(work, 2) if "dask-loopback-2" in configs else None
    runs: dict[str, list[float]] = {c: [] for c in configs}
    cpu: dict[str, list[float]] = {c: [] for c in configs}
    floor: list[float] = []
    floor_cpu: list[float] = []
    loads: list[float] = []
    try:
        for r in range(args.repeats):
            wall, cpu_s = decode_floor(sources)
            floor.append(wall)
            floor_cpu.append(cpu_s)
            loads.append(os.getloadavg()[0])
            for c in configs:
                out = os.path.join(work, c)
                if c == "local-1":
                    s = convert_once(str(sources.root), out, args.size, args.shard_size, workers=1)
                elif c == "local-2":
                    s = convert_once(str(sources.root), out, args.size, args.shard_size, workers=2)
                elif c == "dask-loopback-2":
                    s = convert_once(str(sources.root), out, args.size, args.shard_size, backend="dask", scheduler=cluster.address)
                else:
                    s = convert_once(str(sources.root), out, args.size, args.shard_size, workers=2, backend="dask")
                s, c_s = s
                runs[c].append(s)
                if c_s is not None:
                    cpu[c].append(c_s)
                print(f"  run {r + 1}/{args.repeats} {c:22s} {s:6.2f} s wall, "
                      f"{c_s if c_s is not None else float('nan'):6.2f} CPU s", file=sys.stderr)
        first = os.path.join(work, configs[0])
        shards = sum(1 for f in os.listdir(first) if f.endswith((".tfrecord", ".npz")))
        out_bytes = sum(os.path.getsize(os.path.join(first, f)) for f in os.listdir(first)
                        if f.endswith((".tfrecord", ".npz")))
        identical = all(
            _same_shards(first, os.path.join(work, c)) for c in configs[1:]
        )
        manifest = manifest_cost(first, args.manifest_samples)
    finally:
        if cluster is not None:
            cluster.close()
        shutil.rmtree(work, ignore_errors=True)

    n = args.n
    base = statistics.median(runs[configs[0]])
    results = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "n": n, "size": args.size, "shard_size": args.shard_size, "shards": shards, "repeats": args.repeats,
        "source_bytes_per_sample": src_bytes / n, "shard_bytes_per_sample": out_bytes / n,
        "decode_floor_s": statistics.median(floor), "decode_floor_per_sample_s": statistics.median(floor) / n,
        "decode_floor_cpu_ms_per_sample": 1000 * statistics.median(floor_cpu) / n,
        "load_average_1min": loads,
        "runs": {c: {"seconds": v, "median_s": statistics.median(v), "samples_per_s": n / statistics.median(v),
                     "speedup_vs_first": base / statistics.median(v),
                     "cpu_seconds": cpu[c],
                     "cpu_ms_per_sample": 1000 * statistics.median(cpu[c]) / n if cpu[c] else None}
                 for c, v in runs.items()},
        "identical_shards": identical,
        "manifest": manifest,
    }
    _print_table(results, configs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


def _same_shards(a: str, b: str) -> bool:
    names = sorted(f for f in os.listdir(a) if f.endswith((".tfrecord", ".npz")))
    if names != sorted(f for f in os.listdir(b) if f.endswith((".tfrecord", ".npz"))):
        return False
    for name in names:
        with open(os.path.join(a, name), "rb") as fa, open(os.path.join(b, name), "rb") as fb:
            if fa.read() != fb.read():
                return False
    return True


def _print_table(res: dict, configs: list[str]) -> None:
    n = res["n"]
    print(f"\n{n} pairs 1920x1080 -> {res['size']} in {res['shards']} shards, {res['machine']['cpus']} CPUs, "
          f"median of {res['repeats']}")
    print(f"decode floor (1 process): {res['decode_floor_s']:.2f} s = {1000 * res['decode_floor_per_sample_s']:.0f} "
          f"ms/sample wall, {res['decode_floor_cpu_ms_per_sample']:.0f} CPU ms/sample; sources {res['source_bytes_per_sample'] / 1e6:.2f} MB/sample, "
          f"shards {res['shard_bytes_per_sample'] / 1e6:.2f} MB/sample")
    print(f"1-minute load average during the runs: {', '.join(f'{x:.1f}' for x in res['load_average_1min'])}")
    print(f"| {'configuration':22s} | median s | samples/s | speed-up vs {configs[0]} | CPU ms/sample |")
    print(f"|{'-' * 24}|---------:|----------:|------------------:|--------------:|")
    for c in configs:
        r = res["runs"][c]
        cpu_ms = f"{r['cpu_ms_per_sample']:13.0f}" if r["cpu_ms_per_sample"] is not None else f"{'n/a':>13s}"
        print(f"| {c:22s} | {r['median_s']:8.2f} | {r['samples_per_s']:9.1f} | {r['speedup_vs_first']:17.2f} "
              f"| {cpu_ms} |")
    m = res["manifest"]
    print(f"identical shards across configurations: {res['identical_shards']}")
    print(f"manifest: {m['bytes_per_sample']:.0f} bytes/sample; scaled to {m['scaled_samples']} samples: "
          f"{m['scaled_bytes'] / 1e6:.0f} MB, dump {m['scaled_dump_s']:.2f} s, load {m['scaled_load_s']:.2f} s")


if __name__ == "__main__":
    _args = parse_args()
    if _args.many:
        sys.path.insert(0, str(ROOT / "scripts"))
        from many_bench import main_many

        main_many(_args.many, _args.repeats, _args.json)
    else:
        main(_args)
