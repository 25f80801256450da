"""Resolve what a dataset's mask pixels mean: the mask semantics, the class table, the mapping.

Options win. Palette masks with a colour table (``class_dict.csv``, name,r,g,b) are
read by colour: the table names colours, not palette positions (issue 24). What the
options leave open comes next from the layout (`LayoutDefaults`, decided from the files'
evidence in `converter.discover.evidence`: Pascal VOC's classes and 255 void, Cityscapes'
label-id map, ADE20K's reduced zero label, a names file beside the data), then from the
files: a colour table means colour masks; no colour table means index masks. The result is a
fully resolved `LabelOptions` (stored in the manifest) and the class table.
"""

from __future__ import annotations

import logging
import os
import re

import numpy as np

from converter.discover.files import is_file
from converter.discover.classes import class_table_path, load_class_table
from converter.discover.labelmaps import (
    BUILTIN_LABEL_MAPS,
    cityscapes_map,
    index_classes,
    is_colour_table,
    is_id_name_csv,
    load_index_names,
    load_label_map,
)
from converter.discover.evidence import (describe_instances, instance_ids, is_palette, palette_conflict,
                                         palette_order, peek_values, sample_masks, two_level)
from converter.discover.layout import Discovery
from converter.discover.names_files import read_names
from converter.options import ANNOTATION_FORMATS, DEFAULT_MAX_PIXELS, LabelOptions, MaskSemantics, SourceSpec
from converter.transform.decode import DecodeError, MaskArray, decode_mask, read_source
from readers.manifest import ClassInfo

_IGNORE_TARGETS = (255, 65535)
log = logging.getLogger(__name__)


def colour_table(spec: SourceSpec, found: Discovery) -> str | None:
    """The colour table (name,r,g,b) the sources come with, or None."""
    for path in (spec.classes, found.classes_csv):
        if path is not None and is_file(path) and is_colour_table(path):
            return path
    return None


def _peek_mask(mask_path: str) -> MaskArray | None:
    """The first mask, decoded as convert decodes it (plain PNGs without Pillow); None if unreadable."""
    try:
        return decode_mask(read_source(mask_path, mask_path), DEFAULT_MAX_PIXELS)
    except DecodeError:
        return None


def is_colour_mask(mask: MaskArray) -> bool:
    """True when `mask` holds colours (RGB pixels that are not all grey)."""
    if mask.indices is not None:
        return False
    packed = mask.colors()
    return not (np.array_equal(packed >> 16, (packed >> 8) & 255) and np.array_equal(packed >> 16, packed & 255))


class ReadingConflict(ValueError):
    """Two plausible readings of the masks disagree and no rule settles which is meant."""


class InstanceIdMasks(ReadingConflict):
    """Masks that number each image's objects 1..N (instance ids) about to be read as class ids."""


def reads_as_classes(spec: SourceSpec, found: Discovery) -> bool:
    """Whether the masks would be read as class ids with no class table, names or label map of their own
    (where instance-id masks would pass for classes)."""
    d = found.defaults
    return (d.semantics in (None, MaskSemantics.INDEX) and colour_table(spec, found) is None and spec.classes is None
            and d.names_file is None and d.class_names is None and d.label_map is None)


def _check_instance_ids(spec: SourceSpec, given: LabelOptions | None, found: Discovery,
                        resolved: LabelOptions) -> None:
    """Refuse instance-id masks read as class ids (not asked for with --mask-semantics index)."""
    if (given and given.semantics) or resolved.semantics is not MaskSemantics.INDEX or resolved.label_map \
            or not reads_as_classes(spec, found):
        return
    evidence = instance_ids(found.samples)
    if evidence is not None:
        raise InstanceIdMasks(
            f"These masks hold {describe_instances(evidence)}. Read as class ids they would make every object "
            f"number a class. Convert them as object / background with --mask-semantics binary --binary-threshold 1 "
            f"(every id >= 1 is foreground; per-instance ids are not kept), or give --mask-semantics index if the "
            f"values really are classes. Received: index masks, up to {max(evidence['top'])} ids per mask")


def first_mask(found: Discovery) -> MaskArray | None:
    path = next((s.mask for s in found.samples if s.mask), None)
    return _peek_mask(path) if path is not None else None


