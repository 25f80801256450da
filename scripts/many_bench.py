"""`scripts/scaling_bench.py --many N[,N...]`: what per-sample overhead costs at millions of samples.

Tiny generated pairs (8x8 RGB PNG + colour mask, 64 textured variants hard-linked N
times into one CamVid tree, so generating 200,000 pairs takes seconds) make the
per-sample bookkeeping dominate: discovery, planning, index files, the manifest. For
each N it measures, each in a fresh process:

* build: `imgshard convert SRC OUT --size 8x8 --workers 2` on an empty OUT;
* no-op: the same command again (nothing new): wall time of the whole process, the
  run's own time (its report's ``seconds``), the process's CPU time less the CLI's
  start-up CPU (`imgshard --version`), and the peak RSS (`os.wait4`);
* 1% append: N/100 new pairs linked in, the same command;
* open: `readers.open(OUT)` in a process that has imported `readers`: time (the first
  call includes importing the reading engine, `readers.dataset`; then a second call),
  and peak RSS above the RSS before the first call;
* sizes: ``imgshard.json`` and the index files.

Prints a table and the extrapolation to 10 million samples (the line through the two
largest N measured), and writes JSON with --json. The machine is shared: repeat a
measurement (--repeats) and read the medians.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = 64
CLASS_DICT = "name,r,g,b\nSky,128,128,128\nRoad,128,64,128\nCar,64,0,128\n"
COLORS = [(128, 128, 128), (128, 64, 128), (64, 0, 128)]


def make_variants(folder: Path) -> list[tuple[Path, Path]]:
    """64 distinct textured 8x8 image/mask PNG pairs."""
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    pairs = []
    for i in range(VARIANTS):
        image, mask = folder / f"v{i:02d}.png", folder / f"v{i:02d}_L.png"
        if not image.exists():
            yy, xx = np.mgrid[0:8, 0:8]
            rgb = (np.stack([xx * 30 + i, yy * 25 + 2 * i, (xx + yy) * 15], -1) + rng.integers(0, 40, (8, 8, 3)))
            Image.fromarray(rgb.clip(0, 255).astype(np.uint8)).save(image)
            classes = (xx + yy + i) % len(COLORS)
            Image.fromarray(np.array(COLORS, np.uint8)[classes]).save(mask)
        pairs.append((image, mask))
    return pairs


def grow_tree(src: Path, variants: list[tuple[Path, Path]], start: int, stop: int) -> None:
    """Samples start..stop-1 of the tree (hard links: names differ, content repeats every 64)."""
    (src / "train").mkdir(parents=True, exist_ok=True)
    (src / "train_labels").mkdir(parents=True, exist_ok=True)
    if not (src / "class_dict.csv").exists():
        (src / "class_dict.csv").write_text(CLASS_DICT)
    for i in range(start, stop):
        image, mask = variants[i % VARIANTS]
        name = f"s{i:08d}"
        os.link(image, src / "train" / f"{name}.png")
        os.link(mask, src / "train_labels" / f"{name}_L.png")


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


#: CPU seconds (user + system) of the last `run_measured` process and its reaped children.
LAST_CPU_S = [0.0]


def run_measured(cmd: list[str]) -> tuple[float, int, str]:
    """(wall seconds, peak RSS bytes of the process and its reaped children, stdout)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (peak RSS)
        wall = time.perf_counter() - t0
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        LAST_CPU_S[0] = usage.ru_utime + usage.ru_stime
        out.seek(0)
        err.seek(0)
        if code != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({code}): {err.read().decode()[-2000:]}")
        return wall, usage.ru_maxrss * 1024, out.read().decode()


def convert_cmd(src: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "converter.cli", "convert", str(src), str(out), "--size", "8x8", "--workers", "2",
            "-q"]


def startup_cpu() -> float:
    """CPU seconds of `imgshard --version` (interpreter and CLI start-up)."""
    run_measured([sys.executable, "-m", "converter.cli", "--version"])
    return LAST_CPU_S[0]


def last_report_seconds(out: Path) -> float:
    reports = sorted((out / "reports").iterdir(), key=lambda p: p.stat().st_mtime_ns)
    return float(json.loads(reports[-1].read_text())["seconds"])


OPEN_PROBE = """
import json, resource, sys, time
import readers
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
base = rss()
t0 = time.perf_counter()
ds = readers.open(sys.argv[1])
t = time.perf_counter() - t0
t0 = time.perf_counter()
readers.open(sys.argv[1])
again = time.perf_counter() - t0
n = sum(ds.splits.values())
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": t, "again_seconds": again, "base_rss": base, "peak_rss": peak, "above_bytes": max(rss(), peak) - base,
                  "samples": n}))
"""


