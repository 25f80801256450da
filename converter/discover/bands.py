"""Band folders: one single-band file per band, in parallel folders, stacked into one
multi-band image (satellite tiles as ``train_red/red_patch_7.TIF``,
``train_green/green_patch_7.TIF``, ... beside ``train_gt/gt_patch_7.TIF``).

The first band folder is the sample's image folder (it pairs with the masks like any
image folder); every other band folder is matched to it by the name tokens that
`converter.discover.content.infer_tokens` finds between the two folders' names
(``red_<name>`` ~ ``green_<name>``). A sample whose band files are not all there is a
bad input naming the band file it lacks. `BandMap.paths` gives a sample's other band
files from its first band's name, so the compact sample lists keep one name per pair.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Sequence

from converter.discover.content import Tokens, bases, infer_tokens
from converter.discover.files import file_names, is_dir, join
from converter.discover.layout import IMAGE_EXTENSIONS, BadInput
from converter.discover.pairing import name_stem


def _stems(folder: str) -> dict[str, str]:
    """stem -> file name of the image files directly in `folder`."""
    out: dict[str, str] = {}
    for name in sorted(file_names(folder)):
        if os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS:
            out.setdefault(name_stem(name), name)
    return out


def _cut(stem: str, prefix: str, suffix: str) -> str | None:
    if stem.startswith(prefix) and stem.endswith(suffix) and len(stem) > len(prefix) + len(suffix):
        return stem[len(prefix):len(stem) - len(suffix)]
    return None


@dataclass(frozen=True)
class Band:
    """One band folder after the first: the tokens that match its names to the first band's."""

    folder: str
    tokens: Tokens  # image_*: the first band's names, mask_*: this band's
    files: dict  # base -> file name in `folder`

    def path(self, first_stem: str) -> str | None:
        base = _cut(first_stem, self.tokens.image_prefix, self.tokens.image_suffix)
        name = self.files.get(base) if base is not None else None
        return None if name is None else join(self.folder, name)

    def expected(self, first_stem: str) -> str:
        base = _cut(first_stem, self.tokens.image_prefix, self.tokens.image_suffix) or first_stem
        return join(self.folder, f"{self.tokens.mask_prefix}{base}{self.tokens.mask_suffix}.*")


@dataclass(frozen=True)
class BandMap:
    """The band folders of one folder pair: the first band's folder and the others."""

    first: str
    others: tuple[Band, ...]

    @classmethod
    def infer(cls, folders: tuple[str, ...]) -> "BandMap":
        for f in folders:
            if not is_dir(f):
                raise FileNotFoundError(f"band folder not found: {f}. Give --bands as folders (relative to SRC).")
        first = _stems(folders[0])
        others = []
        for folder in folders[1:]:
            stems = _stems(folder)
            tokens, _ = infer_tokens(tuple(first), tuple(stems))
            files = {b: stems_name for s, stems_name in stems.items()
                     for b in [_cut(s, tokens.mask_prefix, tokens.mask_suffix)] if b is not None}
            others.append(Band(folder, tokens, files))
        return cls(folders[0], tuple(others))

    def paths(self, image_rel: str) -> tuple[str, ...] | None:
        """The other band files of the sample whose first band is `image_rel` (None: one is missing)."""
        stem = os.path.basename(name_stem(image_rel))
        out = tuple(b.path(stem) for b in self.others)
        return None if any(p is None for p in out) else out  # type: ignore[return-value]

    def missing(self, image_rel: str, key: str) -> BadInput | None:
        stem = os.path.basename(name_stem(image_rel))
        for b in self.others:
            if b.path(stem) is None:
                return BadInput(join(self.first, image_rel), f"band file missing: no {b.expected(stem)}",
                                f"add the band file to {b.folder} or remove the sample's other files", key,
                                "missing_band")
        return None

    def describe(self) -> str:
        return ", ".join(f"{os.path.basename(b.folder)} ({b.tokens.describe()})" for b in self.others)


def band_tokens(images: str, masks: str) -> tuple[str | None, str | None, str, str]:
    """(image suffix, mask suffix, image prefix, mask prefix) pairing the first band folder with
    the masks (``red_<name>`` ~ ``gt_<name>``); (None, None, "", "") when the names already pair."""
    tokens, _ = infer_tokens(tuple(_stems(images)), tuple(_stems(masks)))
    if tokens == Tokens():
        return None, None, "", ""
    return tokens.image_suffix, tokens.mask_suffix, tokens.image_prefix, tokens.mask_prefix


def attach_bands(pairing, folders: tuple[str, ...]) -> None:
    """Give a folder pair's samples their other band files (`BandMap`); a sample lacking one
    becomes a bad input naming it."""
    band_map = BandMap.infer(tuple(folders))
    block = pairing.samples
    keep: list[str] = []
    for image, mask in block.pairs():
        problem = band_map.missing(image, block.key_prefix + image)
        if problem is None:
            keep += (image, mask)
        else:
            pairing.bad.append(problem)
    block.set_pairs(keep)
    block.band_map = band_map


def band_names(folders: tuple[str, ...]) -> tuple[str, ...]:
    """The bands' names for the manifest: their folder names."""
    return tuple(os.path.basename(os.path.normpath(f)) for f in folders)


#: Band names in the order a band-folder stack takes them: red, green, blue first (the order of
#: 38-Cloud's and most RGB+NIR sets), then the others by wavelength.
COLOUR_BANDS = ("red", "green", "blue", "coastal", "yellow", "rededge", "nir", "swir", "swir1", "swir2", "tir")
_BAND_NUMBER = re.compile(r"^(?:b|band)?0*(\d{1,3})(a?)$")


def _band_key(token: str) -> tuple[str, float] | None:
    """("colour", rank) for a colour name, ("number", n) for B02 / band_3 / 8A, None otherwise."""
    if token in COLOUR_BANDS:
        return "colour", float(COLOUR_BANDS.index(token))
    m = _BAND_NUMBER.match(token)
    return ("number", int(m.group(1)) + (0.5 if m.group(2) else 0.0)) if m else None


def spectral_order(folders: Sequence[str]) -> tuple[tuple[str, ...], str]:
    """(the band folders in spectral order, how it was chosen): by the colour names (red, green,
    blue, nir, ...) or band numbers (B02, B03, B04, B08; band_1, ...) their names hold, one such word
    per folder and no two alike; else in folder-name order."""
    keyed = []
    for folder in folders:
        tokens = re.split(r"[^a-z0-9]+", os.path.basename(os.path.normpath(folder)).lower())
        keys = [k for k in (_band_key(t) for t in tokens if t) if k is not None]
        keyed.append(keys[0] if len(keys) == 1 else None)
    kinds = {k[0] for k in keyed if k is not None}
    if None not in keyed and len(kinds) == 1 and len({k[1] for k in keyed}) == len(keyed):
        ordered = tuple(f for _, f in sorted(zip(keyed, folders), key=lambda kf: kf[0][1]))
        how = "colour names: red, green, blue, then by wavelength" if kinds == {"colour"} else "band numbers"
        return ordered, f"spectral order ({how})"
    return tuple(sorted(folders)), "folder-name order (their names say no spectral order: reorder to taste)"


def bases_shared(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """How many names two folders share once their name tokens are cut (scan's band-folder test)."""
    tokens, _ = infer_tokens(a, b)
    return len(bases(a, tokens.image_prefix, tokens.image_suffix) & bases(b, tokens.mask_prefix, tokens.mask_suffix))


__all__ = ["COLOUR_BANDS", "Band", "BandMap", "attach_bands", "band_names", "band_tokens", "bases_shared",
           "spectral_order"]
