"""`imgshard scan` for annotation files (COCO, YOLO, LabelMe, CVAT, instance masks, RLE CSV).

Workers decode each image and rasterize its annotations exactly as convert does
(`converter.discover.annotations.registry.rasterize_canvas`) and send back a small
summary: the image size, pixels per class, ignored pixels, overlapping pixels and the
problem, if any. The report gives the format and its evidence, the categories with
their shapes, pixels and files, the overlap rule and overlapping pixels, what the
reader found (polygons outside the image or with fewer than 3 points, crowd regions,
a placeholder category left out), bad inputs, and the one command that converts.
"""

from __future__ import annotations

import functools
import json
import shlex
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from converter.discover.annotations.layouts import ANNOTATION_LAYOUTS
from converter.discover.annotations.registry import rasterize_canvas
from converter.discover.annotations.rlecsv import decode_runs, edges
from converter.discover.files import WithStorage, absolute
from converter.discover.labels import classes_file_names
from converter.discover.layout import BadInput, Discovery, SourceSample
from converter.inspect.scan_core import ScanOptions, bad_input, format_bad_inputs, format_verdict, run_batched
from converter.inspect.scan_labels import source_args, source_positional, suggest_size
from converter.options import Overlap, SourceSpec, Task
from converter.transform.decode import DecodeError, decode_image, read_source
from converter.transform.sample import relative_key_path


#: scan proposes the other RLE run order when the shapes have this many times more edges the current way.
RUN_ORDER_MARGIN = 1.5


@dataclass
class AnnotationSummary:
    """What a worker learns about one sample; small and picklable."""

    split: str
    key: str
    size: tuple[int, int] | None = None  # (width, height)
    pixels: tuple[int, ...] = ()  # per class value 0..C-1
    ignored: int = 0
    overlap: int = 0
    order_edges: tuple[int, int] = (0, 0)  # RLE CSV: edges of its shapes read down the columns, along the rows
    errors: list[BadInput] = field(default_factory=list)


def scan_annotation(sample: SourceSample, base: str, max_pixels: int, num_classes: int) -> AnnotationSummary:
    s = AnnotationSummary(sample.split, sample.key)
    try:
        image = decode_image(read_source(sample.image, relative_key_path(sample.image, base)), max_pixels,
                             exif_transpose=True)  # as convert decodes annotated images
        h, w = image.shape[:2]
        s.size = (w, h)
        canvas = rasterize_canvas(sample.annotation, h, w)
    except DecodeError as e:
        s.errors.append(bad_input(e, sample.key))
        return s
    counts = np.bincount(canvas.values.ravel(), minlength=max(num_classes, canvas.ignore + 1))
    s.pixels = tuple(int(n) for n in counts[:num_classes])
    s.ignored = int(counts[canvas.ignore])
    s.overlap = canvas.overlap
    if sample.annotation.format == "rlecsv":
        s.order_edges = _order_edges(sample.annotation.payload, h, w)
    return s


def _order_edges(payload: bytes, h: int, w: int) -> tuple[int, int]:
    """Edges of an RLE CSV sample's shapes decoded down the columns and along the rows (0, 0: unreadable)."""
    try:
        out = []
        for order in ("columns", "rows"):
            union = np.zeros((h, w), bool)
            for shape in json.loads(payload)["shapes"]:
                union |= decode_runs(shape["runs"], h, w, "", order)
            out.append(edges(union))
        return out[0], out[1]
    except DecodeError:
        return 0, 0


def run_order(spec: SourceSpec, ok: list) -> tuple[str | None, str]:
    """(the other run order when the shapes say the runs go that way, else None; the evidence)."""
    cols, rows = (sum(s.order_edges[i] for s in ok) for i in (0, 1))
    current = spec.annotations.rle_order.value
    mine, other = (cols, rows) if current == "columns" else (rows, cols)
    evidence = f"the shapes have {cols} edges read down the columns, {rows} along the rows"
    if mine >= 20 and other * RUN_ORDER_MARGIN < mine:
        return ("rows" if current == "columns" else "columns"), evidence
    return None, evidence


def _scan_batch(samples: Sequence[SourceSample], base: str, max_pixels: int, num_classes: int) -> list:
    return [scan_annotation(s, base, max_pixels, num_classes) for s in samples]


@dataclass
class AnnotationScanReport:
    source: str
    format: str
    why: str
    overlap_rule: str
    splits: dict[str, int]
    classes_table: list[dict]
    problems: dict[str, int]
    notes: list[str]
    overlap_pixels: int
    overlap_files: int
    ignored_pixels: int
    bad: list[BadInput]
    sizes_wxh: dict[str, int]
    verdict: dict[str, Any]
    spec: SourceSpec | None = None
    found: Discovery | None = None

    def to_json(self) -> dict:
        return {"task": Task.SEGMENTATION.value, "source": self.source,
                "annotations": {"format": self.format, "why": self.why, "overlap_rule": self.overlap_rule,
                                "problems": self.problems, "notes": self.notes,
                                "overlap_pixels": self.overlap_pixels, "overlap_files": self.overlap_files,
                                "ignored_pixels": self.ignored_pixels},
                "pairs": self.splits, "total_pairs": sum(self.splits.values()), "classes": self.classes_table,
                "bad": [b.to_json() for b in self.bad],
                "bad_counts": dict(sorted(Counter(b.kind for b in self.bad).items())),
                "images": {"sizes_wxh": self.sizes_wxh}, "verdict": self.verdict}