def auto_semantics(spec: SourceSpec, found: Discovery) -> MaskSemantics:
    """Semantics when the options do not say: palette or colour masks with a colour table by colour
    (the table names colours, not palette positions); else the layout's; else colour with a colour
    table, index without one."""
    table = colour_table(spec, found)
    first = first_mask(found) if table is not None or found.defaults.semantics is None else None
    if table is not None and first is not None and (is_palette(first) or is_colour_mask(first)):
        return MaskSemantics.COLOUR  # the table names colours, whatever the layout's default
    if found.defaults.semantics is not None:
        return found.defaults.semantics
    if table is None:  # colour masks still need their class_dict.csv (named in the error)
        return MaskSemantics.COLOUR if first is not None and is_colour_mask(first) else MaskSemantics.INDEX
    return MaskSemantics.COLOUR


def check_readings(spec: SourceSpec, given: LabelOptions | None, found: Discovery, resolved: LabelOptions) -> None:
    """Convert's refusal of a disagreement no rule settles: palette masks read by colour (not
    asked for) whose used colours the colour table does not name, while every index used is a
    row of it, raise `ReadingConflict` naming the flag that chooses (scan reports it instead); so do
    instance-id masks read as class ids (`InstanceIdMasks`, scan proposes binary at threshold 1)."""
    _check_ignored_levels(found, resolved)
    _check_instance_ids(spec, given, found, resolved)
    table = colour_table(spec, found)
    if (given and given.semantics) or resolved.semantics is not MaskSemantics.COLOUR or table is None:
        return
    first = first_mask(found)
    if first is not None and is_palette(first):
        classes = load_class_table(table)
        _check_palette(first, classes, table)
        if palette_order(first, classes) == "differs":
            log.warning("palette order differs from %s; reading by colour", os.path.basename(table))


def _check_ignored_levels(found: Discovery, resolved: LabelOptions) -> None:
    """Refuse ignore values that are a level of two-level masks (the foreground would become ignore)."""
    ignore = set(resolved.ignore_values or ())
    if resolved.semantics is MaskSemantics.COLOUR or not ignore:
        return
    values = peek_values(sample_masks(found.samples))
    if values is None or not two_level(values):
        return
    hit = sorted(ignore & (values - {0}))
    if hit:
        raise ReadingConflict(
            f"--ignore-index {hit[0]} is one of the two levels of these masks (values {sorted(values)} in the "
            f"masks sampled): the foreground would become ignore, a whole class lost. Masks of two levels are "
            f"binary: give --mask-semantics binary without --ignore-index {hit[0]}. Received: ignore values "
            f"{sorted(ignore)}")


def _check_palette(mask: MaskArray, classes: tuple[ClassInfo, ...], table: str) -> None:
    missing = palette_conflict(mask, classes)
    if not missing:
        return
    listed = ", ".join(f"index {i} = {c} ({n} px)" for i, c, n in missing[:6])
    if all(i < len(classes) for i, _, _ in missing):
        raise ReadingConflict(
            f"{mask.path}: palette mask whose colours {listed} are not in {table}, while its indices are all "
            f"rows of it: the colour and index readings disagree. Choose one: --mask-semantics index (palette "
            f"index i = row i of {os.path.basename(table)}) or --mask-semantics colour (fix the table's colours). "
            f"Received: {len(missing)} unnamed palette colour(s)")


def _label_map(labels: LabelOptions, found: Discovery, reduce: bool):
    """(pairs or None, class names or None, built-in classes or None)."""
    if labels.label_map is not None:
        return labels.label_map, None, None
    source = labels.label_map_file or (found.defaults.label_map if not reduce else None)
    if source is None:
        return None, None, None
    if source in BUILTIN_LABEL_MAPS:
        pairs, classes = cityscapes_map()
        return pairs, None, classes
    pairs, names = load_label_map(source)
    return pairs, names, None


def _names_of(path: str) -> list[str]:
    """--classes FILE of index masks: an ``id,name`` CSV, else a names file (labelme's ``__ignore__``
    is not a class; a data.yaml gives its ``names:``)."""
    return load_index_names(path) if is_id_name_csv(path) else list(read_names(path).names)


#: Class names annotation readers make up where the files name none (YOLO without data.yaml, numeric ClassId).
_PLACEHOLDER = re.compile(r"class_\d+|foreground")


def classes_file_names(path: str, found: Discovery) -> list[str]:
    """The class names of --classes FILE for index masks; a named error where the masks are drawn from
    annotation files in another class order (renaming their classes by row would name every pixel wrongly)."""
    names = _names_of(path)
    if found.layout not in ANNOTATION_FORMATS or found.defaults.class_names is None:
        return names
    drawn = list(found.defaults.class_names)
    if all(_PLACEHOLDER.fullmatch(n) for n in drawn[1:]):  # class_k, foreground: naming them by row is right
        return names
    if names[1:] != drawn[1:]:  # index 0 is background whatever its name
        raise ValueError(
            f"--classes {path}: the {found.layout} annotations are drawn with their own classes, in the order "
            f"{drawn}; the file names {names}. Drop --classes (the annotations name their classes), or give a file "
            f"that lists the same classes in that order. Received: {len(names)} name(s) in another order")
    return names


