"""`imgshard scan`: where the classes come from, and the cross-check of plausible readings.

On a few masks spread over the dataset, the class map under the reading convert will use
is compared with each other plausible reading of the same files (issue 24):

* palette masks with a colour table: by colour (palette index -> colour -> table row) vs
  by palette index (index i = row i); they agree only when the palette lists the table's
  colours in table order;
* masks of two levels (0/1, 0/255, 0/65535, 8- and 16-bit files mixed): binary vs the raw
  values as class ids;
* a label map (Cityscapes label ids): mapped ids vs the raw ids.

Each check reports the pixels and files where the readings differ and the rule that settles
it; one no rule settles is a problem of the verdict (convert refuses it, naming the flag).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from converter.discover.evidence import is_palette, palette_order, peek_mask, sample_masks, spread, two_level
from converter.discover.classes import load_class_table
from converter.discover.labels import colour_table
from converter.discover.layout import Discovery
from converter.options import LabelOptions, MaskSemantics, SourceSpec
from converter.transform.colormap import ColorMap
from converter.transform.semantics import make_semantics
from readers.manifest import ClassInfo

#: Masks decoded for the cross-check.
CHECK_MASKS = 8


def classes_from(spec: SourceSpec, found: Discovery, resolved: LabelOptions, classes, flags: list[str]) -> str:
    """Where the class table comes from, for people."""
    table = colour_table(spec, found)
    if resolved.semantics is MaskSemantics.COLOUR:
        return f"the colour table {os.path.basename(table or spec.classes or 'class_dict.csv')} ({len(classes)} classes)"
    if spec.classes is not None:
        return f"--classes {spec.classes} ({len(classes)} classes)"
    if "--num-classes" in flags or (resolved.num_classes is not None and found.defaults.names_file is None):
        base = found.defaults.classes_from or "the mask values present, class_0.. (no names file beside the data)"
        return f"{base}; K = max value + 1 = {len(classes)} (names: --classes names.txt, line i = class i)"
    if resolved.semantics is MaskSemantics.BINARY and resolved.binary_threshold == 1 and "--binary-threshold" in flags:
        return "instance ids numbered per mask: background (0) and foreground (every id >= 1)"
    if resolved.semantics is MaskSemantics.BINARY:
        names = [c.name for c in classes]
        named = f"; names from {os.path.basename(found.defaults.names_file or '')}" \
            if names != ["background", "foreground"] else ""
        text = found.defaults.classes_from
        if found.defaults.two_level:
            return text + (named if named and named[len("; names from "):] not in text else "")
        return "masks of two levels: " + (f"names {names}{named}" if named else "background and foreground")
    if table is not None and resolved.semantics is MaskSemantics.INDEX:
        return f"the rows of {os.path.basename(table)} by position (--mask-semantics index)"
    return found.defaults.classes_from or f"{len(classes)} classes"


def _check(name: str, chosen: str, other: str) -> dict[str, Any]:
    return {"check": name, "chosen": chosen, "other": other, "pixels": 0, "files": 0, "sampled": 0,
            "unknown_pixels": 0, "settled_by": None}


def _palette_check(masks, table: tuple[ClassInfo, ...], table_path: str, resolved: LabelOptions,
                   given: LabelOptions) -> dict[str, Any] | None:
    palettes = [m for m in masks if is_palette(m)]
    if not palettes:
        return None
    chosen = "colour" if resolved.semantics is MaskSemantics.COLOUR else "palette index"
    c = _check("palette", chosen, "palette index" if chosen == "colour" else "colour")
    cmap = ColorMap(table, 0)
    top = max(int(m.indices.max()) for m in palettes)
    for m in palettes:
        by_colour = cmap.lookup(m, stats=False)[0].astype(np.int64)
        differ = int(np.count_nonzero(by_colour != m.indices))
        c["sampled"] += 1
        c["pixels"] += differ
        c["files"] += differ > 0
        c["unknown_pixels"] += int(np.count_nonzero(by_colour >= len(table)))
    c["palette_order"] = "table order" if all(palette_order(m, table) == "table order" for m in palettes) \
        else "differs"
    name = os.path.basename(table_path)
    if given.semantics is not None:
        c["settled_by"] = f"--mask-semantics {given.semantics.value} (given)"
    elif chosen == "colour" and not c["unknown_pixels"]:
        c["settled_by"] = f"{name} names colours, not palette positions"
    elif chosen == "colour" and top >= len(table):  # unknown colours: the usual unknown-colour report
        c["settled_by"] = f"palette indices up to {top} are beyond the {len(table)} rows of {name}: not class ids"
    return c


def _binary_check(masks, pixels, summaries, resolved: LabelOptions, given: LabelOptions) -> dict[str, Any] | None:
    if resolved.semantics not in (MaskSemantics.BINARY, MaskSemantics.INDEX) or not pixels \
            or not two_level(pixels, [s.values for s in summaries if getattr(s, "values", None)]):
        return None
    chosen = resolved.semantics.value  # type: ignore[union-attr]
    c = _check("two levels", chosen, "index" if chosen == "binary" else "binary")
    for m in masks:
        if m.indices is None:
            continue
        differ = int(np.count_nonzero(m.indices > 1))
        c["sampled"] += 1
        c["pixels"] += differ
        c["files"] += differ > 0
    if given.semantics is not None:
        c["settled_by"] = f"--mask-semantics {given.semantics.value} (given)"
    elif chosen == "binary" or not c["pixels"]:
        c["settled_by"] = "masks of two levels are binary (0 background, the other level foreground)"
    return c


def _ignored_level_check(masks, pixels, summaries, resolved: LabelOptions) -> dict[str, Any] | None:
    """Ignore values that are a level of two-level masks: a class turned into ignore (never settled)."""
    per_file = [s.values for s in summaries if getattr(s, "values", None)]
    hit = sorted(set(resolved.ignore_values or ()) & (set(pixels or ()) - {0}))
    if resolved.semantics is MaskSemantics.COLOUR or not hit or not two_level(pixels, per_file):
        return None
    c = _check("ignored level", f"ignore {hit[0]}", "binary")
    for m in masks:
        if m.indices is None:
            continue
        differ = int(np.count_nonzero(np.isin(m.indices, hit)))
        c["sampled"] += 1
        c["pixels"] += differ
        c["files"] += differ > 0
    c["flag"] = f"--mask-semantics binary without --ignore-index {hit[0]}"
    return c


def _label_map_check(masks, resolved: LabelOptions, classes, found: Discovery, given: LabelOptions):
    if resolved.semantics is not MaskSemantics.INDEX or resolved.label_map is None:
        return None
    c = _check("label map", "label map", "raw ids")
    sem = make_semantics(resolved, classes)
    for m in masks:
        if m.indices is None:
            continue
        lut = sem.table(256 if m.indices.dtype == np.uint8 else 65536)[0]  # type: ignore[union-attr]
        differ = int(np.count_nonzero(lut[m.indices] != m.indices))
        c["sampled"] += 1
        c["pixels"] += differ
        c["files"] += differ > 0
    c["settled_by"] = ("--label-map (given)" if given.label_map_file or given.label_map
                       else f"the {found.layout} layout's label map")
    return c


def readings_section(spec: SourceSpec, found: Discovery, resolved: LabelOptions, classes, given: LabelOptions,
                     flags: list[str], pixels=None, summaries=()) -> dict[str, Any]:
    """{'classes_from', 'readings', 'notes'} for the report's labels section."""
    paths = sample_masks(found.samples, CHECK_MASKS)
    masks = [m for m in (peek_mask(p) for p in paths) if m is not None]
    table_path = colour_table(spec, found)
    checks = []
    if table_path is not None:
        checks.append(_palette_check(masks, load_class_table(table_path), table_path, resolved, given))
    checks.append(_binary_check(masks, pixels, summaries, resolved, given))
    checks.append(_label_map_check(masks, resolved, classes, found, given))
    checks.append(_ignored_level_check(masks, pixels, summaries, resolved))
    checks = [c for c in checks if c is not None]
    notes = []
    for c in checks:
        if c["check"] == "palette" and c["palette_order"] == "differs" and c["chosen"] == "colour":
            notes.append(f"palette order differs from {os.path.basename(table_path or '')}; reading by colour")
    return {"classes_from": classes_from(spec, found, resolved, classes, flags), "readings": checks,
            "reading_notes": notes}


