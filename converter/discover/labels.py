"""Resolve what a dataset's mask pixels mean: the mask semantics, the class table, the mapping.

Options win; what they leave open comes from the layout (`LayoutDefaults`: VOC index
masks with 255 void and the VOC classes, Cityscapes' label-id map, ADE20K's reduced
zero label, labelme's ``class_names.txt``), then from the files: a colour table
(``class_dict.csv``, name,r,g,b) means colour masks, unless the masks are palette
images with the VOC colour map; no colour table means index masks. The result is a
fully resolved `LabelOptions` (stored in the manifest) and the class table.
"""

from __future__ import annotations


import numpy as np

from converter.discover.files import is_file
from converter.discover.classes import class_table_path, load_class_table
from converter.discover.labelmaps import (
    BUILTIN_LABEL_MAPS,
    cityscapes_map,
    index_classes,
    is_colour_table,
    load_index_names,
    load_label_map,
    voc_palette_bytes,
)
from converter.discover.layout import Discovery
from converter.options import DEFAULT_MAX_PIXELS, LabelOptions, MaskSemantics, SourceSpec
from converter.transform.decode import DecodeError, MaskArray, decode_mask, palette_table, read_source
from readers.manifest import ClassInfo

#: Palette entries compared to decide that a P mask uses the VOC colour map.
VOC_PALETTE_CHECK = 21
_IGNORE_TARGETS = (255, 65535)


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


def has_voc_palette(mask: MaskArray) -> bool:
    """True when `mask` is a palette mask whose colours are the VOC colour map (grey masks are not)."""
    if mask.indices is None or mask.table is None:
        return False
    voc = palette_table(voc_palette_bytes(VOC_PALETTE_CHECK))[:VOC_PALETTE_CHECK]
    return bool(np.array_equal(mask.table[:VOC_PALETTE_CHECK], voc))


def is_colour_mask(mask: MaskArray) -> bool:
    """True when `mask` holds colours (RGB pixels that are not all grey)."""
    if mask.indices is not None:
        return False
    packed = mask.colors()
    return not (np.array_equal(packed >> 16, (packed >> 8) & 255) and np.array_equal(packed >> 16, packed & 255))


def auto_semantics(spec: SourceSpec, found: Discovery) -> MaskSemantics:
    """Semantics when neither options nor the layout say: colour with a colour table, except
    palette masks with the VOC colour map; index without one."""
    if found.defaults.semantics is not None:
        return found.defaults.semantics
    path = next((s.mask for s in found.samples if s.mask), None)
    first = _peek_mask(path) if path is not None else None
    if colour_table(spec, found) is None:  # colour masks still need their class_dict.csv (named in the error)
        return MaskSemantics.COLOUR if first is not None and is_colour_mask(first) else MaskSemantics.INDEX
    return MaskSemantics.INDEX if first is not None and has_voc_palette(first) else MaskSemantics.COLOUR


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


def _index_names(spec: SourceSpec, labels: LabelOptions, found: Discovery, pairs) -> list[str]:
    table = colour_table(spec, found)
    if table is not None:  # index masks with a class_dict.csv (VOC palettes): row i is class i
        return [c.name for c in load_class_table(table)]
    if spec.classes is not None:
        return load_index_names(spec.classes)
    if found.defaults.names_file is not None:
        return load_index_names(found.defaults.names_file)
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

        return LabelOptions(MaskSemantics.BINARY, ignore, False, None, None, None, labels.binary_threshold), \
            BINARY_CLASSES
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
    resolved = LabelOptions(MaskSemantics.INDEX, ignore, bool(reduce), pairs, None,
                            labels.num_classes, labels.binary_threshold)
    return resolved, classes
