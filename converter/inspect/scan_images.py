"""What `scan` says about the images themselves: their kinds (dtype, channels, alpha),
the bits actually used (12 of 16), band files, the kind convert will store, and any
reduction a flag would cause or that convert refuses (issues 24 and 28: no silent loss).

Also finds band folders: sibling folders of the image folder whose names pair with it
by name tokens and whose files have the same size (`imgshard scan` then proposes
``--bands``).
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from typing import Any, Sequence

import numpy as np

from converter.discover.bands import bases_shared, spectral_order
from converter.discover.files import file_names, subfolders
from converter.discover.layout import IMAGE_EXTENSIONS
from converter.imagekind import ImageKind
from converter.transform.decode import DecodeError, SourceFile, decode_image, read_source
from converter.transform.kinds import ImageKindError, SourceKind, decode_native, probe_source, resolve_kind


def decode_for_scan(src: SourceFile, summary: Any, max_pixels: int, bands: Sequence[str] = ()) -> np.ndarray:
    """The image as scan looks at it, and its kind and bits used on `summary`. 8-bit grey
    and RGB decode as convert's fast path does; wider or multi-band images as stored."""
    kind = probe_source(src)
    summary.image_kind = kind
    if kind.dtype == "uint8" and kind.channels <= 3 and not bands:
        summary.image_bits = 8
        return decode_image(src, max_pixels)
    arr, _ = decode_native(src, max_pixels)
    for path in bands:  # band files: the same size as the first band
        more, _ = decode_native(read_source(path, path), max_pixels)
        if more.shape[:2] != arr.shape[:2]:
            raise DecodeError(path, "size_mismatch", f"band file is {more.shape[1]}x{more.shape[0]} but the first "
                              f"band {src.path} is {arr.shape[1]}x{arr.shape[0]}",
                              "every band file of a sample must have the same size")
    summary.band_files = len(bands) + 1 if bands else 0
    top = int(arr.max()) if arr.size and arr.dtype.kind in "ui" else 0
    summary.image_bits = max(top.bit_length(), 1) if arr.dtype.kind in "ui" else None
    return arr


def _kinds(summaries: Sequence[Any]) -> list[SourceKind]:
    return [s.image_kind for s in summaries if getattr(s, "image_kind", None) is not None]


def images_section(summaries: Sequence[Any], requested: ImageKind | None) -> dict[str, Any]:
    """The images' kinds, bits used, and what convert stores under `requested` (or refuses)."""
    requested = requested or ImageKind()
    kinds = _kinds(summaries)
    bands = max((getattr(s, "band_files", 0) for s in summaries), default=0)
    section: dict[str, Any] = {
        "kinds": dict(sorted(Counter(k.describe() for k in kinds).items())),
        "bits_used": max((s.image_bits for s in summaries if getattr(s, "image_bits", None)), default=None),
        "band_files": bands, "alpha_images": sum(k.alpha for k in kinds), "stored": None, "refused": None,
        "reductions": [],
    }
    wide = [k for k in kinds if k.dtype != "uint8"]
    section["bit_depth"] = 16 if any(k.dtype in ("uint16", "int32") for k in wide) else 8
    names = tuple(f"band_{i}" for i in range(bands)) if bands else ()
    try:
        kind = resolve_kind(kinds, requested, names)
    except ImageKindError as e:
        section["refused"] = str(e)
        try:  # refused for a loss a flag accepts: say which
            kind = resolve_kind(kinds, dataclasses.replace(requested, accept_reduction=True), names)
        except ImageKindError:
            return section
        section["needs_accept"] = True
    section["stored"] = {"dtype": kind.dtype, "channels": kind.channels}
    section["reductions"] = list(kind.reductions)
    return section


def image_findings(section: dict[str, Any], requested: ImageKind | None) -> tuple[list[str], list[str], list[str]]:
    """(problems, warnings, notes) of the images section for scan's verdict."""
    problems, warnings, notes = [], [], []
    if section.get("refused"):
        problems.append("images: " + section["refused"])
    for r in section.get("reductions", []):
        warnings.append(f"images: --accept-reduction accepts a loss: {r}")
    stored = section.get("stored")
    if stored and (stored["dtype"] != "uint8" or stored["channels"] != 3):
        bits = section.get("bits_used")
        used = f" ({bits} of {16 if stored['dtype'] == 'uint16' else 8} bits used)" if bits else ""
        notes.append(f"images stored as {stored['dtype']} with {stored['channels']} channel(s){used}, "
                     "without loss")
    if section.get("alpha_images") and (requested or ImageKind()).alpha.value == "drop":
        notes.append(f"{section['alpha_images']} image(s) have an alpha channel: dropped (--alpha keep keeps it)")
    return problems, warnings, notes


def image_verdict(r: Any, problems: list[str], warnings: list[str]) -> tuple[list[str], list[str], list[str], bool]:
    """For scan's verdict: (the command's source arguments, its image flags, notes for the hints,
    whether convert would fail); problems and warnings are appended to the lists given."""
    from converter.inspect.scan_labels import source_positional

    section = r.images.get("kinds", {})
    found_problems, found_warnings, notes = image_findings(section, r.options.image_kind)
    problems += found_problems
    warnings += found_warnings
    source = band_args(r.spec) or source_positional(r.spec)
    return source, image_args(r.options.image_kind, section), notes, bool(found_problems)


