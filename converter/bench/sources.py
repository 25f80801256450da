"""The benchmark's inputs: source pairs (generated or the user's), converted outputs."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from converter.bench.measure import ProcessRun, child_env, python_argv, run_process
from converter.bench.options import BenchOptions


@dataclass(frozen=True)
class Sources:
    root: str
    pairs: tuple[tuple[str, str], ...]  # (image, mask) of the first split, sorted by key
    colors: tuple[tuple[int, int, int], ...]
    split: str
    generated: bool

    @property
    def source_bytes(self) -> int:
        return sum(os.path.getsize(i) + os.path.getsize(m) for i, m in self.pairs)


def prepare_sources(opts: BenchOptions, *, samples: int | None = None, source_size: tuple[int, int] | None = None,
                    workers: int | None = None) -> Sources:
    """The user's `--src`, or generated pairs cached under `opts.cache`."""
    from converter.discover.classes import load_class_table
    from converter.discover.layouts import discover
    from converter.options import SourceSpec

    root = opts.src
    generated = root is None
    if generated:
        from converter.testing import synth

        n = samples or opts.samples
        h, w = source_size or opts.source_size
        root = os.path.join(opts.cache, f"bench-{n}-{h}x{w}-{opts.num_classes}c-seed{opts.seed}")
        synth.make_bench_dataset(root, n=n, size=(h, w), num_classes=opts.num_classes, seed=opts.seed,
                                 workers=workers or min(2, os.cpu_count() or 1))
    found = discover(SourceSpec(root=root))
    if found.bad:
        raise ValueError(f"--src {root} has bad inputs (run `imgshard scan` or `imgshard convert` to see them all). "
                         f"Received: {found.bad[0]}")
    if not found.samples:
        raise ValueError(f"--src {root} holds no image/mask pairs. Expected train/ and train_labels/ folders. "
                         "Received: no pairs")
    split, pairs = first_split_pairs(found.samples)
    classes = load_class_table(os.path.join(root, "class_dict.csv"))
    colors = tuple(c.color for c in classes)  # type: ignore[misc]
    return Sources(root, pairs, colors, split, generated)  # type: ignore[misc]


def first_split_pairs(samples) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The split the bench measures ("train" if there is one, else the first found) and its
    (image, mask) pairs, sorted by key."""
    split = "train" if any(s.split == "train" for s in samples) else samples[0].split
    return split, tuple((s.image, s.mask) for s in sorted(samples, key=lambda s: s.key) if s.split == split)


def convert_argv(src: str, out: str, size: tuple[int, int], *, workers: int, fmt: str = "tfrecord",
                 compression: str | None = None, extra: tuple[str, ...] = ()) -> list[str]:
    argv = python_argv("-m", "converter.cli", "convert", src, out, "--size", f"{size[0]}x{size[1]}",
                       "--workers", str(workers), "--format", fmt, "-q", *extra)
    if compression is not None:
        argv += ["--compression", compression]
    return argv


def run_convert(src: str, out: str, size: tuple[int, int], *, workers: int, fmt: str = "tfrecord",
                compression: str | None = None, extra: tuple[str, ...] = ()) -> ProcessRun:
    """`imgshard convert` (with `extra` arguments) in a child process, into a fresh `out`; raises if it fails."""
    shutil.rmtree(out, ignore_errors=True)
    run = run_process(convert_argv(src, out, size, workers=workers, fmt=fmt, compression=compression, extra=extra),
                      env=child_env())
    if run.returncode != 0:
        raise RuntimeError(f"imgshard convert {src} -> {out} (workers={workers}, format={fmt}) failed with exit "
                           f"code {run.returncode}:\n{run.stderr[-4000:]}")
    return run
