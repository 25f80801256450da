"""Run every measurement of `imgshard bench` and collect the numbers (`run_bench`).

Noisy, shared machines: every measurement is repeated and its median reported, and the
repeats of the reader pipelines run round-robin (repeat 1 of every pipeline, then
repeat 2, ...) so that a burst of load from elsewhere hits them all alike. The
numbers that matter are the ratios between pipelines measured in the same run.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from converter.bench import baselines
from converter.bench.measure import Timing, child_env, compile_bytecode, python_argv, run_process, timed_epochs
from converter.bench.options import BenchOptions
from converter.bench.sources import Sources, prepare_sources, run_convert

log = logging.getLogger(__name__)
Say = Callable[[str], None]


@dataclass
class Row:
    """One line of the table."""

    key: str
    label: str
    group: str  # "reader" or "convert"
    bytes_per_sample: int
    timing: Timing = field(default_factory=Timing)
    cpu: Timing = field(default_factory=Timing)  # samples per CPU-second
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def record(self, samples: int, wall: float, cpu: float) -> None:
        """One repeat: `samples` in `wall` seconds and `cpu` CPU-seconds."""
        self.timing.add(samples, wall)
        self.cpu.add(samples, cpu)

    def to_json(self) -> dict:
        lo, hi = self.timing.spread
        return {"key": self.key, "label": self.label, "group": self.group, "samples_per_s": self.timing.median,
                "mb_per_s": self.timing.median * self.bytes_per_sample / 1e6, "min": lo, "max": hi,
                "repeats": self.timing.rates, "bytes_per_sample": self.bytes_per_sample, "note": self.note,
                "samples_per_cpu_s": self.cpu.median if self.cpu.rates else None, "cpu_repeats": self.cpu.rates,
                **self.extra}


@dataclass
class BenchResult:
    options: BenchOptions
    machine: dict[str, Any]
    sources: dict[str, Any]
    rows: dict[str, Row] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    storage: dict[str, Any] = field(default_factory=dict)  # encoding -> size, PSNR, warm/cold reads
    seconds: float = 0.0

    def add(self, row: Row) -> Row:
        self.rows[row.key] = row
        return row

    def rate(self, key: str, *, cpu: bool = False) -> float:
        row = self.rows.get(key)
        if row is None:
            return float("nan")
        return (row.cpu if cpu else row.timing).median

    def to_json(self) -> dict:
        """The run's JSON without its targets (`converter.bench.report.write_json` adds them)."""
        opts = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.options.__dict__.items()}
        return {"options": opts, "machine": self.machine, "sources": self.sources, "seconds": round(self.seconds, 1),
                "rows": [r.to_json() for r in self.rows.values()], "memory": self.memory, "storage": self.storage}


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


def _numpy_epoch(make: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]]) -> Callable[[], int]:
    def run() -> int:
        n = 0
        for x, _y in make():
            n += len(x)
        return n

    return run


