"""`imgshard scan` for class-folder (classification) sources.

Same discovery (`converter.discover.classfolders.discover_classification`, with
``--val-fraction``) and the same decoding as `convert` for classification (EXIF
orientation applied, every mode to RGB), so what this scan calls bad is what convert
would refuse, with the same `DecodeError` kinds. Workers (as for `converter.inspect.scan`:
`converter.run.execute.map_unordered`) decode each image once and send back an `ImageSummary`: size as
displayed, mode, format, file and pixel hashes, EXIF orientation and EXIF trouble.
The parent then reports:

* images per split and per class (count and share of the split's usable images);
  classes with no image in a split, and class folders with no image at all;
* bad inputs as convert would name them (discovery: image outside a class folder,
  zero-byte file; decoding: truncated, corrupt, not an image, too large, EXIF that
  cannot be applied);
* EXIF: images that convert rotates or flips, and images whose EXIF is corrupt or
  whose orientation tag is invalid (convert then uses the pixels as stored: a warning);
* exact duplicates by decoded-pixel hash (`converter.inspect.scan.pixel_hash`) within and across
  splits with counts per pair of splits, and duplicates filed under different classes;
* image size / mode / format distribution;
* a verdict with the exact `imgshard convert` command (``--task``, ``--val-fraction``,
  ``--max-bad`` when needed).

Deterministic: summaries are sorted by key before they are aggregated.
"""

from __future__ import annotations

import functools
import io
import os
import shlex
import struct
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from converter.discover.classfolders import FLAT_SPLIT, detect_task, discover_classification
from converter.discover.layout import WELL_KNOWN_SPLITS, BadInput, SourceSample
from converter.options import SourceSpec, Task
from converter.inspect.scan_core import (
    EXAMPLES,
    FileSummary,
    ScanOptions,
    bad_input,
    find_duplicates,
    file_header,
    format_bad_inputs,
    format_verdict,
    image_stats,
    pixel_hash,
    run_batched,
    share,
)
from converter.transform import png
from converter.discover.files import WithStorage, subfolders
from converter.transform.decode import DecodeError, decode_image, read_source
from converter.transform.sample import relative_key_path
from readers.manifest import ClassInfo
from readers.storage.url import storage_option_flags

EXIF_ORIENTATION_TAG = 0x0112
#: A hint about class weights when the largest class has this many times the images of the smallest.
IMBALANCE_RATIO = 5.0


@dataclass
class ImageSummary(FileSummary):
    """What a worker learns about one class-folder image (`mask` is None)."""

    label: int = -1
    exif_orientation: int | None = None  # a valid tag value 1..8; None when absent
    exif_problem: str | None = None  # corrupt EXIF or invalid orientation (convert ignores the EXIF then)


# -- worker side ---------------------------------------------------------------------------------

def exif_info(data: bytes) -> tuple[int | None, str | None]:
    """(orientation 1..8 or None, problem or None) of an image file's EXIF, read as Pillow does."""
    from PIL import Image

    if data.startswith(png.SIGNATURE) and b"eXIf" not in data:
        return None, None  # no EXIF chunk; don't make Pillow decode the PNG to look for one
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with Image.open(io.BytesIO(data)) as im:
                value = im.getexif().get(EXIF_ORIENTATION_TAG)
    except (OSError, SyntaxError, ValueError, KeyError, TypeError, struct.error) as e:
        return None, f"cannot read EXIF: {type(e).__name__}: {e}"
    notes = sorted({str(w.message).strip() for w in caught if "exif" in str(w.message).lower()})
    problem = "; ".join(notes) or None
    if value is None:
        return None, problem
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 8:
        return value, problem
    bad = f"EXIF orientation {value!r} is not 1..8, so it is ignored"
    return None, f"{problem}; {bad}" if problem else bad


