"""Discovered image/mask pairs held compactly: one folder pair's names in one string.

Discovery finds every source pair of a run (millions on large datasets) and the
planner needs each once. A `SourceSample` per pair, with its absolute paths, key and
two stat tuples, costs about 600 bytes; a `SampleBlock` holds one folder pair's
relative image and mask names in one ``\\0``-separated string with their end offsets,
and the (size, mtime_ns) of both files in one int64 array: about 80 bytes per pair
for CamVid-like names. `SampleList` is the read-only sequence of `SourceSample`s the
rest of the converter sees, built on access in discovery's order.
"""

from __future__ import annotations

import bisect
import itertools
import os
from typing import Callable, Iterator, Sequence

import numpy as np

from converter.discover.files import files_for
from converter.discover.layout import BadInput, SourceSample, stat_file
from converter.plan.fingerprint import combine_stats

#: Rows whose stats are turned into Python ints at once while iterating.
_CHUNK = 4096


class SampleBlock:
    """The pairs of one folder pair: ``SourceSample(split, key_prefix + image, images_dir/image,
    masks_dir/mask)`` per (image, mask) relative name pair, in order."""

    __slots__ = ("split", "key_prefix", "image_base", "mask_base", "names", "ends", "stats", "band_map")

    def __init__(self, split: str, key_prefix: str, images_dir: str, masks_dir: str,
                 flat: list[str]) -> None:
        """`flat`: image, mask, image, mask, ... relative names."""
        self.split, self.key_prefix = split, key_prefix
        self.image_base, self.mask_base = os.path.join(images_dir, ""), os.path.join(masks_dir, "")
        self._set(flat)
        self.stats: np.ndarray | None = None  # (n, 4) int64: image size, mtime_ns, mask size, mtime_ns
        self.band_map = None  # band folders (`converter.discover.bands.BandMap`): the other bands' files

    def _set(self, flat: list[str]) -> None:
        self.names = "\0".join(flat)
        self.ends = np.cumsum(np.fromiter((len(s) + 1 for s in flat), np.int64, len(flat))) - 1

    def set_pairs(self, flat: list[str]) -> None:
        """Replace the pairs (image, mask, image, mask, ... relative names), e.g. to drop some."""
        self._set(flat)

    def __len__(self) -> int:
        return len(self.ends) // 2

    def pair(self, i: int) -> tuple[str, str]:
        start = int(self.ends[2 * i - 1]) + 1 if i else 0
        mid = int(self.ends[2 * i])
        return self.names[start:mid], self.names[mid + 1:int(self.ends[2 * i + 1])]

    def pairs(self) -> Iterator[tuple[str, str]]:
        if not len(self):
            return
        it = iter(self.names.split("\0"))
        yield from zip(it, it)

    def check(self, bad: list[BadInput]) -> None:
        """`stat` every file once (`stat_file`): keep the usable pairs with their (size, mtime_ns),
        add the problems of the others to `bad` (image and mask both when both are bad)."""
        stats = np.empty((len(self), 4), np.int64)
        keep = np.ones(len(self), bool)
        image_fs, mask_fs = files_for(self.image_base), files_for(self.mask_base)
        for i, (image, mask) in enumerate(self.pairs()):
            key = self.key_prefix + image
            image_stat, p1 = stat_file(self.image_base + image, key, image_fs)
            if p1 is None and self.band_map is not None:
                image_stat, p1 = self._band_stat(image, image_stat, key)
            mask_stat, p2 = stat_file(self.mask_base + mask, key, mask_fs)
            if p1 is not None or p2 is not None:
                bad.extend(p for p in (p1, p2) if p is not None)
                keep[i] = False
            else:
                stats[i] = image_stat + mask_stat  # type: ignore[operator]
        if not keep.all():
            self._set([name for p, k in zip(self.pairs(), keep) if k for name in p])
            stats = stats[keep]
        self.stats = stats

    def _band_stat(self, image: str, first: tuple[int, int],
                   key: str) -> tuple[tuple[int, int] | None, BadInput | None]:
        """The (size, stamp) of a band-folder sample: every band file's, combined
        (`converter.plan.fingerprint.combine_stats`), so a change to any band file is seen."""
        stats = [first]
        for path in self.band_map.paths(image) or ():
            st, problem = stat_file(path, key)
            if problem is not None:
                return None, problem
            stats.append(st)  # type: ignore[arg-type]
        return combine_stats(stats), None

    def sample(self, i: int) -> SourceSample:
        image, mask = self.pair(i)
        st = None if self.stats is None else self.stats[i].tolist()
        return self._make(image, mask, st)

    def _make(self, image: str, mask: str, st: list[int] | None) -> SourceSample:
        return SourceSample(self.split, self.key_prefix + image, self.image_base + image, self.mask_base + mask, None,
                            None if st is None else (st[0], st[1]), None if st is None else (st[2], st[3]),
                            bands=None if self.band_map is None else self.band_map.paths(image))

    def lookup_batches(self, size: int) -> Iterator[tuple[list[bytes], np.ndarray, str, Callable[[int], SourceSample]]]:
        """(keys as UTF-8, their (n, 4) stats, split, row -> its `SourceSample`) per `size` pairs,
        for the planner's lookup: no `SourceSample` is built for a pair it does not ask for.
        Only after `check` (the stats)."""
        pairs, prefix = self.pairs(), self.key_prefix
        for start in range(0, len(self), size):
            chunk = list(itertools.islice(pairs, size))
            stats = self.stats[start:start + len(chunk)]  # type: ignore[index]

            def sample(i: int, chunk=chunk, stats=stats) -> SourceSample:
                return self._make(chunk[i][0], chunk[i][1], stats[i].tolist())

            yield [(prefix + image).encode("utf-8") for image, _ in chunk], stats, self.split, sample

    def __iter__(self) -> Iterator[SourceSample]:
        pairs = self.pairs()
        for start in range(0, len(self), _CHUNK):
            rows = (self.stats[start:start + _CHUNK].tolist() if self.stats is not None
                    else [None] * min(_CHUNK, len(self) - start))
            for st, (image, mask) in zip(rows, pairs):
                yield self._make(image, mask, st)


class SampleList(Sequence):
    """The discovered samples of a run, block after block (a read-only sequence of `SourceSample`)."""

    def __init__(self, blocks: Sequence[SampleBlock] = ()) -> None:
        self.blocks = [b for b in blocks if len(b)]
        self._starts = np.cumsum([0] + [len(b) for b in self.blocks]).tolist()

    def __len__(self) -> int:
        return self._starts[-1]

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("sample index out of range")
        b = bisect.bisect_right(self._starts, i) - 1
        return self.blocks[b].sample(i - self._starts[b])

    def __iter__(self) -> Iterator[SourceSample]:
        for block in self.blocks:
            yield from block

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __hash__(self) -> int:
        return hash((SampleList, len(self)))

    def __repr__(self) -> str:
        return f"SampleList({len(self)} samples in {len(self.blocks)} folder pair(s))"


__all__ = ["SampleBlock", "SampleList"]
