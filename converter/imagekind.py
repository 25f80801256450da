"""What kind of image a dataset stores: the one spec decode, resize, storage and the
readers take (dtype, channels, band names), and the flags that choose it.

`ImageKind` is a frozen option object, part of `converter.options.OutputOptions` (so it
is stored in the manifest's options and compared on incremental runs). The user sets
`mode`, `alpha`, `accept_reduction` and `bands`; `dtype` and `channels` are resolved
from the sources before a run (`converter.transform.kinds.resolve_kind`). The default,
resolved to uint8 with 3 channels, is the dataset every earlier version wrote: its
options omit the entry, so existing datasets keep comparing equal.

Standard library only (options import it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from readers.choice import Choice

#: dtypes an image can be stored in.
IMAGE_DTYPES = ("uint8", "uint16")
#: At most this many channels (bands) per image.
MAX_CHANNELS = 16


class ImageMode(Choice):
    """`--image-mode`: auto (16-bit and multi-band kept as they are, 8-bit grey as one channel, other 8-bit as RGB),
    rgb (8-bit RGB), grey (one channel), keep (every channel and the dtype as in the files)."""

    AUTO = "auto"
    RGB = "rgb"
    GREY = "grey"
    KEEP = "keep"


class AlphaMode(Choice):
    """`--alpha`: drop (the default) or keep an RGBA image's alpha as a fourth channel."""

    DROP = "drop"
    KEEP = "keep"


@dataclass(frozen=True)
class ImageKind:
    """The stored image kind: flags (mode, alpha, accept_reduction, bands) and the
    resolved dtype / channels (None until resolved)."""

    mode: ImageMode = ImageMode.AUTO
    alpha: AlphaMode = AlphaMode.DROP
    #: Accept a conversion that loses precision or channels (16 -> 8 bit, bands dropped).
    accept_reduction: bool = False
    #: Band folders, in channel order (`--bands red,green,blue,nir`); () for one file per image.
    bands: tuple[str, ...] = ()
    dtype: str | None = None
    channels: int | None = None
    #: What an accepted reduction does, said once per dataset (recorded in the manifest).
    reductions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", ImageMode.parse(self.mode, "--image-mode"))
        object.__setattr__(self, "alpha", AlphaMode.parse(self.alpha, "--alpha"))
        if not isinstance(self.accept_reduction, bool):
            raise TypeError(f"--accept-reduction must be a bool. Received: {self.accept_reduction!r}")
        bands = tuple(str(b) for b in self.bands)
        if len(bands) > MAX_CHANNELS or len(set(bands)) != len(bands) or any(not b or "/" in b for b in bands):
            raise ValueError(f"--bands must be 1..{MAX_CHANNELS} distinct folder names, comma-separated. "
                             f"Received: {self.bands!r}")
        object.__setattr__(self, "bands", bands)
        object.__setattr__(self, "reductions", tuple(str(r) for r in self.reductions))
        if self.dtype is not None and self.dtype not in IMAGE_DTYPES:
            raise ValueError(f"image dtype must be one of {IMAGE_DTYPES}. Received: {self.dtype!r}")
        c = self.channels
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= MAX_CHANNELS):
            raise ValueError(f"image channels must be an integer 1..{MAX_CHANNELS}. Received: {c!r}")

    @property
    def resolved(self) -> bool:
        return self.dtype is not None and self.channels is not None

    @property
    def legacy(self) -> bool:
        """uint8 RGB from one file per image: the path every earlier version took."""
        return self.dtype in (None, "uint8") and self.channels in (None, 3) and not self.bands

    @property
    def is_default(self) -> bool:
        return self == ImageKind() or self == ImageKind(dtype="uint8", channels=3)

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode.value, "alpha": self.alpha.value, "accept_reduction": self.accept_reduction,
                "bands": list(self.bands), "dtype": self.dtype, "channels": self.channels,
                "reductions": list(self.reductions)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ImageKind":
        d = dict(d)
        d["bands"] = tuple(d.get("bands") or ())
        d["reductions"] = tuple(d.get("reductions") or ())
        return cls(**d)

    def manifest_entry(self) -> dict[str, Any]:
        """The manifest's `image` fields of this kind (dtype, channels, bands, reductions)."""
        entry: dict[str, Any] = {"channels": self.channels or 3, "dtype": self.dtype or "uint8"}
        if self.bands:
            entry["bands"] = list(self.bands)
        if self.reductions:
            entry["reductions"] = list(self.reductions)
        return entry


__all__ = ["IMAGE_DTYPES", "MAX_CHANNELS", "AlphaMode", "ImageKind", "ImageMode"]
