"""The annotation readers, by name, and the one call the worker makes: `rasterize`.

Each format is one module with a `Reader` (`converter.discover.annotations.listing`);
adding a format is one module and one entry in `READERS` (and its name in
`converter.options.ANNOTATION_FORMATS`).
"""

from __future__ import annotations

import json

import numpy as np

from converter.discover.annotations.base import Annotation, canonical, check_size, paint_all
from converter.discover.annotations.coco import Coco
from converter.discover.annotations.cvat import Cvat
from converter.discover.annotations.instances import InstanceMasks
from converter.discover.annotations.labelme import LabelMe
from converter.discover.annotations.listing import Reader
from converter.discover.annotations.rlecsv import RleCsv
from converter.discover.annotations.yolo import Yolo
from converter.transform.decode import DecodeError

READERS: dict[str, Reader] = {r.name: r for r in (Coco(), Yolo(), LabelMe(), Cvat(), InstanceMasks(), RleCsv())}


def reader_for(name: str) -> Reader:
    try:
        return READERS[name]
    except KeyError:
        raise ValueError(f"annotation format must be one of {sorted(READERS)}. Received: {name!r}") from None


def detect_annotations(root: str) -> list[tuple[Reader, str]]:
    """(reader, evidence) of every annotation format found in `root`, in `READERS` order."""
    return [(r, why) for r in READERS.values() for why in [r.detect(root)] if why is not None]


def rasterize_canvas(annotation: Annotation, height: int, width: int):
    """The painted `Canvas` of a sample's annotations at the image's size (`DecodeError` when unusable)."""
    return rasterize_read(annotation, height, width)[0]


def rasterize_read(annotation: Annotation, height: int, width: int):
    """(`Canvas`, the annotation as its files were read): a reader that reads files in the worker
    (instance masks) puts the size and stamp of the read whose bytes it painted in the document, so
    the fingerprint recorded is that version's; unchanged, the annotation itself (its exact bytes)."""
    doc = json.loads(annotation.payload)
    check_size(doc, height, width, annotation.where)
    shapes = reader_for(annotation.format).shapes(doc, height, width, annotation.where)
    try:
        canvas = paint_all(height, width, doc, shapes)
    except DecodeError:
        raise
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, MemoryError) as e:
        raise DecodeError(annotation.where, "bad_annotation", f"cannot rasterize: {e}",
                          "fix or remove the annotation") from e
    if doc == json.loads(annotation.payload):
        return canvas, annotation
    return canvas, annotation._replace(payload=canonical(doc))


def rasterize(annotation: Annotation, height: int, width: int) -> np.ndarray:
    """(height, width) class values of a sample's annotations (the ignore value where ignored)."""
    return rasterize_canvas(annotation, height, width).values

__all__ = ["READERS", "detect_annotations", "rasterize", "rasterize_canvas", "rasterize_read", "reader_for"]