def reader_pipelines(opts: BenchOptions, sources: Sources, tfr: str, work: str, say: Say
                     ) -> list[tuple[Row, Callable[[], int]]]:
    """(row, run one epoch) for pipelines 1-6, built once (lazily iterated)."""
    import readers
    from readers.device import expand_batch

    h, w = opts.size
    c = len(sources.colors)
    float_bytes = 4 * h * w * (3 + c)
    compact_bytes = h * w * 4
    bs = opts.batch_size
    buf = opts.shuffle_buffer
    workers = os.cpu_count() or 1
    rows: list[tuple[Row, Callable[[], int]]] = []

    def add(key: str, label: str, nbytes: int, run: Callable[[], int], note: str = "") -> None:
        rows.append((Row(key, label, "reader", nbytes, note=note), run))

    p1 = baselines.raw_png_tf_dataset(sources.pairs, sources.colors, opts.size, bs)
    add("p1_tf_png", "1. tf.data over PNG (decode, resize, tf.equal one-hot)", float_bytes, _tf_epoch(p1))
    p2 = baselines.PyDatasetEpochs(baselines.raw_png_pydataset(sources.pairs, sources.colors, opts.size, bs,
                                                               workers=workers, seed=opts.seed))
    add("p2_pydataset_png", f"2. Keras PyDataset over PNG ({workers} workers, multiprocessing)", float_bytes,
        _numpy_epoch(p2.epoch), note="per CPU-s: parent only, not its workers")

    ds = readers.open(tfr)
    split = next(iter(ds.splits))
    saved = {}
    for variant, as_float in (("float32", True), ("uint8", False)):
        path = os.path.join(work, f"saved_{variant}")
        say(f"tf.data.Dataset.save ({variant})")
        baselines.save_tensors(ds.records(split), path, num_classes=c, float32=as_float, image_shape=ds.image_shape)
        saved[variant] = baselines.saved_tf_dataset(path, bs, shuffle_buffer=buf)
    add("p3_saved_float32", "3. tf.data.Dataset.load, float32 + one-hot", float_bytes, _tf_epoch(saved["float32"]))
    add("p3_saved_uint8", "3. tf.data.Dataset.load, uint8 image + class map", compact_bytes, _tf_epoch(saved["uint8"]))

    p4 = ds.tf_dataset(split, bs, shuffle_buffer=buf)
    add("p4_imgshard_float32", "4. imgshard TFRecord, float32 + one-hot", float_bytes, _tf_epoch(p4))
    p5 = ds.tf_dataset(split, bs, shuffle_buffer=buf, one_hot=False, normalize=False)
    add("p5_imgshard_compact", "5. imgshard TFRecord, compact (uint8 + class map)", compact_bytes, _tf_epoch(p5))
    add("p5_imgshard_compact_expand", "5. compact + expand_batch (device side; on CPU here)", float_bytes,
        _tf_epoch(p5, lambda x, y: expand_batch(x, y, c)), note="expansion runs on the CPU: no accelerator")

    rows.extend(augment_pipelines(opts, sources, work, say))
    for comp in ("deflate", "none"):
        out = os.path.join(work, f"npz_{comp}")
        say(f"converting to NPZ ({comp})")
        run_convert(sources.root, out, opts.size, workers=workers, fmt="npz", compression=comp)
        nds = readers.open(out)
        pn = nds.tf_dataset(split, bs, shuffle_buffer=buf, one_hot=False, normalize=False)
        name = "compressed" if comp == "deflate" else "stored"
        add(f"p6_imgshard_npz_{comp}", f"6. imgshard NPZ ({name}), compact", compact_bytes, _tf_epoch(pn))
        paths = [s.path for s in nds.shards(split)]
        rng = np.random.default_rng(opts.seed)
        add(f"p6_np_load_{comp}", f"6. np.load loop, 1 process ({name})", compact_bytes,
            _numpy_epoch(lambda paths=paths, rng=rng: baselines.np_load_batches(paths, bs, rng)))
    return rows


#: The augmentation rows' recipe (issue 15); the crop is the bench size, the shards 1.25x it.
AUGMENT_RECIPE = dict(hflip=0.5, scale=(0.75, 1.5), brightness=0.2, contrast=0.2, saturation=0.2, hue=0.02)


