"""`imgshard scan` for what mask pixels mean: layout, mask semantics, value histograms, flags.

Workers send, per index or binary mask, the histogram of its pixel values and, for the
usual void values (255, 65535), how many of their pixels touch another value (a thin
border, as VOC draws around objects). The parent resolves the labels exactly as convert
will (`converter.discover.labels.resolve_labels`), filling in what the folders leave
open: the number of classes from the values found, ``--ignore-index 255`` for a void
border, ``--mask-semantics binary`` for masks of two levels (JPEG masks: thresholded at
the mid level, off-level pixels counted). Then it counts class pixels through the same
lookup table convert uses, lists unknown values with their files, and returns the flags
that make convert do what the folders mean.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections import Counter
from typing import Any

import numpy as np

from converter.discover.evidence import describe_instances, instance_ids, two_level
from converter.discover.labels import auto_semantics, colour_table, reads_as_classes, resolve_labels
from converter.discover.layout import BadInput, Discovery
from converter.options import LabelOptions, MaskSemantics, SourceSpec
from converter.transform.decode import MaskArray
from converter.transform.colormap import UnknownColors
from converter.transform.semantics import (
    BinarySemantics,
    IndexSemantics,
    UnknownColorError,
    binary_values,
    make_semantics,
    mask_values,
)
from readers.manifest import ClassInfo
from readers.storage.url import storage_option_flags

VOID_VALUES = (255, 65535)
#: A void value is a "thin border" when at least this share of its pixels touches another value.
THIN_SHARE = 0.5
#: A void value never covers more than this share of all mask pixels (else it is a class) ...
LARGE_SHARE = 0.4
#: ... and, unless it is a thin border, at most this share.
SMALL_SHARE = 0.1
#: Masks of two levels with JPEG noise: binary when this share of pixels is at a level.
BINARY_LEVEL_SHARE = 0.9
#: ... where "at a level" means within this many grey levels of 0 or 255 (JPEG ringing).
JPEG_LEVEL_SLACK = 48


def value_summary(mask: MaskArray, binary: bool) -> tuple[dict[int, int], dict[int, int]]:
    """(value -> pixels, void value -> pixels touching another value) of one mask."""
    values = binary_values(mask) if binary else mask_values(mask)
    hist = np.bincount(values.ravel(), minlength=1)
    counts = {int(v): int(hist[v]) for v in np.nonzero(hist)[0]}
    thin = {}
    for v in VOID_VALUES:
        if counts.get(v):
            at = values == v
            edge = np.zeros(values.shape, bool)
            edge[:, 1:] |= at[:, 1:] & (values[:, :-1] != v)
            edge[:, :-1] |= at[:, :-1] & (values[:, 1:] != v)
            edge[1:, :] |= at[1:, :] & (values[:-1, :] != v)
            edge[:-1, :] |= at[:-1, :] & (values[1:, :] != v)
            thin[v] = int(edge.sum())
    return counts, thin


def _merged(summaries) -> tuple[Counter, Counter, Counter]:
    pixels: Counter = Counter()
    files: Counter = Counter()
    thin: Counter = Counter()
    for s in summaries:
        for v, n in (s.values or {}).items():
            pixels[v] += n
            files[v] += 1
        for v, n in s.thin.items():
            thin[v] += n
    return pixels, files, thin


def _looks_binary(pixels: Counter, jpeg: bool, summaries=()) -> bool:
    total = sum(pixels.values())
    if not total or not pixels:
        return False
    if two_level(pixels, [s.values for s in summaries if s.values]):
        return True
    near = sum(n for v, n in pixels.items() if v <= JPEG_LEVEL_SLACK or 255 - JPEG_LEVEL_SLACK <= v <= 255)
    return jpeg and max(pixels) <= 255 and near >= BINARY_LEVEL_SHARE * total


def void_candidates(pixels: Counter, thin: Counter, summaries, no_table: bool) -> list[int]:
    """Values that look like a void label: a thin border, or (no class table) a small share of
    pixels. Never one of the two values of two-level masks, never a large share (issue 24)."""
    total = sum(pixels.values()) or 1
    if two_level(pixels, [s.values for s in summaries if s.values]) or len(pixels) <= 2:
        return []
    return [v for v in VOID_VALUES if pixels.get(v) and pixels[v] <= LARGE_SHARE * total and (
        thin.get(v, 0) >= THIN_SHARE * pixels[v] or (no_table and pixels[v] <= SMALL_SHARE * total))]


def resolve_for_scan(spec: SourceSpec, labels: LabelOptions, found: Discovery, summaries) -> dict[str, Any]:
    """Resolve labels as convert will, adding what the values show is needed; see the module docstring."""
    pixels, files, thin = _merged(summaries)
    jpeg = any((s.mask_format or "") == "JPEG" for s in summaries)
    flags: list[str] = []
    notes: list[str] = []
    given = labels
    instances = None
    if labels.semantics is None and found.defaults.semantics is None and colour_table(spec, found) is None \
            and _looks_binary(pixels, jpeg, summaries):
        labels = dataclasses.replace(labels, semantics=MaskSemantics.BINARY)
        flags += ["--mask-semantics", "binary"]
    elif labels.semantics is None and reads_as_classes(spec, found):
        instances = instance_ids(found.samples)
    if instances is not None:  # objects numbered per image: foreground / background, every id foreground
        labels = dataclasses.replace(labels, semantics=MaskSemantics.BINARY, binary_threshold=1)
        flags += ["--mask-semantics", "binary", "--binary-threshold", "1"]
        notes.append(describe_instances(instances))
        notes.append("instance ids: every object is stored as class 1 'foreground' (0 background); "
                     "per-instance ids are not kept")
    semantics = labels.semantics or auto_semantics(spec, found)
    candidates = void_candidates(pixels, thin, summaries, given.num_classes is None and spec.classes is None)
    if semantics is MaskSemantics.INDEX and candidates and given.ignore_values is None \
            and not set(candidates) <= set(found.defaults.ignore_values) and given.label_map_file is None \
            and found.defaults.label_map is None:
        labels = dataclasses.replace(labels, ignore_values=tuple(candidates))
        for v in candidates:
            flags += ["--ignore-index", str(v)]
    try:
        resolved, classes = resolve_labels(spec, labels, found)
    except ValueError as e:
        if semantics is not MaskSemantics.INDEX or "need their classes" not in str(e):
            raise
        d = found.defaults
        probe = IndexSemantics((ClassInfo("x", None),) * 65534, dataclasses.replace(
            labels, semantics=MaskSemantics.INDEX,
            ignore_values=labels.ignore_values if labels.ignore_values is not None else d.ignore_values,
            reduce_zero_label=labels.reduce_zero_label if labels.reduce_zero_label is not None
            else d.reduce_zero_label))
        mapped = [probe.target(v) for v in pixels]
        k = max([t for t in mapped if t is not None and t != probe.ignore_index] + [0]) + 1
        labels = dataclasses.replace(labels, num_classes=k)
        flags += ["--num-classes", str(k)]
        notes.append(f"no class table: classes class_0..class_{k - 1} from the values found "
                     "(give names with --classes names.txt, line i = class i)")
        resolved, classes = resolve_labels(spec, labels, found)
    return {"labels": resolved, "classes": classes, "flags": flags, "notes": notes, "pixels": pixels,
            "files": files, "thin": thin, "jpeg": jpeg, "instances": instances}


def apply_labels(info: dict[str, Any], summaries) -> list[BadInput]:
    """Fill each summary's class pixels through convert's lookup table; the unknown-value bad inputs."""
    sem = make_semantics(info["labels"], info["classes"])
    bad = []
    nc = len(info["classes"])
    for s in summaries:
        if s.values is None:
            continue
        hist = s.values
        counts = np.zeros(nc, np.int64)
        unknown = {}
        size = 65536 if max(hist) > 255 else 256
        if isinstance(sem, BinarySemantics):
            kept = [v for v in hist if v not in (info["labels"].ignore_values or ())]
            lut = sem.table(size, max(kept, default=0))[0]
            flags = np.zeros(size, bool)
        else:
            lut, flags = sem.table(size)
        for v, n in hist.items():
            if flags[v]:
                unknown[v] = n
            elif lut[v] < nc:
                counts[lut[v]] += n
        s.class_pixels = tuple(int(c) for c in counts)
        s.unknown_values = unknown
        if unknown and not s.errors:
            e = UnknownColorError(s.mask or s.image, UnknownColors(counts=unknown), sem)
            bad.append(BadInput(e.path, e.reason, e.fix, s.key, e.kind))
    return bad


def labels_section(info: dict[str, Any], found: Discovery, summaries) -> dict[str, Any]:
    """The report's 'labels' part: layout, semantics, value histogram, void candidates, unknown values."""
    resolved: LabelOptions = info["labels"]
    classes = info["classes"]
    sem = make_semantics(resolved, classes)
    pixels, files, thin = info["pixels"], info["files"], info["thin"]
    total = sum(pixels.values()) or 1
    values = []
    for v in sorted(pixels):
        if resolved.semantics is MaskSemantics.BINARY:
            meaning = "ignore" if v in (resolved.ignore_values or ()) else None
        else:
            t = sem.target(v)  # type: ignore[union-attr]
            meaning = "unknown" if t is None else ("ignore" if t == sem.ignore_index else classes[t].name)
        values.append({"value": v, "pixels": pixels[v], "share": round(100.0 * pixels[v] / total, 4),
                       "files": files[v], "class": meaning})
    void = [] if resolved.semantics is not MaskSemantics.INDEX else [{"value": v, "pixels": pixels[v], "touching_other_values": thin.get(v, 0),
             "thin_border": thin.get(v, 0) >= THIN_SHARE * pixels[v]} for v in VOID_VALUES if pixels.get(v)]
    unknown = {}
    for s in summaries:
        for v, n in (getattr(s, "unknown_values", None) or {}).items():
            u = unknown.setdefault(v, {"value": v, "pixels": 0, "files": 0, "examples": []})
            u["pixels"] += n
            u["files"] += 1
            if len(u["examples"]) < 5:
                u["examples"].append(s.key)
    off = None
    if resolved.semantics is MaskSemantics.BINARY and not info.get("instances"):
        levels = (0, 1) if set(pixels) <= {0, 1} else (0, 255)
        off = sum(n for v, n in pixels.items() if v not in levels and v not in (resolved.ignore_values or ()))
    return {"layout": found.layout, "why": found.why, "semantics": resolved.semantics.value,  # type: ignore[union-attr]
            "resolved": resolved.to_json(), "values": values, "void_candidates": void,
            "unknown_values": sorted(unknown.values(), key=lambda u: -u["pixels"]), "off_level_pixels": off,
            "jpeg_masks": info["jpeg"], "flags": info["flags"], "notes": info["notes"],
            "suffixes": list(found.suffixes) if found.suffixes else None, "unpaired_images": found.unpaired_images,
            "instance_ids": info.get("instances")}


