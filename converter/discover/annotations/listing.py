"""What a reader lists (`AnnotationSet`), held for the planner (`AnnotationBlock`), and the
reader base class with the few questions every format answers."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from converter.discover.files import files_for, is_dir, subfolders
from converter.discover.layout import WELL_KNOWN_SPLITS, BadInput, SourceSample, list_images, stat_file
from converter.discover.annotations.base import Annotation, canonical, ignore_value
from converter.options import AnnotationOptions


@dataclass
class AnnotationSet:
    """A reader's findings: samples in order, problems, classes and what scan reports."""

    splits: list[str]
    samples: list[SourceSample]
    class_names: tuple[str, ...]  # index 0 = background
    why: str
    bad: list[BadInput] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # placeholder category left out, crowd regions, ...
    problems: Counter = field(default_factory=Counter)  # "polygons with < 3 points (dropped)": n, ...
    shapes: Counter = field(default_factory=Counter)  # class name -> shapes
    unpaired_images: int = 0

    @property
    def ignore(self) -> int:
        return ignore_value(len(self.class_names))


class AnnotationBlock:
    """The samples of an `AnnotationSet` as discovery's blocks are (`converter.discover.samplelist`)."""

    def __init__(self, samples: list[SourceSample]) -> None:
        self.samples = samples
        self.stats: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.samples)

    def check(self, bad: list[BadInput]) -> None:
        """`stat` every image once; a sample whose image is unusable is left out (its problem in `bad`)."""
        kept, rows = [], []
        for s in self.samples:
            st, problem = stat_file(s.image, s.key, files_for(s.image))
            if problem is not None:
                bad.append(problem)
                continue
            ann = s.annotation.stat  # type: ignore[union-attr]
            kept.append(s._replace(image_stat=st, mask_stat=ann))
            rows.append(st + ann)  # type: ignore[operator]
        self.samples = kept
        self.stats = np.array(rows, np.int64).reshape(len(kept), 4)

    def sample(self, i: int) -> SourceSample:
        return self.samples[i]

    def __iter__(self) -> Iterator[SourceSample]:
        return iter(self.samples)

    def lookup_batches(self, size: int):
        for start in range(0, len(self.samples), size):
            chunk = self.samples[start:start + size]
            yield ([s.key.encode("utf-8") for s in chunk], self.stats[start:start + len(chunk)],  # type: ignore[index]
                   [s.split for s in chunk], chunk.__getitem__)


def make_sample(split: str, key: str, image: str, fmt: str, source: str, ident: str, doc: dict) -> SourceSample:
    return SourceSample(split, key, image, None, None, None, None, Annotation(fmt, source, ident, canonical(doc)))


def split_name(name: str, default: str = "train") -> str:
    """A split name from a file or folder name: a well-known split token in it, else the name itself."""
    low = name.lower()
    for token in ("train", "validation", "valid", "val", "test"):
        if token in low:
            return token
    clean = "".join(c if c.isalnum() or c in "_." else "_" for c in name).strip("._")
    return clean or default


def split_folders(root: str) -> list[str]:
    """Well-known split folders of `root` (train/, valid/, test/...), in the usual order."""
    dirs = subfolders(root)
    return [d for d in WELL_KNOWN_SPLITS if d in dirs]


def images_by_stem(folder: str) -> dict[str, str]:
    """'<dir>/<stem>' -> relative image name below `folder` (the first name of a stem)."""
    out: dict[str, str] = {}
    for rel in list_images(folder) if is_dir(folder) else []:
        out.setdefault(os.path.splitext(rel)[0], rel)
    return out


class Reader:
    """One annotation format: `detect(root)` -> evidence or None; `read(root, options)` ->
    an `AnnotationSet`; `shapes(doc, height, width, where)` -> (bool mask, value) pairs in
    drawing order, in the worker, at the source image's size."""

    name = ""
    title = ""
    overlap_rule = "file order, later shapes on top"

    def detect(self, root: str) -> str | None:
        raise NotImplementedError

    def read(self, root: str, options: AnnotationOptions) -> AnnotationSet:
        raise NotImplementedError

    def shapes(self, doc: dict, height: int, width: int, where: str):
        raise NotImplementedError


__all__ = ["AnnotationBlock", "AnnotationSet", "Reader", "images_by_stem", "make_sample", "split_folders",
           "split_name"]