def format_readings(sec: dict[str, Any]) -> list[str]:
    out = []
    if sec.get("classes_from"):
        out.append(f"Classes from: {sec['classes_from']}")
    out += [f"Note: {n}" for n in sec.get("reading_notes", [])]
    for c in sec.get("readings", []):
        where = f"differ on {c['pixels']} px in {c['files']} of {c['sampled']} sampled mask(s)" if c["pixels"] \
            else f"agree on {c['sampled']} sampled mask(s)"
        settled = f"settled: {c['settled_by']}" if c["settled_by"] else "NOT SETTLED"
        out.append(f"Readings: {c['chosen']} (chosen) vs {c['other']}: {where}; {settled}")
    return out


def reading_problems(sec: dict[str, Any]) -> list[str]:
    """The verdict's problems: readings that disagree with no rule to settle them."""
    out = []
    for c in sec.get("readings", []):
        if c["check"] == "ignored level" and c["pixels"]:
            out.append(f"{c['chosen']} turns a level of two-level masks into ignore ({c['pixels']} px in "
                       f"{c['files']} sampled mask(s)): a whole class would be lost; use {c['flag']}")
        elif c["pixels"] and not c["settled_by"]:
            flag = "--mask-semantics index" if c["check"] == "palette" else "--mask-semantics binary"
            out.append(f"the {c['chosen']} and {c['other']} readings differ on {c['pixels']} px in {c['files']} "
                       f"sampled mask(s) ({c['unknown_pixels']} px of colours the table does not name) and no rule "
                       f"settles it: choose with {flag} or --mask-semantics colour")
    return out