def measure_n(n: int, work: Path, variants: list[tuple[Path, Path]], repeats: int) -> dict:
    src, out = work / f"src-{n}", work / f"out-{n}"
    shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    grow_tree(src, variants, 0, n)
    row: dict = {"n": n}
    row["build_s"], row["build_rss"], _ = run_measured(convert_cmd(src, out))
    noop = [run_measured(convert_cmd(src, out)) + (last_report_seconds(out), LAST_CPU_S[0]) for _ in range(repeats)]
    row["noop_wall_s"] = statistics.median(x[0] for x in noop)
    row["noop_run_s"] = statistics.median(x[3] for x in noop)
    row["noop_rss"] = max(x[1] for x in noop)
    row["noop_cpu_s"] = statistics.median(x[4] for x in noop)  # the whole process, start-up included
    row["startup_cpu_s"] = startup_cpu()
    step = max(1, n // 100)
    appends = []
    for r in range(repeats):
        grow_tree(src, variants, n + r * step, n + (r + 1) * step)
        appends.append(run_measured(convert_cmd(src, out)) + (last_report_seconds(out),))
    row["append_n"] = step
    row["append_wall_s"] = statistics.median(x[0] for x in appends)
    row["append_run_s"] = statistics.median(x[3] for x in appends)
    row["append_rss"] = max(x[1] for x in appends)
    opens = [json.loads(run_measured([sys.executable, "-c", OPEN_PROBE, str(out)])[2]) for _ in range(repeats)]
    row["open_s"] = statistics.median(o["seconds"] for o in opens)
    row["open_again_s"] = statistics.median(o["again_seconds"] for o in opens)
    row["open_above_bytes"] = max(o["above_bytes"] for o in opens)
    row["manifest_bytes"] = (out / "imgshard.json").stat().st_size
    row["index_bytes"] = sum(p.stat().st_size for p in out.iterdir() if p.name.endswith(".idx.npy"))
    row["shards"] = sum(1 for p in out.iterdir() if p.suffix == ".tfrecord")
    row["samples"] = n + repeats * step
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(src, ignore_errors=True)
    return row


def extrapolate(rows: list[dict], target: int = 10_000_000) -> dict:
    """Each figure at `target` samples: the line through the two largest N measured (the fixed
    costs, interpreter included, stay fixed; with one N, proportional to N)."""
    keys = ("noop_run_s", "noop_rss", "append_run_s", "open_again_s", "manifest_bytes", "index_bytes")
    b = rows[-1]
    a = rows[-2] if len(rows) > 1 else {"n": 0, **{k: 0.0 for k in keys}}
    out = {"n": target, "from": [a["n"], b["n"]]}
    for k in keys:
        slope = (b[k] - a[k]) / (b["n"] - a["n"])
        out[k] = b[k] + slope * (target - b["n"])
    out["open_s"] = out.pop("open_again_s")
    return out


def print_table(rows: list[dict], far: dict) -> None:
    mb = 1e6
    print("| N | build s | no-op s (run / process) | µs per sample (run; CPU) | no-op peak RSS MB | 1% append s (run) "
          "| append / no-op | open s (first / again) | open MB | imgshard.json KB | index MB | shards |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['n']:,} | {r['build_s']:.1f} | {r['noop_run_s']:.2f} / {r['noop_wall_s']:.2f} "
              f"| {1e6 * r['noop_run_s'] / r['n']:.1f}; {1e6 * (r['noop_cpu_s'] - r['startup_cpu_s']) / r['n']:.1f} "
              f"| {r['noop_rss'] / mb:.0f} | {r['append_run_s']:.2f} "
              f"| {r['append_run_s'] / r['noop_run_s']:.2f} | {r['open_s']:.3f} / {r['open_again_s']:.4f} | {r['open_above_bytes'] / mb:.1f} "
              f"| {r['manifest_bytes'] / 1e3:.1f} | {r['index_bytes'] / mb:.1f} | {r['shards']} |")
    print(f"| 10,000,000 (line through N={far['from'][0]:,} and {far['from'][1]:,}) | | {far['noop_run_s']:.0f} | "
          f"{1e6 * far['noop_run_s'] / far['n']:.1f} | {far['noop_rss'] / mb:.0f} | {far['append_run_s']:.0f} | | "
          f"{far['open_s']:.2f} | | {far['manifest_bytes'] / 1e3:.0f} | {far['index_bytes'] / mb:.0f} | |")


def main_many(sizes: list[int], repeats: int = 3, json_path: str | None = None, data: str | None = None) -> dict:
    work = Path(data or tempfile.mkdtemp(prefix="imgshard-many-"))
    work.mkdir(parents=True, exist_ok=True)
    variants = make_variants(work / "variants")
    rows = []
    for n in sizes:
        t0 = time.perf_counter()
        rows.append(measure_n(n, work, variants, repeats))
        print(f"  N={n:,} measured in {time.perf_counter() - t0:.0f} s (load {os.getloadavg()[0]:.1f})",
              file=sys.stderr)
    far = extrapolate(rows)
    print_table(rows, far)
    result = {"rows": rows, "extrapolated": far, "cpus": os.cpu_count(), "load_average": os.getloadavg()}
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=1))
    return result
