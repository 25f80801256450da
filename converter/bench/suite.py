"""Run every measurement of `imgshard bench` and collect the numbers (`run_bench`).

Noisy, shared machines: every measurement is repeated and its median reported, and the
rounds of the reader pipelines run round-robin (round 1 of every pipeline, then round
2, ...; `converter.bench.rounds`) so that a burst of load from elsewhere hits them all
alike; the first round of each is a warm-up, timed and dropped. The conversions run
round-robin too (1 worker, 2 workers, ... in every repeat). A memory-bandwidth probe in a
fresh process before and after the reader rounds gives each reader row its limit
(`converter.bench.bandwidth`). The numbers that matter are the ratios between pipelines
measured in the same run.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import statistics
import tempfile
import time
from typing import Any, Callable

import numpy as np

from converter.bench import baselines
from converter.bench.memory import converter_growth_bound_bytes
from converter.bench.measure import child_env, compile_bytecode, python_argv, run_process
from converter.bench.options import BenchOptions
from converter.bench.result import BenchResult, Row
from converter.bench.sources import Sources, prepare_sources, run_convert

log = logging.getLogger(__name__)
Say = Callable[[str], None]


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    import PIL
    import tensorflow as tf

    from converter.transform import png, resize
    from readers.augment_host import fast_augment_available

    return {"cpu": cpu, "cores": os.cpu_count(), "memory_bytes": mem, "python": platform.python_version(),
            "platform": platform.platform(), "tensorflow": tf.__version__, "numpy": np.__version__,
            "pillow": PIL.__version__, "png_decoder": "fast path (ISA-L + C unfilter)" if png.available() else "Pillow",
            "image_resize": resize.resizer(),
            "augment": "C (readers._warp)" if fast_augment_available() else "TensorFlow ops (readers._warp not built)",
            "loadavg_start": [round(x, 2) for x in load]}


# -- conversion ---------------------------------------------------------------------------------------

def measure_conversion(opts: BenchOptions, sources: Sources, work: str, result: BenchResult, say: Say) -> str:
    """Rows for pipeline 7; returns the folder of a TFRecord output (for the readers).

    Every row records wall time and CPU time (user + system, of the process and the
    children it reaped). On a shared machine the CPU time is the steady measure of
    work per sample; the wall time is what the parallel speed-up is read from.
    """
    n = len(sources.pairs)
    per_sample = sources.source_bytes // n
    floor = result.add(Row("decode_floor", "decode only (project decoder, 1 process)", "convert", per_sample))
    bare = result.add(Row("bare_transform", "bare decode+resize+lookup (1 process)", "convert", per_sample))
    naive_pairs = sources.pairs[:min(n, opts.naive_samples)]
    naive = result.add(Row("naive_pillow", "naive Pillow loop + tf.io.TFRecordWriter (1 process)", "convert",
                           per_sample, note=f"first {len(naive_pairs)} pairs"))
    conv = {w: result.add(Row(f"convert_w{w}", f"imgshard convert --workers {w}", "convert", per_sample,
                              note="child process, start-up included")) for w in opts.worker_counts}
    probe = result.add(Row("cpu_scaling", "CPU available: 2 processes vs 1 (pure-Python loop)", "probe", 0,
                           note="x of one process; 2.0 = two free cores"))
    out = os.path.join(work, "tfrecord")
    h, w_ = opts.size
    for r in range(opts.convert_repeats):
        say(f"conversion, repeat {r + 1}/{opts.convert_repeats}")
        probe.timing.rates.append(cpu_scaling_probe())
        bare_json = _child_json(python_argv("-m", "converter.bench.bare", sources.root, "--size", f"{h}x{w_}"),
                                "the bare-work measurement failed")
        for row, part in ((floor, "decode"), (bare, "bare")):
            row.record(n, bare_json[part]["wall"], bare_json[part]["cpu"])
        c0, t0 = time.process_time(), time.perf_counter()
        written = baselines.naive_convert(naive_pairs, sources.colors, opts.size, os.path.join(work, "naive.tfrecord"))
        naive.record(written, time.perf_counter() - t0, time.process_time() - c0)
        for w, row in conv.items():
            run = run_convert(sources.root, out, opts.size, workers=w)
            row.record(n, run.seconds, run.cpu_seconds)
            row.extra.setdefault("peak_tree_rss", []).append(run.peak_tree_rss)
            row.extra.setdefault("max_process_rss", []).append(run.max_process_rss)
        say("  " + ", ".join(f"{row.key} {row.timing.rates[-1]:.1f}/s ({row.cpu.rates[-1]:.1f}/CPU-s)"
                              for row in (floor, bare, naive, *conv.values())) + f"; CPU scaling {probe.timing.rates[-1]:.2f}x")
    return out


def _burn(n: int) -> int:
    s = 0
    for i in range(n):
        s += i * i
    return s


def cpu_scaling_probe(n: int = 3_000_000) -> float:
    """How much faster two processes finish twice the work of one, right now (2.0 on two
    free cores; lower when other load shares the machine)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        pool.map(_burn, [1000, 1000])  # start-up out of the timing
        t0 = time.perf_counter()
        pool.apply(_burn, (n,))
        one = time.perf_counter() - t0
        t0 = time.perf_counter()
        pool.map(_burn, [n, n], chunksize=1)
        two = time.perf_counter() - t0
    return 2 * one / two if two > 0 else float("nan")