def scan_labels_options(given: LabelOptions | None, flags: list[str]) -> LabelOptions:
    """The label options convert gets from scan's command: `given` plus scan's label flags."""
    import dataclasses

    labels = given or LabelOptions()
    ignore = list(labels.ignore_values or ())
    for flag, value in zip(flags, flags[1:]):
        if flag == "--mask-semantics":
            labels = dataclasses.replace(labels, semantics=MaskSemantics.parse(value, flag))
        elif flag == "--ignore-index":
            ignore.append(int(value))
        elif flag == "--num-classes":
            labels = dataclasses.replace(labels, num_classes=int(value))
        elif flag == "--binary-threshold":
            labels = dataclasses.replace(labels, binary_threshold=int(value))
    return dataclasses.replace(labels, ignore_values=tuple(ignore)) if ignore else labels


def preview_reading(report, out_png: str, n: int = 4):
    """`scan --preview FILE`: `n` source masks spread over the dataset, drawn under the reading
    scan chose (its flags applied), with the class legend."""
    from converter.inspect.preview import PreviewOptions, preview_sources
    from converter.options import Task

    keys = spread(sorted(s.key for s in report.summaries if not s.errors and s.mask), n)
    if not keys:
        raise ValueError(f"scan --preview {out_png}: no readable image/mask pair to draw. "
                         f"Received: {len(report.summaries)} pair(s), all bad")
    labels = scan_labels_options(report.options.labels, list(report.labels.get("flags", [])))
    return preview_sources(report.spec, out_png, PreviewOptions(n=len(keys), keys=tuple(keys),
                                                                color_tolerance=report.options.color_tolerance),
                           max_pixels=report.options.max_pixels, task=Task.SEGMENTATION, labels=labels)


__all__ = ["classes_from", "format_readings", "preview_reading", "reading_problems", "readings_section",
           "scan_labels_options"]
