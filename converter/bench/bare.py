"""The floor of conversion work, timed in a fresh process set up like a converter worker.

`python -m converter.bench.bare SRC --size 512x512` reads every pair of SRC's first
split and prints one JSON line with wall and CPU seconds of:

* ``decode``: reading and decoding every image and mask once with the converter's
  decoder (`converter.transform.decode`; colour masks to their packed colours, which
  the converter never makes: it decodes them straight into class indices), nothing else;
* ``bare``: the bare work of a conversion: read, decode, resize, colour lookup and
  nearest resize of the class map; no hashing, writing, planning or processes.

It runs in its own process, with the allocator tuned as in a worker
(`readers.formats._allocator.tune_allocator`), so that `imgshard convert --workers 1` differs from it only
by what the tool adds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable


def _source_file(path: str):
    from converter.transform.decode import SourceFile

    with open(path, "rb") as f:
        return SourceFile(path, f.read(), None)  # type: ignore[arg-type]  # no fingerprint: not hashed


def _timed(fn: Callable[[], None]) -> dict[str, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}


def measure(root: str, size: tuple[int, int]) -> dict[str, object]:
    from converter.bench.sources import first_split_pairs
    from converter.discover.classes import load_class_table
    from converter.discover.layouts import discover
    from converter.options import DEFAULT_MAX_PIXELS, Fit, ImageFilter, SourceSpec
    from converter.transform.colormap import ColorMap
    from converter.transform.decode import decode_image, decode_mask
    from converter.transform.resize import plan_geometry, resize_image, resize_nearest
    from readers.formats._allocator import tune_allocator

    tune_allocator()
    found = discover(SourceSpec(root=root))
    _, pairs = first_split_pairs(found.samples)
    cmap = ColorMap(load_class_table(os.path.join(root, "class_dict.csv")))
    cmap.inverted_lut  # built once per worker in the converter too, not per sample

    def decode_only() -> None:
        for image_path, mask_path in pairs:
            decode_image(_source_file(image_path), DEFAULT_MAX_PIXELS)
            mask = decode_mask(_source_file(mask_path), DEFAULT_MAX_PIXELS)
            if mask.rows is not None:  # a colour PNG is only inflated until looked up: unfilter it too
                mask.colors()

    def bare() -> None:
        for image_path, mask_path in pairs:
            image = decode_image(_source_file(image_path), DEFAULT_MAX_PIXELS)
            geom = plan_geometry(image.shape[:2], size, Fit.STRETCH)
            resize_image(image, geom, ImageFilter.BILINEAR)
            classes, _ = cmap.lookup(decode_mask(_source_file(mask_path), DEFAULT_MAX_PIXELS))
            cmap.finish(resize_nearest(classes, geom, cmap.ignore_index), ignore_unknown=True)

    return {"samples": len(pairs), "decode": _timed(decode_only), "bare": _timed(bare)}


def main(argv: list[str] | None = None) -> int:
    from converter.options import parse_size

    p = argparse.ArgumentParser(prog="python -m converter.bench.bare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("--size", default="512x512")
    args = p.parse_args(argv)
    print(json.dumps(measure(args.src, parse_size(args.size))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