# -- readers --------------------------------------------------------------------------------------------

def _tf_epoch(ds: Any, transform: Callable | None = None) -> Callable[[], int]:
    def run() -> int:
        n = 0
        for x, y in ds:
            if transform is not None:
                x, y = transform(x, y)
            n += int(x.shape[0])
        return n

    return run


def measure_bandwidth(opts: BenchOptions, say: Say) -> dict[str, Any]:
    """One copy-bandwidth probe in a fresh process (`converter.bench.bandwidth`)."""
    say(f"memory bandwidth: numpy copyto of {opts.bandwidth_bytes >> 20} MiB, fresh process")
    return _child_json(python_argv("-m", "converter.bench.bandwidth", "--bytes", str(opts.bandwidth_bytes)),
                       "the memory-bandwidth probe failed")


def combine_bandwidth(probes: list[dict[str, Any]]) -> dict[str, Any]:
    """The probes of one run and the figure the limits use: the median of all their trials."""
    trials = [t for p in probes for t in p["trials_gb_per_s"]]
    return {"probes": probes, "median_gb_per_s": float(np.median(trials)), "min_gb_per_s": min(trials),
            "max_gb_per_s": max(trials), "method": "numpy.copyto of large arrays in a fresh process (GB copied/s)",
            "limit_formula": "limit (samples/s) = 2 x bandwidth / (bytes read + written per sample)"}


def measure_readers(opts: BenchOptions, sources: Sources, tfr: str, work: str, result: BenchResult, say: Say) -> None:
    """Every reader row in `opts.repeats + 1` interleaved rounds (the first dropped), between
    two bandwidth probes (before and after: the limits use the median of both)."""
    from converter.bench.pipelines import reader_pipelines
    from converter.bench.rounds import run_rounds

    pipelines = reader_pipelines(opts, sources, tfr, work, say)
    for row, _ in pipelines:
        result.add(row)
    if hasattr(os, "sync"):
        os.sync()  # the conversions' gigabytes written back now, not by the kernel during the rounds
    probes = [measure_bandwidth(opts, say)]
    run_rounds(pipelines, opts.repeats + 1, opts.min_seconds, say)
    pipelines.clear()  # every iterator and dataset released before the second probe
    probes.append(measure_bandwidth(opts, say))
    result.bandwidth = combine_bandwidth(probes)


def measure_storage_section(opts: BenchOptions, sources: Sources, work: str, result: BenchResult, say: Say) -> None:
    """The storage section; pipeline 1 (its yardstick) is timed here too when "read" did not run."""
    from converter.bench.storage import measure_storage

    yardstick = None
    if "p1_tf_png" not in result.rows:
        p1 = baselines.raw_png_tf_dataset(sources.pairs, sources.colors, opts.size, opts.batch_size)
        h, w = opts.size
        row = result.add(Row("p1_tf_png", "1. tf.data over PNG (decode, resize, tf.equal one-hot)", "reader",
                             4 * h * w * (3 + len(sources.colors)), note="timed with the storage section",
                             bytes_read=round(sources.source_bytes / len(sources.pairs))))
        yardstick = (row, _tf_epoch(p1))
    result.storage = measure_storage(opts, sources, work, say, yardstick)