def scan_annotations(spec: SourceSpec, options: ScanOptions, found: Discovery,
                     on_start: Callable[[int], None] | None = None,
                     on_progress: Callable[[int], None] | None = None) -> AnnotationScanReport:
    """The scan report of an annotation source (`found`: its discovery)."""
    layout = ANNOTATION_LAYOUTS[found.layout]
    ann = layout.last(absolute(spec.root))  # type: ignore[arg-type]
    names = ann.class_names
    if spec.classes is not None:  # as convert: a file naming the drawn classes in another order is refused
        classes_file_names(spec.classes, found)
    if on_start is not None:
        on_start(len(found.samples))
    work = functools.partial(_scan_batch, base=spec.base, max_pixels=options.max_pixels, num_classes=len(names))
    summaries = run_batched(WithStorage(work, spec.base, spec.storage_options), found.samples,
                            options.effective_workers, on_progress)
    bad = list(found.bad) + [e for s in summaries for e in s.errors]
    ok = [s for s in summaries if not s.errors]
    pixels = np.zeros(len(names), np.int64)
    files = np.zeros(len(names), np.int64)
    for s in ok:
        pixels += np.array(s.pixels, np.int64)
        files += np.array(s.pixels, np.int64) > 0
    total = int(pixels.sum()) + sum(s.ignored for s in ok)
    table = [{"index": i, "name": n, "shapes": int(ann.shapes.get(n, 0)), "pixels": int(pixels[i]),
              "files": int(files[i]), "share": round(100.0 * int(pixels[i]) / total, 4) if total else 0.0}
             for i, n in enumerate(names)]
    sizes = Counter(f"{s.size[0]}x{s.size[1]}" for s in ok if s.size)
    splits = dict(Counter(s.split for s in ok))
    verdict = _verdict(spec, found, bad, ok, dict(sizes), ann.problems)
    return AnnotationScanReport(spec.root or "", found.layout, found.why, layout.reader.overlap_rule,
                                {k: splits.get(k, 0) for k in found.splits}, table, dict(ann.problems),
                                list(ann.notes), sum(s.overlap for s in ok), sum(1 for s in ok if s.overlap),
                                sum(s.ignored for s in ok), bad, dict(sizes.most_common()), verdict, spec, found)


def _verdict(spec: SourceSpec, found: Discovery, bad: list[BadInput], ok: list, sizes: dict, problems) -> dict:
    size, hint = suggest_size(sizes)
    flags, fix = [], []
    order, evidence = run_order(spec, ok) if found.layout == "rlecsv" else (None, "")
    if order is not None:
        flags += ["--rle-order", order]
        fix.append(f"the RLE runs go along the {order} ({evidence}): convert needs --rle-order {order}")
    a = spec.annotations
    if a.overlap is not Overlap.TOOL:
        flags += ["--overlap", a.overlap.value]
    if a.keep_crowd:
        flags.append("--keep-crowd")
    if a.rle_class:
        flags += ["--rle-class", a.rle_class]
    cmd = ["imgshard", "convert", *source_positional(spec), "OUT", "--size", size, *source_args(spec, found), *flags]
    warnings = [f"{n} {what}" for what, n in sorted(problems.items())]
    if problems.get("crowd regions (ignored)"):
        hint = ((hint + "; ") if hint else "") + ("crowd regions go to the ignore index; if they are objects (CVAT's "
                                                  "COCO 1.0 export writes masks as iscrowd RLE), add --keep-crowd")
    status = "no_data" if not ok else ("needs_flags" if bad or fix else ("warnings" if warnings else "ok"))
    return {"status": status, "convert_ok_without_flags": bool(ok) and not bad and not fix,
            "problems": fix + ([f"{len(bad)} bad input(s): convert refuses to publish unless --max-bad {len(bad)}"]
                               if bad else []),
            "warnings": warnings, "command": shlex.join(cmd + (["--max-bad", str(len(bad))] if bad else [])),
            "hints": [hint] if hint else []}


def format_annotation_report(r: AnnotationScanReport, *, limit: int = 20) -> str:
    out = [f"Source: {r.source}", f"Annotations: {r.format} ({r.why})", f"Overlaps: {r.overlap_rule}; "
           f"{r.overlap_pixels} overlapping pixel(s) in {r.overlap_files} image(s) "
           f"(--overlap {'|'.join(Overlap.values())})"]
    out.append("Samples: " + (", ".join(f"{k} {v}" for k, v in r.splits.items()) or "none")
               + f" (total {sum(r.splits.values())})")
    out.append("Image sizes (WxH): " + ", ".join(f"{k} x{v}" for k, v in list(r.sizes_wxh.items())[:8]))
    out.append(f"Classes ({len(r.classes_table)}; 0 = background; share of all pixels):")
    width = max((len(c["name"]) for c in r.classes_table), default=4)
    for c in r.classes_table[: 3 * limit]:
        out.append(f"  {c['index']:>3} {c['name']:<{width}} {c['share']:7.3f}%  {c['pixels']:>10} px in "
                   f"{c['files']:>5} image(s), {c['shapes']:>6} shape(s)")
    if r.ignored_pixels:
        out.append(f"  ignored (crowd, __ignore__, --overlap ignore): {r.ignored_pixels} px")
    out += [f"Note: {n}" for n in r.notes]
    out += [f"Found: {n} {what}" for what, n in sorted(r.problems.items())]
    out += format_bad_inputs(r.bad, limit)
    out.append("")
    out += format_verdict(r)
    return "\n".join(out)


__all__ = ["AnnotationScanReport", "format_annotation_report", "scan_annotation", "scan_annotations"]