def augment_pipelines(opts: BenchOptions, sources: Sources, work: str, say: Say
                      ) -> list[tuple[Row, Callable[[], int]]]:
    """Pipeline 8: shards converted at 1.25x the training size (640x640 for 512x512), read
    plain and with `Augment(**AUGMENT_RECIPE, crop=size)`, float32 + one-hot and compact."""
    import readers
    from readers.augment import Augment

    h, w = opts.size
    big = (h * 5 // 4, w * 5 // 4)
    c = len(sources.colors)
    out = os.path.join(work, "augment_src")
    say(f"converting at {big[0]}x{big[1]} for the augmentation rows")
    run_convert(sources.root, out, big, workers=os.cpu_count() or 1)
    ds = readers.open(out)
    split = next(iter(ds.splits))
    aug = Augment(**AUGMENT_RECIPE, crop=(h, w))
    bs, buf = opts.batch_size, opts.shuffle_buffer
    recipe = "hflip, scale 0.75-1.5, crop, colour jitter"
    plain = ds.tf_dataset(split, bs, shuffle_buffer=buf)
    floats = ds.tf_dataset(split, bs, shuffle_buffer=buf, seed=opts.seed, augment=aug)
    compact = ds.tf_dataset(split, bs, shuffle_buffer=buf, seed=opts.seed, augment=aug, normalize=False,
                            one_hot=False)
    device = ds.tf_dataset(split, bs, shuffle_buffer=buf, seed=opts.seed, augment=aug, normalize=False,
                           one_hot=False, augment_on="device")
    return [
        (Row("p8_plain_big", f"8. imgshard {big[0]}x{big[1]} shards, float32 + one-hot, no augmentation",
             "reader", 4 * big[0] * big[1] * (3 + c)), _tf_epoch(plain)),
        (Row("p8_augment_float32", f"8. {big[0]}x{big[1]} shards augmented to {h}x{w}, float32 + one-hot",
             "reader", 4 * h * w * (3 + c), note=recipe), _tf_epoch(floats)),
        (Row("p8_augment_compact", f"8. {big[0]}x{big[1]} shards augmented to {h}x{w}, compact", "reader",
             4 * h * w, note=recipe), _tf_epoch(compact)),
        (Row("p8_augment_device_feed", f"8. {big[0]}x{big[1]} shards, augment_on='device': the host's part", "reader",
             4 * big[0] * big[1], note="uint8 + 19 floats/sample; the GPU augments"),
         _tf_epoch(device, lambda x, y: (x[0], y))),
    ]


def measure_readers(opts: BenchOptions, sources: Sources, tfr: str, work: str, result: BenchResult, say: Say) -> None:
    pipelines = reader_pipelines(opts, sources, tfr, work, say)
    for row, run in pipelines:
        say(f"warm-up: {row.label}")
        run()  # traces functions, fills the page cache, starts worker pools
        result.add(row)
    for r in range(opts.repeats):
        say(f"readers, repeat {r + 1}/{opts.repeats}")
        for row, run in pipelines:
            row.record(*timed_epochs(run, opts.min_seconds))
            say(f"  {row.key}: {row.timing.rates[-1]:.1f} samples/s, {row.cpu.rates[-1]:.1f} per CPU-s")


def measure_storage_section(opts: BenchOptions, sources: Sources, work: str, result: BenchResult, say: Say) -> None:
    """The storage section; pipeline 1 (its yardstick) is timed here too when "read" did not run."""
    from converter.bench.storage import measure_storage

    yardstick = None
    if "p1_tf_png" not in result.rows:
        p1 = baselines.raw_png_tf_dataset(sources.pairs, sources.colors, opts.size, opts.batch_size)
        h, w = opts.size
        row = result.add(Row("p1_tf_png", "1. tf.data over PNG (decode, resize, tf.equal one-hot)", "reader",
                             4 * h * w * (3 + len(sources.colors)), note="timed with the storage section"))
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
                for _ in range(max(1, min(2, opts.convert_repeats)))]
        out[str(n)] = {"peak_tree_rss": max(r.peak_tree_rss for r in runs),
                       "max_process_rss": max(r.max_process_rss for r in runs),
                       "seconds": min(r.seconds for r in runs), "workers": workers, "size": list(size)}
        shutil.rmtree(os.path.join(work, f"mem{n}"), ignore_errors=True)
    result.memory["converter"] = out


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


__all__ = ["BenchResult", "Row", "run_bench"]

