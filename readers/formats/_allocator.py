"""Private: glibc malloc tuning for the pipelines' big blocks (see `tune_allocator`).

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