def scan_image(sample: SourceSample, base: str, max_pixels: int) -> ImageSummary:
    """Decode one image the way convert would (EXIF applied) and summarise it (never raises DecodeError)."""
    s = ImageSummary(sample.split, sample.key, sample.image, None, label=-1 if sample.label is None else sample.label)
    try:
        src = read_source(sample.image, relative_key_path(sample.image, base))
        s.image_digest = src.fingerprint.digest
        s.image_mode, s.image_format = file_header(src.data)
        with warnings.catch_warnings():  # Pillow's "Corrupt EXIF data" (no file name): reported below, by file
            warnings.filterwarnings("ignore", message=".*EXIF", category=UserWarning)
            image = decode_image(src, max_pixels, exif_transpose=True)
    except DecodeError as e:
        s.errors.append(bad_input(e, sample.key))
        return s
    s.image_size = (int(image.shape[1]), int(image.shape[0]))
    s.pixel_hash = pixel_hash(image)
    s.exif_orientation, s.exif_problem = exif_info(src.data)
    return s


def scan_image_batch(samples: Sequence[SourceSample], base: str, max_pixels: int) -> list[ImageSummary]:
    return [scan_image(s, base, max_pixels) for s in samples]


def run_image_workers(samples: Sequence[SourceSample], base: str, max_pixels: int, workers: int,
                      on_progress: Callable[[int], None] | None = None,
                      storage_options: tuple = ()) -> list[ImageSummary]:
    """Summaries of every image, sorted by key; worker processes when workers > 1 (`execute.map_unordered`)."""
    scan = functools.partial(scan_image_batch, base=base, max_pixels=max_pixels)
    return run_batched(WithStorage(scan, base, storage_options), samples, workers, on_progress)


# -- parent side ----------------------------------------------------------------------------------

@dataclass
class ClassScanReport:
    source: str
    spec: SourceSpec
    options: ScanOptions
    layout: str  # "split", "flat" or "folder" (--images DIR)
    classes: tuple[ClassInfo, ...]
    splits: dict[str, int]  # image files found per split
    usable: dict[str, int]  # of which decode
    summaries: list[ImageSummary]
    bad: list[BadInput]
    classes_table: list[dict]
    never_present: list[str]
    missing_per_split: dict[str, list[str]]
    exif: dict[str, Any]
    duplicates: dict[str, Any]
    images: dict[str, Any]
    verdict: dict[str, Any]

    task = Task.CLASSIFICATION.value

    def to_json(self) -> dict:
        return {
            "task": self.task,
            "layout": self.layout,
            "source": self.source,
            "options": {"max_pixels": self.options.max_pixels, "val_fraction": self.options.val_fraction},
            "samples": self.splits,
            "usable_samples": self.usable,
            "total_samples": sum(self.splits.values()),
            "bad": [b.to_json() for b in self.bad],
            "bad_counts": dict(sorted(Counter(b.kind for b in self.bad).items())),
            "classes": self.classes_table,
            "classes_never_present": self.never_present,
            "classes_missing_per_split": self.missing_per_split,
            "exif": self.exif,
            "duplicates": self.duplicates,
            "images": self.images,
            "verdict": self.verdict,
        }


def scan_classification(spec: SourceSpec, options: ScanOptions | None = None, *,
                        on_start: Callable[[int], None] | None = None,
                        on_progress: Callable[[int], None] | None = None) -> ClassScanReport:
    """Scan a class-folder source. `on_start(total)` is called once the images are known."""
    options = options or ScanOptions(task=Task.CLASSIFICATION)
    found, classes = discover_classification(spec, options.val_fraction)
    if on_start is not None:
        on_start(len(found.samples))
    summaries = run_image_workers(found.samples, spec.base, options.max_pixels, options.effective_workers,
                                  on_progress, spec.storage_options)
    return build_classification_report(spec, options, classes, found.splits, found.bad, summaries)


def _layout(spec: SourceSpec) -> str:
    """"folder" (--images DIR), "split" (SRC/<split>/<class>/*) or "flat" (SRC/<class>/*), as discovery reads it."""
    if spec.images is not None:
        return "folder"
    root = spec.base
    for name in WELL_KNOWN_SPLITS:
        if subfolders(os.path.join(root, name)):  # a local folder or a bucket prefix (`discover.files`)
            return "split"
    return "flat"


