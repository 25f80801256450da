"""The storage section of `imgshard bench`: which image encoding fits your storage.

The same sources are converted once per encoding (raw, PNG, JPEG q90 and q95, WebP
q90; masks raw next to raw images, PNG otherwise) and each output is measured for:

* bytes per sample on disk, and the ratio to raw;
* PSNR of the images against the raw conversion (mean of per-image PSNR, and the
  worst image), and whether every mask is identical to raw (it must be);
* read samples/s of the float32 + one-hot `tf_dataset` (the training default),
  warm (shards in the page cache) and cold: before every cold epoch each shard file is
  dropped from the page cache with ``posix_fadvise(POSIX_FADV_DONTNEED)``, so the epoch
  reads from the device (on a VM, from whatever the virtual disk is backed by).

Warm and cold repeats of every encoding run round-robin, like the reader pipelines.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable

import numpy as np

from converter.bench.measure import timed_epochs
from converter.bench.options import BenchOptions
from converter.bench.sources import Sources, run_convert

#: (key, --image-encoding, --quality)
VARIANTS = (("raw", "raw", None), ("png", "png", None), ("jpeg90", "jpeg", 90), ("jpeg95", "jpeg", 95),
            ("webp90", "webp", 90))


def drop_from_page_cache(paths: list[str]) -> None:
    """Ask the kernel to forget the cached pages of `paths` (clean pages only: shards are fsynced)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def image_quality(raw_ds: Any, ds: Any, split: str) -> dict[str, Any]:
    """Mean and worst per-image PSNR of `ds` against `raw_ds` (same keys), and whether every mask is identical."""
    raw = {r.key: r for r in raw_ds.records(split)}
    psnrs: list[float] = []
    masks_identical = True
    for rec in ds.records(split):
        ref = raw[rec.key]
        mse = float(np.mean((rec.image.astype(np.float64) - ref.image.astype(np.float64)) ** 2))
        psnrs.append(math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse))
        if rec.mask is not None and not np.array_equal(rec.mask, ref.mask):
            masks_identical = False
    finite = [p for p in psnrs if math.isfinite(p)]
    lossless = len(finite) == 0
    return {"psnr_db": None if lossless else round(float(np.mean(finite)), 2),
            "psnr_min_db": None if lossless else round(min(finite), 2),
            "bit_exact": lossless, "masks_identical": masks_identical}


def _epoch(ds: Any, split: str, opts: BenchOptions, cold: bool) -> Callable[[], int]:
    pipeline = ds.tf_dataset(split, opts.batch_size, shuffle_buffer=opts.shuffle_buffer)
    paths = [s.path for s in ds.shards(split)]

    def run() -> int:
        if cold:
            drop_from_page_cache(paths)
        return sum(int(x.shape[0]) for x, _ in pipeline)

    return run


def measure_storage(opts: BenchOptions, sources: Sources, work: str, say: Callable[[str], None],
                    yardstick: "tuple[Any, Callable[[], int]] | None" = None) -> dict[str, Any]:
    """Convert with every encoding of `VARIANTS` and measure size, quality and read speed.

    `yardstick`: (row, one epoch) of a pipeline timed in the same round-robin (pipeline 1
    when the read section did not run), so that the ratios to it see the same load.
    """
    import readers

    workers = max(opts.worker_counts)
    outs: dict[str, Any] = {}
    rows: dict[str, dict[str, Any]] = {}
    for key, encoding, quality in VARIANTS:
        out = os.path.join(work, f"storage_{key}")
        say(f"storage: converting with --image-encoding {encoding}" + (f" --quality {quality}" if quality else ""))
        extra = ("--image-encoding", encoding) + (("--quality", str(quality)) if quality else ())
        run_convert(sources.root, out, opts.size, workers=workers, extra=extra)
        ds = outs[key] = readers.open(out)
        split = sources.split if sources.split in ds.splits else next(iter(ds.splits))
        shards = ds.shards(split)
        nbytes = sum(s.entry.bytes for s in shards)
        samples = sum(s.records for s in shards)
        rows[key] = {"encoding": encoding, "quality": quality, "bytes_per_sample": nbytes / samples,
                     "split": split, "warm": [], "cold": [], "warm_cpu": [], "cold_cpu": []}
    raw_bytes = rows["raw"]["bytes_per_sample"]
    for key, row in rows.items():
        row["ratio_to_raw"] = row["bytes_per_sample"] / raw_bytes
        row.update(image_quality(outs["raw"], outs[key], row["split"]))
    runs = {(key, cold): _epoch(outs[key], rows[key]["split"], opts, cold) for key in rows for cold in (False, True)}
    for run in runs.values():
        run()  # warm-up: traces the functions, starts the thread pools
    if yardstick is not None:
        yardstick[1]()
    for r in range(opts.repeats):
        say(f"storage: read repeat {r + 1}/{opts.repeats}")
        if yardstick is not None:
            yardstick[0].record(*timed_epochs(yardstick[1], opts.min_seconds))
        for (key, cold), run in runs.items():
            samples, wall, cpu = timed_epochs(run, opts.min_seconds)
            name = "cold" if cold else "warm"
            rows[key][name].append(samples / wall)
            rows[key][f"{name}_cpu"].append(samples / cpu if cpu > 0 else float("nan"))
        say("  " + ", ".join(f"{k} {v['warm'][-1]:.0f}/{v['cold'][-1]:.0f}" for k, v in rows.items()))
    for row in rows.values():
        for name in ("warm", "cold", "warm_cpu", "cold_cpu"):
            row[f"{name}_median"] = float(np.median(row[name])) if row[name] else float("nan")
    return rows


def storage_table(rows: dict[str, dict[str, Any]], p1_rate: float, p1_cpu_rate: float) -> str:
    """The storage section of the printed report (x p1: warm samples/s, and per CPU-second)."""
    lines = ["-- storage: same sources per image encoding (float32 + one-hot tf_dataset; cold = shards dropped "
             "from the page cache before each epoch)",
             f"{'encoding':<10} {'KB/sample':>10} {'x raw':>7} {'PSNR dB':>8} {'worst':>6} {'masks':>9} "
             f"{'warm /s':>8} {'cold /s':>8} {'x p1':>6} {'/CPU-s':>7} {'x p1':>6}"]
    for key, row in rows.items():
        psnr = "exact" if row["bit_exact"] else f"{row['psnr_db']:.1f}"
        worst = "" if row["bit_exact"] else f"{row['psnr_min_db']:.1f}"
        masks = "identical" if row["masks_identical"] else "DIFFER"
        vs_p1 = _ratio(row["warm_median"], p1_rate)
        vs_p1_cpu = _ratio(row["warm_cpu_median"], p1_cpu_rate)
        lines.append(f"{key:<10} {row['bytes_per_sample'] / 1e3:>10.1f} {row['ratio_to_raw']:>7.3f} {psnr:>8} "
                     f"{worst:>6} {masks:>9} {row['warm_median']:>8.0f} {row['cold_median']:>8.0f} {vs_p1:>6.1f} "
                     f"{row['warm_cpu_median']:>7.0f} {vs_p1_cpu:>6.1f}")
    return "\n".join(lines)


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else float("nan")


__all__ = ["VARIANTS", "drop_from_page_cache", "image_quality", "measure_storage", "storage_table"]
