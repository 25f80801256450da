"""Keep freed memory for reuse in converter processes (glibc only; a no-op elsewhere).

Every sample allocates and frees the same few large arrays (a decoded 1920x1080
image is 6 MB, its packed mask 8 MB, Pillow's copy 8 MB). glibc serves blocks over
its mmap threshold with fresh `mmap`s and gives them back with `munmap` when freed,
so each sample page-faults tens of MB of zeroed pages in again: measured here, a
quarter of the CPU time of decode + resize of a 1920x1080 PNG. Raising the mmap
threshold (and the trim threshold with it) makes those blocks come from the heap and
stay there, so the next sample reuses warm pages. The process's peak RSS is what it
would be anyway (the arrays of one sample); it just is not returned between samples.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: Blocks up to this size come from the heap (largest per-sample array: ~24 MB).
MMAP_THRESHOLD_BYTES = 64 << 20
#: Free heap memory kept before glibc trims it back to the OS.
TRIM_THRESHOLD_BYTES = 256 << 20

_done = False


def reuse_freed_memory() -> bool:
    """Tune glibc's malloc for this process once; True when it took effect."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, ...): nothing to tune
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    if not ok:
        log.debug("mallopt refused the thresholds; allocations stay as they are")
    _done = ok
    return ok