def format_labels(sec: dict[str, Any], limit: int = 20) -> list[str]:
    out = [f"Layout: {sec['layout']} ({sec['why']})"]
    if sec["suffixes"]:
        out.append(f"Names: image <stem>{sec['suffixes'][0]}.*, mask <stem>{sec['suffixes'][1]}.* (found from the names)")
    if sec["unpaired_images"]:
        out.append(f"Images without a mask (not converted): {sec['unpaired_images']}")
    r = sec["resolved"]
    detail = []
    if r.get("ignore_values"):
        detail.append("ignore values " + ", ".join(map(str, r["ignore_values"])))
    if r.get("reduce_zero_label"):
        detail.append("reduce-zero-label (0 -> ignore, v -> v-1)")
    if r.get("label_map"):
        detail.append(f"label map of {len(r['label_map'])} ids (unlisted -> ignore)")
    wide = any(v["value"] > 255 for v in sec["values"])
    out.append(f"Mask semantics: {sec['semantics']}" + (" (16-bit values)" if wide else "")
               + (f"; {'; '.join(detail)}" if detail else ""))
    if sec["off_level_pixels"]:
        out.append(f"  {sec['off_level_pixels']} off-level pixel(s) (not 0 or 255"
                   + (", JPEG masks" if sec["jpeg_masks"] else "")
                   + f"): binarized at --binary-threshold {r['binary_threshold']} (v >= it is foreground)")
    out.append(f"Mask values ({len(sec['values'])}):")
    for v in sec["values"][:limit]:
        out.append(f"  {v['value']:>5}  {v['share']:7.3f}%  {v['pixels']:>10} px in {v['files']:>5} file(s) -> "
                   f"{v['class'] if v['class'] is not None else ('foreground' if v['value'] else 'background')}")
    if len(sec["values"]) > limit:
        out.append(f"  ... and {len(sec['values']) - limit} more (see --json)")
    for c in sec["void_candidates"]:
        shape = "a thin border (void around objects)" if c["thin_border"] else "regions"
        out.append(f"Ignore candidate: value {c['value']} in {c['pixels']} px, {shape}")
    for u in sec["unknown_values"][:limit]:
        out.append(f"Unknown value {u['value']}: {u['pixels']} px in {u['files']} file(s), e.g. {u['examples'][0]}")
    out += [f"Note: {n}" for n in sec["notes"]]
    return out


