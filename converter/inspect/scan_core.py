"""What the segmentation and classification scans share: the options, the per-file
summary, header sniffing, pixel hashes, the batched worker run, duplicate and image-size
statistics, and the text of the bad-input and verdict blocks.

`scan` (segmentation, and the entry point) and `scan_classification` both build on this
module; neither imports the other's internals.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from converter.discover.classfolders import detect_task
from converter.discover.layout import BadInput, SourceSample
from converter.options import DEFAULT_MAX_PIXELS, ExifMode, LabelOptions, SourceSpec, Task, check_val_fraction
from converter.run.execute import map_unordered
from converter.transform.decode import DecodeError

#: Unknown colours kept per file (the most frequent); the rest are summed as "other".
MAX_UNKNOWN_COLORS_PER_FILE = 4096
#: Files named per unknown colour / duplicate group in the report.
EXAMPLES = 5

Color = tuple[int, int, int]


@dataclass(frozen=True)
class ScanOptions:
    """Options of a scan; `color_tolerance`, `max_pixels`, `task` and `val_fraction` mean what
    they mean for convert (`task` None: detected from the sources, as convert does)."""

    color_tolerance: int = 0
    max_pixels: int = DEFAULT_MAX_PIXELS
    workers: int = 0  # 0 -> all cores
    task: Task | None = None
    val_fraction: float | None = None  # classification, flat layout
    labels: LabelOptions | None = None  # mask semantics, ignore values, label map: as for convert
    image_kind: Any = None  # `converter.imagekind.ImageKind`: --image-mode, --alpha, --accept-reduction as for convert
    exif: ExifMode = ExifMode.AUTO  # segmentation: --exif as for convert (judges each pair's sizes)

    def __post_init__(self) -> None:
        if self.labels is not None and not isinstance(self.labels, LabelOptions):
            raise TypeError(f"labels must be a LabelOptions. Received: {self.labels!r}")
        if self.task is not None:
            object.__setattr__(self, "task", Task.parse(self.task, "--task"))
        object.__setattr__(self, "val_fraction", check_val_fraction(self.val_fraction, self.task))
        object.__setattr__(self, "exif", ExifMode.parse(self.exif, "--exif"))
        if isinstance(self.color_tolerance, bool) or not isinstance(self.color_tolerance, int) \
                or not 0 <= self.color_tolerance <= 255:
            raise ValueError(f"--color-tolerance must be an integer in 0..255. Received: {self.color_tolerance!r}")
        if isinstance(self.max_pixels, bool) or not isinstance(self.max_pixels, int) or self.max_pixels < 1:
            raise ValueError(f"--max-pixels must be a positive integer. Received: {self.max_pixels!r}")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 0:
            raise ValueError(f"--workers must be an integer >= 0 (0 = all cores). Received: {self.workers!r}")

    @property
    def effective_workers(self) -> int:
        return self.workers or (os.cpu_count() or 1)

    def resolve_task(self, spec: SourceSpec) -> Task:
        """`task` as given, else classification with `val_fraction`, else detected (as convert)."""
        if self.task is not None:
            return self.task
        if self.val_fraction is not None:
            return Task.CLASSIFICATION
        return detect_task(spec)


@dataclass
class FileSummary:
    """What a worker learns about one pair; small and picklable."""

    split: str
    key: str
    image: str
    mask: str | None
    image_size: tuple[int, int] | None = None  # (width, height)
    image_mode: str | None = None
    image_format: str | None = None
    mask_size: tuple[int, int] | None = None
    mask_mode: str | None = None
    mask_format: str | None = None
    values: dict[int, int] | None = None  # index/binary masks: pixel value -> pixels
    thin: dict[int, int] = field(default_factory=dict)  # void value (255, 65535) -> pixels touching another value
    unknown_values: dict[int, int] = field(default_factory=dict)  # index masks: values with no class
    image_digest: str | None = None  # file bytes
    pixel_hash: str | None = None  # decoded pixels
    class_pixels: tuple[int, ...] | None = None  # exact colour matches per class
    unknown: dict[Color, int] = field(default_factory=dict)  # colour -> pixels (at most MAX_UNKNOWN_COLORS_PER_FILE)
    unknown_other_pixels: int = 0  # pixels of the unknown colours not listed
    unknown_other_colors: int = 0
    errors: list[BadInput] = field(default_factory=list)  # decode / size problems (not colours)
    image_kind: Any = None  # `converter.transform.kinds.SourceKind` (dtype, channels, alpha)
    image_bits: int | None = None  # bits the image's largest sample needs (12 of a 16-bit file)
    band_files: int = 0  # files stacked per sample (band folders)

    @property
    def mask_pixels(self) -> int:
        return self.mask_size[0] * self.mask_size[1] if self.mask_size else 0


def file_header(data: bytes) -> tuple[str | None, str | None]:
    """(mode, format) from the file header; None when Pillow cannot identify it."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            return im.mode, im.format
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        return None, None


