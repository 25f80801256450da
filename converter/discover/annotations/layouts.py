"""Annotation formats as source layouts: `detect`, `pairs`, `defaults`, as
`converter.discover.layouts` asks every layout (it adds `ANNOTATION_LAYOUTS` to its own)."""

from __future__ import annotations

from dataclasses import dataclass, field

from converter.discover.annotations.base import AnnotationFileError
from converter.discover.annotations.listing import AnnotationBlock, AnnotationSet, Reader
from converter.discover.annotations.registry import READERS
from converter.discover.layout import BadInput, LayoutDefaults
from converter.options import AnnotationOptions, MaskSemantics, SourceSpec


@dataclass
class AnnotationListing:
    """What `Layout.pairs` returns (`converter.discover.layouts.Listing`'s fields)."""

    splits: list[str]
    samples: list[AnnotationBlock]
    bad: list[BadInput] = field(default_factory=list)
    suffixes: tuple[str, str] | None = None
    unpaired_images: int = 0


class AnnotationLayout:
    """A `Layout` over one annotation `Reader`; the last set read is kept for `defaults` and scan."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self.name = reader.name
        self._last: tuple[str, AnnotationSet] | None = None

    def detect(self, root: str) -> str | None:
        return self.reader.detect(root)

    def read(self, root: str, options: AnnotationOptions | None = None) -> AnnotationSet:
        """The files read now (never a cached answer: they may have changed since)."""
        self._last = None
        found = self.reader.read(root, options or AnnotationOptions())
        self._last = (root, found)
        return found

    def last(self, root: str) -> AnnotationSet:
        """What the last `read` of `root` found (discovery's `defaults`, scan), else a read now."""
        return self._last[1] if self._last is not None and self._last[0] == root else self.read(root)

    def pairs(self, root: str, spec: SourceSpec) -> AnnotationListing:
        found = self.read(root, spec.annotations)
        _refuse_duplicate_keys(found)
        return AnnotationListing(list(found.splits), [AnnotationBlock(list(found.samples))], list(found.bad),
                                 None, found.unpaired_images)

    def defaults(self, root: str) -> LayoutDefaults:
        found = self.last(root)
        return LayoutDefaults(MaskSemantics.INDEX, (found.ignore,), False, None, found.class_names)


def _refuse_duplicate_keys(found: AnnotationSet) -> None:
    """Two samples with one key (an image listed twice) would overwrite each other: a named error."""
    seen: dict[str, str] = {}
    for s in found.samples:
        other = seen.setdefault(s.key, s.annotation.where)
        if other != s.annotation.where:
            raise AnnotationFileError(s.annotation.source, f"the image {s.key} is listed twice ({other} and "
                                      f"{s.annotation.where})", "list each image once")


ANNOTATION_LAYOUTS: dict[str, AnnotationLayout] = {name: AnnotationLayout(r) for name, r in READERS.items()}

__all__ = ["ANNOTATION_LAYOUTS", "AnnotationLayout", "AnnotationListing"]
