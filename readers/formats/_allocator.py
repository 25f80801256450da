"""Private: glibc malloc tuning for the pipelines' big blocks (see `tune_allocator`), and
`wipe_on_fork` for free blocks a forked child must not share.

Used by the readers' pipelines and the converter's workers; standard library only.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -3, -4, -8
MALLOC_MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's ceiling for this setting on 64-bit
MALLOC_TRIM_THRESHOLD_BYTES = 256 << 20
_allocator_tuned: bool | None = None
_MADV_WIPEONFORK, _MADV_KEEPONFORK = 18, 19  # Linux >= 4.14, private anonymous memory only
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_madvise = None  # libc madvise, looked up on first use (False: unavailable)


def tune_allocator() -> bool:
    """Stop glibc malloc from handing the pipeline's big blocks back to the kernel.

    A 512x512 pipeline allocates and frees megabyte-sized strings and tensors thousands
    of times a second. With glibc's defaults many of those blocks are returned to the
    kernel (munmap, heap trimming) and faulted in again on the next use, zero-filled
    page by page: on a 2-core VM that doubled the CPU cost per sample (TFRecord: 284
    page faults per sample; NPZ shards, whose 40 MB members are above any mmap
    threshold: 510). This sets, once per process, `M_MMAP_THRESHOLD` = 32 MB,
    `M_TRIM_THRESHOLD` = 256 MB, `M_MMAP_MAX` = 0 (big blocks come from the heap and are
    reused) and `M_ARENA_MAX` = max(4, CPUs), which brought it down to ~20 faults and
    1.5x (TFRecord) to 2x (NPZ) the samples per CPU-second. The price: freed memory
    (up to 256 MB at the top of each malloc arena, and freed big blocks below it) stays
    in the process for reuse instead of being returned to the system.

    Called by `Dataset.tf_dataset` and `Dataset.keras_dataset`. Set the environment
    variable ``IMGSHARD_TUNE_MALLOC=0`` to leave the allocator alone. A no-op (returns
    False) off Linux/glibc.
    """
    global _allocator_tuned
    if _allocator_tuned is not None:
        return _allocator_tuned
    _allocator_tuned = False
    if os.environ.get("IMGSHARD_TUNE_MALLOC", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to tune
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    arenas = max(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 4))
    done = [mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES),
            mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_BYTES),
            mallopt(_M_MMAP_MAX, 0),
            mallopt(_M_ARENA_MAX, arenas)]
    _allocator_tuned = all(done)
    logger.debug("imgshard: glibc malloc tuned for large blocks: %s", _allocator_tuned)
    return _allocator_tuned


def _libc_madvise():
    global _madvise
    if _madvise is None:
        _madvise = False
        if sys.platform.startswith("linux"):
            try:
                fn = ctypes.CDLL(None, use_errno=True).madvise
                fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
                _madvise = fn
            except (OSError, AttributeError):
                pass
    return _madvise


def wipe_on_fork(address: int, nbytes: int, wipe: bool) -> bool:
    """Mark the whole pages of private anonymous memory [address, address + nbytes) so that
    a forked child gets zero pages there instead of sharing them (``MADV_WIPEONFORK``), or,
    `wipe` False, shares them again (``MADV_KEEPONFORK``). Returns whether it was done
    (never off Linux, or on kernels before 4.14).

    Why: after a fork every page the child shares is copy-on-write for both. Rewriting a
    pooled output block then costs, per 4 KiB page, a fault, a copy of the old content
    nobody needs and a TLB flush sent to every other core (measured: rotate=10 float32 +
    one-hot 2.3 -> 3.5 CPU-ms per sample while a forked child lived). Only for memory
    nobody reads (a free pooled block); glibc's chunk headers lie outside the whole pages
    of a chunk's data, so the child's heap stays intact."""
    start = -(-address // _PAGE) * _PAGE
    end = (address + nbytes) // _PAGE * _PAGE
    fn = _libc_madvise() if end > start else False
    return bool(fn) and fn(start, end - start, _MADV_WIPEONFORK if wipe else _MADV_KEEPONFORK) == 0