def bad_input(e: DecodeError, key: str) -> BadInput:
    return BadInput(e.path, e.reason, e.fix, key, e.kind)


def pixel_hash(image: np.ndarray) -> str:
    """sha256 of decoded pixels (with shape and dtype): equal for the same picture in other files."""
    h = hashlib.sha256(f"{image.shape}|{image.dtype}".encode())
    h.update(np.ascontiguousarray(image).data)
    return h.hexdigest()


def _batches(samples: Sequence[SourceSample], workers: int) -> list[list[SourceSample]]:
    size = max(1, min(64, math.ceil(len(samples) / max(1, workers * 4))))
    return [list(samples[i:i + size]) for i in range(0, len(samples), size)]


def run_batched(scan_some: Callable[[Sequence[SourceSample]], list], samples: Sequence[SourceSample],
                workers: int, on_progress: Callable[[int], None] | None = None) -> list:
    """`scan_some` over batches of `samples` (worker processes when workers > 1); every
    summary, sorted by key. `scan_some` must be picklable (a partial of a module function)."""
    out: list = []
    for result in map_unordered(scan_some, _batches(samples, workers), workers):
        out += result
        if on_progress is not None:
            on_progress(len(result))
    out.sort(key=lambda s: s.key)
    return out


def share(n: int, total: int) -> float:
    return round(100.0 * n / total, 4) if total else 0.0


def find_duplicates(summaries: list[FileSummary], split_names: list[str]) -> dict[str, Any]:
    groups: dict[str, list[FileSummary]] = {}
    for s in summaries:
        if s.pixel_hash is not None:
            groups.setdefault(s.pixel_hash, []).append(s)
    dup_groups = []
    pairs: Counter = Counter()
    for h, members in sorted(groups.items(), key=lambda kv: kv[1][0].key):
        if len(members) < 2:
            continue
        per_split = Counter(m.split for m in members)
        names = sorted(per_split)
        for i, a in enumerate(names):
            pairs[f"{a}/{a}"] += per_split[a] * (per_split[a] - 1) // 2
            for b in names[i + 1:]:
                pairs[f"{a}/{b}"] += per_split[a] * per_split[b]
        dup_groups.append({
            "pixel_sha256": h, "keys": [m.key for m in members], "splits": names,
            "identical_files": len({m.image_digest for m in members}) == 1,
        })
    cross = sum(n for k, n in pairs.items() if k.split("/")[0] != k.split("/")[1])
    within = sum(n for k, n in pairs.items() if k.split("/")[0] == k.split("/")[1])
    return {"groups": dup_groups, "pairs_per_split_pair": {k: v for k, v in sorted(pairs.items()) if v},
            "within_split_pairs": within, "cross_split_pairs": cross,
            "duplicate_images": sum(len(g["keys"]) for g in dup_groups)}


def image_stats(summaries: list[FileSummary]) -> dict[str, Any]:
    sizes = Counter(f"{s.image_size[0]}x{s.image_size[1]}" for s in summaries if s.image_size)
    return {
        "sizes_wxh": dict(sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))),
        "image_modes": dict(sorted(Counter(s.image_mode or "?" for s in summaries).items())),
        "image_formats": dict(sorted(Counter(s.image_format or "?" for s in summaries).items())),
        "mask_modes": dict(sorted(Counter(s.mask_mode or "?" for s in summaries if s.mask).items())),
        "largest_pixels": max((s.image_size[0] * s.image_size[1] for s in summaries if s.image_size), default=0),
    }


def format_bad_inputs(bad: list, limit: int) -> list[str]:
    """The 'Bad inputs' block of a scan report (empty when there are none)."""
    if not bad:
        return []
    out = ["", f"Bad inputs ({len(bad)}), as convert would report them:"]
    out += [f"  [{b.kind}] {b}" for b in bad[:limit]]
    if len(bad) > limit:
        out.append(f"  ... and {len(bad) - limit} more (see --json)")
    return out


def format_verdict(r: Any) -> list[str]:
    """The verdict block of a report (a `ScanReport` or a `ClassScanReport`: anything with `.verdict`)."""
    v = r.verdict
    headline = {
        "ok": "OK: convert will succeed.",
        "warnings": "OK with warnings: convert will succeed, but look at the warnings.",
        "needs_flags": "convert would FAIL without the flags below; with them it succeeds.",
        "no_data": "Nothing to convert.",
        "needs_decision": "convert would FAIL: a choice only you can make is needed (see the problem below).",
    }[v["status"]]
    out = [f"Verdict: {headline}"]
    out += [f"  problem: {p}" for p in v["problems"]]
    out += [f"  warning: {w}" for w in v["warnings"]]
    if v.get("command"):
        out.append(f"  run: {v['command']}")
    out += [f"  hint: {h}" for h in v["hints"]]
    return out


__all__ = ["EXAMPLES", "FileSummary", "ScanOptions", "bad_input", "file_header", "find_duplicates", "format_bad_inputs",
           "format_verdict", "image_stats", "pixel_hash", "run_batched", "share"]
