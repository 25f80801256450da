"""Options of one benchmark run, checked once (`BenchOptions`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

#: Where generated benchmark sources are cached between runs (override: IMGSHARD_CACHE).
DEFAULT_CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "imgshard")


#: The parts of a run, in the order they run.
SECTIONS = ("convert", "read", "memory", "storage")


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer. Received: {name}={value!r}")


@dataclass(frozen=True)
class BenchOptions:
    """What `converter.bench.run_bench` measures and on which data.

    Attributes:
        src: a CamVid-layout source folder (train/, train_labels/, class_dict.csv);
            None generates `samples` synthetic pairs of `source_size` (cached in `cache`).
        samples: synthetic pairs to generate (ignored with `src`).
        source_size: (height, width) of generated sources.
        num_classes: classes of generated sources.
        size: (height, width) every pipeline resizes to.
        batch_size: records per batch, in every pipeline.
        shuffle_buffer: records held by the shuffle buffer of every pipeline that shuffles
            records (the raw-PNG pipelines shuffle file names, a buffer of all of them).
        repeats: timed rounds kept per reader pipeline (the median is reported); one
            warm-up round runs first and is dropped (`converter.bench.rounds`).
        convert_repeats: interleaved runs per conversion measurement (median reported).
        min_seconds: a reader round takes batches until at least this long.
        bandwidth_bytes: array size of the memory-bandwidth probe (`converter.bench.bandwidth`).
        workers: worker counts to time `imgshard convert` with (default 1..cores).
        naive_samples: samples the naive single-process Pillow loop converts (it is slow).
        memory: also measure converter peak RSS at `memory_samples` (small images).
        memory_samples: the two sample counts of the memory measurement.
        memory_source_size: (height, width) of the sources of the memory measurement.
        work_dir: where converted outputs go (None: a temporary folder, removed).
        cache: folder of cached generated sources.
        seed: seed of every shuffle.
        quick: the smoke-test preset (few tiny samples, one repeat); see `quick_options`.
        sections: what to measure: "convert" (pipeline 7), "read" (pipelines 1-6, which
            need a conversion: one untimed run when "convert" is left out), "memory" (8),
            "storage" (one conversion per image encoding: size, PSNR, warm and cold reads;
            `converter.bench.storage`).
    """

    src: str | None = None
    samples: int = 150
    source_size: tuple[int, int] = (1080, 1920)
    num_classes: int = 5
    size: tuple[int, int] = (512, 512)
    batch_size: int = 8
    shuffle_buffer: int = 64
    repeats: int = 4
    convert_repeats: int = 3
    min_seconds: float = 2.0
    bandwidth_bytes: int = 512 << 20
    workers: tuple[int, ...] = field(default_factory=tuple)
    naive_samples: int = 48
    memory: bool = True
    memory_samples: tuple[int, int] = (200, 2000)
    memory_source_size: tuple[int, int] = (120, 160)
    work_dir: str | None = None
    cache: str = DEFAULT_CACHE
    seed: int = 0
    quick: bool = False
    sections: tuple[str, ...] = SECTIONS

    def __post_init__(self) -> None:
        unknown = [x for x in self.sections if x not in SECTIONS]
        if unknown or not self.sections:
            raise ValueError(f"sections must be a non-empty subset of {list(SECTIONS)}. Received: {self.sections!r}")
        for name in ("samples", "num_classes", "batch_size", "shuffle_buffer", "repeats", "convert_repeats",
                     "naive_samples", "bandwidth_bytes"):
            _positive_int(name, getattr(self, name))
        for name in ("size", "source_size", "memory_source_size", "memory_samples"):
            value = getattr(self, name)
            if not (isinstance(value, tuple) and len(value) == 2):
                raise ValueError(f"{name} must be a pair of positive integers. Received: {name}={value!r}")
            for v in value:
                _positive_int(name, v)
        if self.bandwidth_bytes < 1 << 20:
            raise ValueError(f"bandwidth_bytes must be at least 1 MiB (1048576). Received: {self.bandwidth_bytes}")
        if self.num_classes > 32:
            raise ValueError(f"num_classes must be at most 32 for generated sources. Received: {self.num_classes}")
        if not isinstance(self.workers, tuple):
            raise TypeError(f"workers must be a tuple of worker counts. Received: {self.workers!r}")
        for w in self.workers:
            _positive_int("workers", w)
        if isinstance(self.min_seconds, bool) or not isinstance(self.min_seconds, (int, float)) or self.min_seconds < 0:
            raise ValueError(f"min_seconds must be a number >= 0. Received: min_seconds={self.min_seconds!r}")
        if self.src is not None and not os.path.isdir(self.src):
            raise FileNotFoundError(f"--src must be a source folder (train/, train_labels/, class_dict.csv). "
                                    f"Received: {self.src!r}, which is not a folder")

    @property
    def worker_counts(self) -> tuple[int, ...]:
        """Worker counts to time the converter with: the given ones, else 1..cores."""
        if self.workers:
            return self.workers
        return tuple(range(1, (os.cpu_count() or 1) + 1))


def quick_options(**overrides: object) -> BenchOptions:
    """The `--quick` preset: 24 small sources at 64x64, one short repeat of everything
    (readers: the warm-up round and one kept round of a few batches; a 16 MiB bandwidth probe).

    It exercises every pipeline and measurement path in well under a minute; its
    numbers are not meaningful (start-up costs dominate).
    """
    base = BenchOptions(
        samples=24, source_size=(96, 128), size=(64, 64), repeats=1, convert_repeats=1, min_seconds=0.0,
        workers=(1, 2), naive_samples=8, memory=False, memory_samples=(20, 60), memory_source_size=(32, 48),
        shuffle_buffer=16, quick=True, bandwidth_bytes=16 << 20,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]