def build_classification_report(spec: SourceSpec, options: ScanOptions, classes: tuple[ClassInfo, ...],
                                splits: Sequence[str], discovery_bad: Sequence[BadInput],
                                summaries: list[ImageSummary]) -> ClassScanReport:
    split_names = sorted(set(splits) | {s.split for s in summaries})
    found = {sp: 0 for sp in split_names}
    usable = {sp: 0 for sp in split_names}
    counts = {sp: [0] * len(classes) for sp in split_names}
    for s in summaries:
        found[s.split] += 1
        if not s.errors:
            usable[s.split] += 1
            counts[s.split][s.label] += 1
    total_usable = sum(usable.values())
    table = []
    for i, c in enumerate(classes):
        n = sum(counts[sp][i] for sp in split_names)
        table.append({
            "index": i, "name": c.name,
            "images": {sp: counts[sp][i] for sp in split_names},
            "share": {sp: share(counts[sp][i], usable[sp]) for sp in split_names},
            "total": n, "total_share": share(n, total_usable),
        })
    never = [c["name"] for c in table if c["total"] == 0]
    missing = {sp: [c["name"] for c in table if c["images"][sp] == 0 and c["name"] not in never]
               for sp in split_names if usable[sp]}
    missing = {sp: names for sp, names in missing.items() if names}

    bad = list(discovery_bad)
    for s in summaries:
        bad += s.errors
    bad.sort(key=lambda b: (b.path, b.kind, b.reason))

    orientations = Counter(str(s.exif_orientation) for s in summaries if s.exif_orientation is not None)
    exif = {
        "orientations": dict(sorted(orientations.items())),
        "rotated_or_flipped": sum(1 for s in summaries if s.exif_orientation not in (None, 1)),
        "problems": [{"key": s.key, "path": s.image, "problem": s.exif_problem}
                     for s in summaries if s.exif_problem],
    }

    duplicates = find_duplicates(summaries, split_names)
    name_of = {s.key: classes[s.label].name for s in summaries if 0 <= s.label < len(classes)}
    conflicts = 0
    for g in duplicates["groups"]:
        g["classes"] = sorted({name_of.get(k, "?") for k in g["keys"]})
        g["conflicting_classes"] = len(g["classes"]) > 1
        conflicts += g["conflicting_classes"]
    duplicates["groups_with_conflicting_classes"] = conflicts
    images = image_stats(summaries)
    images.pop("mask_modes", None)

    report = ClassScanReport(
        source=spec.root or spec.images or "", spec=spec, options=options, layout=_layout(spec), classes=classes,
        splits=found, usable=usable, summaries=summaries, bad=bad, classes_table=table, never_present=never,
        missing_per_split=missing, exif=exif, duplicates=duplicates, images=images, verdict={},
    )
    report.verdict = _verdict(report)
    return report


# -- verdict --------------------------------------------------------------------------------------

def source_args(spec: SourceSpec) -> list[str]:
    """The source part of a convert command line for class folders."""
    if spec.root is not None:
        return [spec.root]
    return ["--images", spec.images or "", "--split", spec.split]


def task_args(spec: SourceSpec, options: ScanOptions) -> list[str]:
    """--task / --val-fraction that convert needs to read these sources as this scan did."""
    args: list[str] = []
    if options.val_fraction is not None:
        args += ["--val-fraction", f"{options.val_fraction:g}"]  # implies classification
    elif detect_task(spec) is not Task.CLASSIFICATION:
        args += ["--task", Task.CLASSIFICATION.value]
    return args