# -- memory ---------------------------------------------------------------------------------------------

def measure_reader_memory(opts: BenchOptions, outs: dict[str, str], result: BenchResult, say: Say) -> None:
    for fmt, out in outs.items():
        for mode in ("compact", "float32"):
            say(f"reader memory: {fmt} {mode}")
            result.memory[f"reader_{fmt}_{mode}"] = _child_json(
                python_argv("-m", "converter.bench.memory", out, "--batch-size", str(opts.batch_size),
                            "--shuffle-buffer", str(opts.shuffle_buffer), "--mode", mode),
                f"reader memory measurement failed ({fmt}, {mode})")


def measure_converter_memory(opts: BenchOptions, work: str, result: BenchResult, say: Say) -> None:
    workers = max(opts.worker_counts)
    out = {}
    for n in opts.memory_samples:
        say(f"converter memory: {n} samples of {opts.memory_source_size[1]}x{opts.memory_source_size[0]}")
        src = prepare_sources(opts, samples=n, source_size=opts.memory_source_size)
        size = opts.size  # real-size output samples; only the sources are small (quick to decode)
        runs = [run_convert(src.root, os.path.join(work, f"mem{n}"), size, workers=workers)
                for _ in range(max(1, min(3, opts.convert_repeats)))]
        trees = [r.peak_tree_rss for r in runs]
        out[str(n)] = {"peak_tree_rss": max(trees), "peak_tree_rss_median": statistics.median(trees),
                       "peak_tree_rss_min": min(trees), "max_process_rss": max(r.max_process_rss for r in runs),
                       "seconds": min(r.seconds for r in runs), "workers": workers, "size": list(size)}
        shutil.rmtree(os.path.join(work, f"mem{n}"), ignore_errors=True)
    small, large = sorted(opts.memory_samples)
    result.memory["converter"] = out
    result.memory["converter_growth_bound"] = converter_growth_bound_bytes(small, large, workers=workers,
                                                                           size=opts.size)


def _child_json(argv: list[str], failed: str) -> dict:
    """The JSON line a measuring child process prints last; raises with `failed` and its stderr if it fails."""
    run = run_process(argv, env=child_env(), sample_memory=False)
    if run.returncode != 0:
        raise RuntimeError(f"{failed}:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


# -- the whole run ----------------------------------------------------------------------------------------

def run_bench(opts: BenchOptions, say: Say | None = None) -> BenchResult:
    """Measure everything `opts` asks for; see the `converter.bench` docstring."""
    say = say or (lambda m: log.info("%s", m))
    t0 = time.perf_counter()
    say("preparing sources" + ("" if opts.src else f" ({opts.samples} generated pairs, cached in {opts.cache})"))
    sources = prepare_sources(opts, workers=1 if opts.quick else None)
    result = BenchResult(opts, machine_info(), {
        "root": sources.root, "generated": sources.generated, "pairs": len(sources.pairs),
        "classes": len(sources.colors), "bytes": sources.source_bytes})
    result.machine["bytecode_compiled"] = compile_bytecode()
    work = opts.work_dir or tempfile.mkdtemp(prefix="imgshard-bench-")
    os.makedirs(work, exist_ok=True)
    try:
        if "convert" in opts.sections:
            tfr = measure_conversion(opts, sources, work, result, say)
        else:
            tfr = os.path.join(work, "tfrecord")
            if "read" in opts.sections or "memory" in opts.sections:
                run_convert(sources.root, tfr, opts.size, workers=max(opts.worker_counts))
        if "read" in opts.sections:
            measure_readers(opts, sources, tfr, work, result, say)
        if "storage" in opts.sections:
            measure_storage_section(opts, sources, work, result, say)
        if "memory" in opts.sections:
            npz = os.path.join(work, "npz_deflate")
            if not os.path.isdir(npz):
                run_convert(sources.root, npz, opts.size, workers=max(opts.worker_counts), fmt="npz")
            measure_reader_memory(opts, {"tfrecord": tfr, "npz": npz}, result, say)
            if opts.memory:
                measure_converter_memory(opts, work, result, say)
    finally:
        if opts.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    result.seconds = time.perf_counter() - t0
    return result


__all__ = ["BenchResult", "Row", "combine_bandwidth", "measure_bandwidth", "run_bench"]