def image_args(requested: ImageKind | None, section: dict[str, Any]) -> list[str]:
    """The image flags of scan's convert command: those given, and --accept-reduction where a
    given flag loses precision or channels (said as a problem)."""
    requested = requested or ImageKind()
    args: list[str] = []
    if requested.mode.value != "auto":
        args += ["--image-mode", requested.mode.value]
    if requested.alpha.value != "drop":
        args += ["--alpha", requested.alpha.value]
    if requested.accept_reduction or section.get("needs_accept"):
        args.append("--accept-reduction")
    return args


def band_args(spec: Any) -> list[str]:
    """``--bands A,B,.. --masks M SRC`` when the sources are band folders (given, or found by
    `band_spec_from_tie`); [] otherwise."""
    root = spec.root or "."
    given = [s for s in spec.sources if getattr(s, "bands", ())]
    if not given:
        return []
    folders, masks = given[0].bands, given[0].masks
    rel = [os.path.relpath(f, root) for f in folders]
    return ["--bands", ",".join(rel), "--masks", os.path.relpath(masks or "", root), root]


def format_images(section: dict[str, Any]) -> list[str]:
    if not section:
        return []
    kinds = ", ".join(f"{k} {n}" for k, n in section["kinds"].items()) or "none read"
    line = f"Image kinds: {kinds}"
    if section.get("bits_used"):
        line += f"; bits used: {section['bits_used']} of {section['bit_depth']}"
    if section.get("band_files"):
        line += f"; {section['band_files']} band files per sample"
    out = [line]
    if section.get("band_order"):
        order = section["band_order"]
        out.append(f"Bands: {', '.join(order['bands'])}, in {order['order']}")
    stored = section.get("stored")
    if stored:
        out.append(f"Stored as: {stored['dtype']}, {stored['channels']} channel(s)"
                   + ("; reductions: " + "; ".join(section["reductions"]) if section["reductions"] else ""))
    if section.get("refused"):
        out.append(f"Images refused: {section['refused']}")
    return out


# -- band folders ---------------------------------------------------------------------------------


def _image_stems(folder: str) -> tuple[str, ...]:
    return tuple(sorted(os.path.splitext(n)[0] for n in file_names(folder)
                        if os.path.splitext(n)[1].lower() in IMAGE_EXTENSIONS))


def _first_size(folder: str) -> tuple[int, int] | None:
    """(height, width) of the folder's first image when it is a single band; None otherwise (colour
    photos: a second folder of them is another version, labelme2voc's JPEG overlays or Carvana's
    train_hq/, never a band)."""
    names = sorted(n for n in file_names(folder) if os.path.splitext(n)[1].lower() in IMAGE_EXTENSIONS)
    if not names:
        return None
    path = os.path.join(folder, names[0])
    try:
        arr, _ = decode_native(read_source(path, path), 1 << 31)
    except DecodeError:
        return None
    return arr.shape[:2] if arr.ndim == 2 or arr.shape[2] == 1 else None


def find_band_folders(images: str, masks: str | None) -> list[str]:
    """Sibling folders of `images` (itself first) that hold the same samples as single-band
    files of the same size: names paired by tokens, most names shared; [] when none."""
    parent = os.path.dirname(os.path.normpath(images))
    mine = _image_stems(images)
    size = _first_size(images)
    if not mine or size is None:
        return []
    out = [images]
    for name in sorted(subfolders(parent)):
        folder = os.path.join(parent, name)
        if os.path.normpath(folder) in (os.path.normpath(images), os.path.normpath(masks or "")):
            continue
        stems = _image_stems(folder)
        if len(stems) and bases_shared(mine, stems) * 10 >= len(mine) * 9 and _first_size(folder) == size:
            out.append(folder)
    return out if len(out) > 1 else []


def band_spec_from_tie(spec: Any) -> Any:
    """When pairing by content ties because several image folders pair equally with one mask
    folder and hold the same samples at the same size (band folders), the spec that stacks
    them (bands in the spectral order their names say, else in folder-name order: `spectral_order`);
    None otherwise."""
    from converter.discover.content import candidates, image_folders
    from converter.options import SplitSource

    if spec.root is None or spec.sources:
        return None
    cands = candidates(image_folders(spec.root))
    by_masks: dict[str, list] = {}
    for c in cands:
        by_masks.setdefault(c.masks.path, []).append(c)
    for masks, group in sorted(by_masks.items(), key=lambda kv: -max(c.paired for c in kv[1])):
        best = max(c.paired for c in group)
        tied = sorted(c.images.path for c in group if c.paired == best)
        if len(tied) < 2:
            continue
        folders = find_band_folders(tied[0], masks)
        if sorted(folders) == tied:
            split = group[0].images.split or "train"
            ordered, _ = spectral_order(tied)
            return dataclasses.replace(spec, sources=(SplitSource(split, ordered[0], masks, bands=ordered),))
    return None


def band_order(spec: Any) -> dict[str, Any] | None:
    """The band folders of `spec` (given or found) and how their order reads: the spectral order
    their names say (`converter.discover.bands.spectral_order`), folder-name order, or as given."""
    given = [s for s in spec.sources if getattr(s, "bands", ())]
    if not given:
        return None
    bands = tuple(given[0].bands)
    ordered, how = spectral_order(bands)
    names = [os.path.basename(os.path.normpath(b)) for b in bands]
    return {"bands": names, "order": how if ordered == bands else "as given"}


__all__ = ["band_args", "band_order", "band_spec_from_tie", "decode_for_scan", "find_band_folders", "format_images",
           "image_args", "image_findings", "image_verdict", "images_section"]