def suggest_size(summaries: Sequence[ImageSummary]) -> tuple[str, str]:
    """(HxW, why): the most common displayed size when at least half the images have it, else the
    median height x median width (photos of many sizes)."""
    sizes = Counter((s.image_size[1], s.image_size[0]) for s in summaries if s.image_size)
    if not sizes:
        return "HxW", "a placeholder"
    (h, w), n = min(sizes.items(), key=lambda kv: (-kv[1], kv[0]))
    if 2 * n >= sum(sizes.values()):
        return f"{h}x{w}", "the most common one"
    hs = sorted(h for (h, _w), k in sizes.items() for _ in range(k))
    ws = sorted(w for (_h, w), k in sizes.items() for _ in range(k))
    return f"{hs[len(hs) // 2]}x{ws[len(ws) // 2]}", "the median height x median width"


def _verdict(r: ClassScanReport) -> dict[str, Any]:
    problems: list[str] = []
    warnings_: list[str] = []
    hints: list[str] = []
    flags: list[str] = []
    total = sum(r.splits.values())
    if total == 0:
        problems.append("no image found in the class folders")
    if r.bad:
        kinds = Counter(b.kind for b in r.bad)
        problems.append(f"{len(r.bad)} bad input(s): " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
        flags += ["--max-bad", str(len(r.bad))]
        hints.append("--max-bad converts the good images and skips the bad ones; better: fix or remove them")
        if any(b.kind == "too_large" for b in r.bad):
            hints.append("images over --max-pixels: raise --max-pixels if they are genuine")
    if r.never_present:
        warnings_.append(f"class folder(s) with no image: {', '.join(r.never_present)} (still classes: the "
                         "model gets outputs it never learns)")
    for sp, names in r.missing_per_split.items():
        warnings_.append(f"class(es) with no image in split {sp!r}: {', '.join(names)}")
    d = r.duplicates
    if d["cross_split_pairs"]:
        pairs = ", ".join(f"{k}: {v}" for k, v in d["pairs_per_split_pair"].items()
                          if k.split("/")[0] != k.split("/")[1])
        warnings_.append(f"{d['cross_split_pairs']} duplicate image pair(s) across splits (leakage; {pairs})")
    if d["within_split_pairs"]:
        warnings_.append(f"{d['within_split_pairs']} duplicate image pair(s) within a split")
    if d["groups_with_conflicting_classes"]:
        warnings_.append(f"{d['groups_with_conflicting_classes']} duplicate group(s) filed under different classes "
                         "(the same image with two labels)")
    if r.exif["problems"]:
        warnings_.append(f"{len(r.exif['problems'])} image(s) with unusable EXIF; convert uses their pixels as "
                         "stored, so their orientation may be wrong")
    sizes = r.images["sizes_wxh"]
    size_flag, how = suggest_size(r.summaries)
    if len(sizes) > 1:
        hints.append(f"{len(sizes)} different image sizes; --size {size_flag} is {how}, and "
                     "--fit cover or contain keeps the aspect ratio")
    if r.layout == "flat" and r.options.val_fraction is None and total:
        hints.append(f"no validation split: everything goes to {FLAT_SPLIT!r}; --val-fraction 0.2 puts a stable "
                     "20% (chosen by hashing each key) in 'val'")
    present = [c["images"].get("train", 0) for c in r.classes_table if c["images"].get("train", 0)]
    if len(present) > 1 and max(present) >= IMBALANCE_RATIO * min(present):
        hints.append(f"classes are imbalanced in 'train' ({max(present)} vs {min(present)} images); after "
                     "converting, readers.open(OUT).class_weights('train') gives weights for model.fit")
    targs = task_args(r.spec, r.options)
    command = ["imgshard", "convert", *source_args(r.spec), "OUT", *targs, "--size", size_flag, *flags,
               *storage_option_flags(r.spec.storage_options)]
    status = "no_data" if total == 0 else ("needs_flags" if r.bad else ("warnings" if warnings_ else "ok"))
    return {
        "status": status,
        "convert_ok_without_flags": status in ("ok", "warnings"),
        "flags": flags,
        "task_flags": targs,
        "command": None if status == "no_data" else " ".join(shlex.quote(a) for a in command),
        "reason": problems[0] if problems else ("warnings" if warnings_ else "ok"),
        "evidence": {"pairs": total, "bad_counts": dict(sorted(Counter(b.kind for b in r.bad).items()))},
        "problems": problems,
        "warnings": warnings_,
        "hints": hints,
    }


# -- text report ------------------------------------------------------------------------------------

def format_classification_report(r: ClassScanReport, *, limit: int = 20) -> str:
    """The human-readable report (what `imgshard scan` prints for class folders)."""
    out: list[str] = []
    total = sum(r.splits.values())
    n_bad_images = total - sum(r.usable.values())
    out.append(f"Source: {r.source}  (classification, {r.layout} layout, {len(r.classes)} classes)")
    out.append("Images: " + (", ".join(f"{k} {v}" for k, v in r.splits.items()) or "none") + f" (total {total}"
               + (f"; {n_bad_images} cannot be decoded" if n_bad_images else "") + ")")
    im = r.images
    out.append("Image sizes (WxH, as displayed): " + ", ".join(f"{k} x{v}" for k, v in list(im["sizes_wxh"].items())[:8])
               + (f" ... ({len(im['sizes_wxh'])} sizes)" if len(im["sizes_wxh"]) > 8 else ""))
    out.append("Image modes: " + ", ".join(f"{k} {v}" for k, v in im["image_modes"].items())
               + "; formats: " + ", ".join(f"{k} {v}" for k, v in im["image_formats"].items()))
    ex = r.exif
    out.append(f"EXIF: {ex['rotated_or_flipped']} image(s) rotated or flipped by their orientation tag (convert "
               f"applies it), {len(ex['problems'])} with unusable EXIF")
    for p in ex["problems"][:limit]:
        out.append(f"  {p['path']}: {p['problem']}")
    out.append("")
    splits = list(r.splits)
    width = max([len(c["name"]) for c in r.classes_table] + [5])
    out.append("Images per class (count, share of the split's usable images):")
    out.append(f"  {'#':>3} {'class':<{width}}" + "".join(f" {sp[:14]:>14}" for sp in splits) + f" {'total':>14}")
    for c in r.classes_table:
        cells = "".join(f" {c['images'][sp]:>6} {c['share'][sp]:6.2f}%" for sp in splits)
        note = "  NO IMAGES" if c["name"] in r.never_present else ""
        out.append(f"  {c['index']:>3} {c['name']:<{width}}{cells} {c['total']:>6} {c['total_share']:6.2f}%{note}")
    if r.never_present:
        out.append("Class folders with no image: " + ", ".join(r.never_present))
    for sp, names in r.missing_per_split.items():
        out.append(f"Classes with no image in {sp}: " + ", ".join(names))
    out.append("")
    d = r.duplicates
    if d["groups"]:
        out.append(f"Duplicate images (same decoded pixels): {len(d['groups'])} group(s), "
                   f"{d['within_split_pairs']} pair(s) within a split, {d['cross_split_pairs']} across splits, "
                   f"{d['groups_with_conflicting_classes']} group(s) under different classes")
        out.append("  pairs per split pair: " + ", ".join(f"{k} {v}" for k, v in d["pairs_per_split_pair"].items()))
        for g in d["groups"][:limit]:
            conflict = f"  (classes {', '.join(g['classes'])})" if g["conflicting_classes"] else ""
            out.append("  " + " = ".join(g["keys"][:EXAMPLES]) + (" ..." if len(g["keys"]) > EXAMPLES else "")
                       + conflict)
    else:
        out.append("Duplicate images: none")
    out += format_bad_inputs(r.bad, limit)
    out.append("")
    out += format_verdict(r)  # type: ignore[arg-type]
    return "\n".join(out)


__all__ = ["ClassScanReport", "ImageSummary", "build_classification_report", "exif_info",
           "format_classification_report", "run_image_workers", "scan_classification", "scan_image", "source_args",
           "suggest_size", "task_args"]