def suggest_size(sizes_wxh: dict[str, int]) -> tuple[str, str | None]:
    """(HxW, hint): the most common size when one size is more common than every other; else
    a size from the median height and the median aspect ratio (multiples of 8)."""
    if not sizes_wxh:
        return "HxW", None
    items = sorted(sizes_wxh.items(), key=lambda kv: -kv[1])
    w, h = (int(x) for x in items[0][0].split("x"))
    if len(items) == 1 or items[0][1] > items[1][1]:
        hint = None if len(items) == 1 else (f"{len(items)} different image sizes; --size {h}x{w} is the most common "
                                            "one, and --fit cover or contain keeps the aspect ratio")
        return f"{h}x{w}", hint
    dims = [tuple(int(x) for x in k.split("x")) for k, n in sizes_wxh.items() for _ in range(n)]
    heights = sorted(d[1] for d in dims)
    aspects = sorted(d[0] / d[1] for d in dims)
    mh = heights[len(heights) // 2]
    aspect = aspects[len(aspects) // 2]
    oh = max(8, round(mh / 8) * 8)
    ow = max(8, round(oh * aspect / 8) * 8)
    return f"{oh}x{ow}", (f"image sizes vary ({len(items)} sizes, none most common); --size {oh}x{ow} keeps the "
                          f"median aspect ratio {aspect:.2f} at the median height; --fit cover or contain keeps "
                          "each image's own aspect")


def source_positional(spec: SourceSpec) -> list[str]:
    """SRC, --spec FILE, or --images/--masks/--split (repeated per folder pair; what comes before OUT)."""
    if spec.spec_file is not None:
        return ["--spec", spec.spec_file]
    if spec.sources:
        return [a for s in spec.sources for a in ("--images", s.images, "--masks", s.masks or "", "--split", s.split)]
    if spec.root is not None:
        return [spec.root]
    return ["--images", spec.images or "", "--masks", spec.masks or "", "--split", spec.split]


def source_args(spec: SourceSpec, found: Discovery | None) -> list[str]:
    """--classes, --layout, suffixes, split lists and --storage-option flags, as given or found
    (after OUT: argparse cannot take options between two positional arguments)."""
    args: list[str] = []
    if spec.classes is not None:
        args += ["--classes", spec.classes]
    if spec.layout is not None and spec.spec_file is None:
        args += ["--layout", spec.layout]
    suffixes = (spec.image_suffix, spec.mask_suffix)
    if suffixes == (None, None) and found is not None and found.suffixes and spec.spec_file is None:
        suffixes = found.suffixes
    if suffixes[0]:
        args += ["--image-suffix", suffixes[0]]
    if suffixes[1] is not None and (suffixes[1] or suffixes[0]):
        args += ["--mask-suffix", suffixes[1]]
    for name, path in spec.split_lists:
        args += ["--split-list", f"{name}={path}"]
    return args + storage_option_flags(spec.storage_options)


def given_label_args(labels: LabelOptions) -> list[str]:
    """The label flags the user gave scan (repeated in the command)."""
    out: list[str] = []
    if labels.semantics is not None:
        out += ["--mask-semantics", labels.semantics.value]
    for v in labels.ignore_values or ():
        out += ["--ignore-index", str(v)]
    if labels.reduce_zero_label is not None:
        out += ["--reduce-zero-label" if labels.reduce_zero_label else "--no-reduce-zero-label"]
    if labels.label_map_file:
        out += ["--label-map", labels.label_map_file]
    if labels.num_classes is not None:
        out += ["--num-classes", str(labels.num_classes)]
    if labels.binary_threshold != 128:
        out += ["--binary-threshold", str(labels.binary_threshold)]
    return out


def quote(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)
