"""The numbers of one benchmark run: its rows (`Row`) and the run (`BenchResult`)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from converter.bench.bandwidth import limit_samples_per_s
from converter.bench.measure import Timing
from converter.bench.options import BenchOptions


#: (name, a, b): the pairs the report compares, a against b, timed side by side.
COMPARISONS = (
    ("imgshard float32 + one-hot vs Dataset.save/load float32 + one-hot", "p4_imgshard_float32", "p3_saved_float32"),
    ("imgshard float32 + sparse labels vs Dataset.save/load float32 + sparse", "p4_imgshard_sparse",
     "p3_saved_sparse"),
    ("imgshard compact vs Dataset.save/load compact", "p5_imgshard_compact", "p3_saved_compact"),
    ("imgshard NPZ compressed vs np.load loop", "p6_imgshard_npz_deflate", "p6_np_load_deflate"),
    ("imgshard NPZ stored vs np.load loop", "p6_imgshard_npz_none", "p6_np_load_none"),
    ("converter 2 workers vs 1 (wall clock, run by run)", "convert_w2", "convert_w1"),
    ("imgshard Augment(rotate=10) vs albumentations, float32 + one-hot", "p11_rotate_float32",
     "p11_albumentations_float32"),
    ("imgshard Augment(rotate=10) vs albumentations, compact", "p11_rotate_compact", "p11_albumentations_compact"),
    ("imgshard Augment(rotate=10) vs Keras preprocessing layers, float32 + one-hot", "p11_rotate_float32",
     "p11_keras_layers_float32"),
)


@dataclass
class Row:
    """One line of the table.

    `timing` holds the kept rounds (samples/s), `warmup` the dropped first round(s);
    `bytes_per_sample` is what the row writes (delivers) per sample, `bytes_read` what
    it reads (reader rows: its stored sample; see `converter.bench.pipelines`).
    """

    key: str
    label: str
    group: str  # "reader", "convert" or "probe"
    bytes_per_sample: int
    timing: Timing = field(default_factory=Timing)
    cpu: Timing = field(default_factory=Timing)  # samples per CPU-second
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    bytes_read: int = 0
    warmup: Timing = field(default_factory=Timing)
    warmup_cpu: Timing = field(default_factory=Timing)

    def record(self, samples: int, wall: float, cpu: float, *, warmup: bool = False) -> None:
        """One round: `samples` in `wall` seconds and `cpu` CPU-seconds; a warm-up round is kept apart."""
        (self.warmup if warmup else self.timing).add(samples, wall)
        (self.warmup_cpu if warmup else self.cpu).add(samples, cpu)

    @property
    def bytes_read_written(self) -> int:
        return self.bytes_read + self.bytes_per_sample

    def limit(self, bandwidth_gb_per_s: float) -> float:
        """Samples/s at which moving this row's bytes once would take all the copy bandwidth."""
        if self.group != "reader":
            return float("nan")
        return limit_samples_per_s(bandwidth_gb_per_s, self.bytes_read, self.bytes_per_sample)

    def to_json(self, bandwidth_gb_per_s: float = float("nan")) -> dict:
        lo, hi = self.timing.spread
        limit = self.limit(bandwidth_gb_per_s)
        out = {"key": self.key, "label": self.label, "group": self.group, "samples_per_s": self.timing.median,
               "mb_per_s": self.timing.median * self.bytes_per_sample / 1e6, "min": lo, "max": hi,
               "repeats": self.timing.rates, "warmup": self.warmup.rates,
               "rounds": len(self.timing.rates) + len(self.warmup.rates),
               "bytes_per_sample": self.bytes_per_sample, "note": self.note,
               "samples_per_cpu_s": self.cpu.median if self.cpu.rates else None, "cpu_repeats": self.cpu.rates}
        if self.group == "reader":
            out.update(bytes_read=self.bytes_read, bytes_written=self.bytes_per_sample,
                       bytes_read_written=self.bytes_read_written, limit_samples_per_s=limit,
                       share_of_limit=self.timing.median / limit if limit > 0 else float("nan"))
        return {**out, **self.extra}


@dataclass
class BenchResult:
    options: BenchOptions
    machine: dict[str, Any]
    sources: dict[str, Any]
    rows: dict[str, Row] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    storage: dict[str, Any] = field(default_factory=dict)  # encoding -> size, PSNR, warm/cold reads
    bandwidth: dict[str, Any] = field(default_factory=dict)  # the copy-bandwidth probes (`measure_bandwidth`)
    seconds: float = 0.0

    def add(self, row: Row) -> Row:
        self.rows[row.key] = row
        return row

    def rate(self, key: str, *, cpu: bool = False) -> float:
        row = self.rows.get(key)
        if row is None:
            return float("nan")
        return (row.cpu if cpu else row.timing).median

    @property
    def bandwidth_gb_per_s(self) -> float:
        """The copy bandwidth the limits use: the median of every probe's trials."""
        return float(self.bandwidth.get("median_gb_per_s", float("nan")))

    def share_of_limit(self, key: str) -> float:
        row = self.rows.get(key)
        if row is None:
            return float("nan")
        limit = row.limit(self.bandwidth_gb_per_s)
        return row.timing.median / limit if limit > 0 else float("nan")

    def round_ratios(self, a: str, b: str) -> list[float]:
        """Rate of `a` over rate of `b`, round by round (kept rounds; they were timed side by side)."""
        ra, rb = self.rows.get(a), self.rows.get(b)
        if ra is None or rb is None:
            return []
        return [x / y for x, y in zip(ra.timing.rates, rb.timing.rates) if y > 0]

    def ratio(self, a: str, b: str) -> dict[str, Any]:
        """`a` against `b`: the ratio of their medians and the per-round ratios (median, min, max)."""
        x, y = self.rate(a), self.rate(b)
        per = self.round_ratios(a, b)
        return {"a": a, "b": b, "ratio_of_medians": x / y if y and not math.isnan(x) and not math.isnan(y)
                else float("nan"), "per_round": per,
                "per_round_median": statistics.median(per) if per else float("nan"),
                "per_round_min": min(per, default=float("nan")), "per_round_max": max(per, default=float("nan"))}

    def to_json(self) -> dict:
        """The run's JSON without its targets (`converter.bench.report.write_json` adds them)."""
        opts = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.options.__dict__.items()}
        bw = self.bandwidth_gb_per_s
        comparisons = {name: self.ratio(a, b) for name, a, b in COMPARISONS if a in self.rows and b in self.rows}
        return {"options": opts, "machine": self.machine, "sources": self.sources, "seconds": round(self.seconds, 1),
                "bandwidth": self.bandwidth, "rows": [r.to_json(bw) for r in self.rows.values()],
                "comparisons": comparisons, "memory": self.memory, "storage": self.storage}


__all__ = ["COMPARISONS", "BenchResult", "Row"]