def _index_names(spec: SourceSpec, labels: LabelOptions, found: Discovery, pairs) -> list[str]:
    table = colour_table(spec, found)
    if table is not None:  # index masks with a class_dict.csv (VOC palettes): row i is class i
        return [c.name for c in load_class_table(table)]
    if spec.classes is not None:
        return classes_file_names(spec.classes, found)
    if found.defaults.names_file is not None:
        return list(read_names(found.defaults.names_file).names)
    if found.defaults.class_names is not None:
        return list(found.defaults.class_names)
    if labels.num_classes is not None:
        return [f"class_{i}" for i in range(labels.num_classes)]
    targets = [t for _, t in pairs or () if t not in _IGNORE_TARGETS]
    if targets:
        return [f"class_{i}" for i in range(max(targets) + 1)]
    raise ValueError("Index masks (pixel value = class id) need their classes: give a names file or an id,name CSV "
                     "with --classes FILE, or --num-classes K for classes class_0..class_{K-1} "
                     "(`imgshard scan SRC` finds K and prints the command).")


def resolve_labels(spec: SourceSpec, labels: LabelOptions | None, found: Discovery
                   ) -> tuple[LabelOptions, tuple[ClassInfo, ...]]:
    """The resolved label options and the class table of a segmentation run (see the module docstring)."""
    labels = labels or LabelOptions()
    d = found.defaults
    semantics = labels.semantics or auto_semantics(spec, found)
    if semantics is MaskSemantics.COLOUR:
        if labels.ignore_values or labels.reduce_zero_label or labels.label_map_file or labels.label_map:
            raise ValueError("--ignore-index, --reduce-zero-label and --label-map apply to index and binary masks, "
                             "but these masks are colour masks (a class_dict.csv is given); add --mask-semantics index "
                             "if their pixel values are class ids.")
        table = colour_table(spec, found) or (spec.classes if spec.classes else class_table_path(spec))
        return LabelOptions.colour_default(), load_class_table(table)
    ignore = labels.ignore_values if labels.ignore_values is not None else d.ignore_values
    if semantics is MaskSemantics.BINARY:
        from converter.transform.semantics import BINARY_CLASSES

        names = read_names(d.names_file).names if d.names_file is not None else ()
        return LabelOptions(MaskSemantics.BINARY, ignore, False, None, None, None, labels.binary_threshold), \
            (index_classes(list(names)) if len(names) == 2 else BINARY_CLASSES)
    reduce = labels.reduce_zero_label if labels.reduce_zero_label is not None else (
        d.reduce_zero_label and labels.label_map is None and labels.label_map_file is None)
    pairs, map_names, builtin = _label_map(labels, found, reduce)
    if builtin is not None and spec.classes is None:
        classes = builtin
    else:
        names = map_names if map_names is not None else _index_names(spec, labels, found, pairs)
        if labels.num_classes is not None and labels.num_classes != len(names):
            raise ValueError(f"--num-classes {labels.num_classes} disagrees with the class table, which names "
                             f"{len(names)} classes. Give one of them.")
        table = colour_table(spec, found)
        classes = load_class_table(table) if table is not None and map_names is None else index_classes(names)
    if pairs is not None:
        beyond = sorted({t for _, t in pairs if t >= len(classes) and t not in _IGNORE_TARGETS})
        if beyond:
            raise ValueError(f"--label-map sends values to class ids {beyond[:8]}, but there are only {len(classes)} "
                             "classes (ids 0..{}); 255 means ignore.".format(len(classes) - 1))
    if len(classes) < 2 and (ignore or reduce or pairs is not None):
        raise ValueError(f"Index masks with one class ({classes[0].name}) and ignore values {list(ignore or ())}: "
                         "every other value became ignore, so a whole class would be lost (nothing to learn). "
                         "Masks of two levels (0 and 1, 255 or 65535) are binary: give --mask-semantics binary, "
                         "or --num-classes K with the real number of classes. Received: --num-classes "
                         f"{labels.num_classes}")
    resolved = LabelOptions(MaskSemantics.INDEX, ignore, bool(reduce), pairs, None,
                            labels.num_classes, labels.binary_threshold)
    return resolved, classes
