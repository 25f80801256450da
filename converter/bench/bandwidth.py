"""The host's memory-copy bandwidth, measured in a fresh process (issue 19).

    python -m converter.bench.bandwidth [--bytes N] [--trials T]

prints one JSON line: the rates (GB/s) of `T` timed `numpy.copyto` of an `N`-byte array
into another (both touched first, so no page faults are timed), their median, min and
max. A rate counts the bytes copied: each is read once and written once, so the memory
traffic is twice the rate. That gives a reader's limit,

    limit (samples/s) = 2 x bandwidth (bytes/s) / (bytes read + written per sample),

the rate at which a reader that did nothing but move its bytes once would run
(`limit_samples_per_s`). A fresh process: the bench's own process holds TensorFlow's
threads and whatever they allocated.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

#: Default array size: far beyond any cache.
PROBE_BYTES = 512 << 20
PROBE_TRIALS = 7


def copy_bandwidth(nbytes: int = PROBE_BYTES, trials: int = PROBE_TRIALS) -> dict:
    """Copy rates (bytes copied per second, as GB/s) of `trials` `np.copyto` of `nbytes`."""
    import numpy as np

    if nbytes < 1 << 20 or trials < 1:
        raise ValueError(f"copy_bandwidth needs nbytes >= 1 MiB and trials >= 1. Received: {nbytes}, {trials}")
    src = np.resize(np.arange(256, dtype=np.uint8), nbytes)  # not constant: no zero-page or dedup tricks
    dst = np.empty_like(src)
    np.copyto(dst, src)  # every page of both faulted in, outside the timing
    rates = []
    for _ in range(trials):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        rates.append(nbytes / (time.perf_counter() - t0) / 1e9)
    return {"bytes": nbytes, "trials_gb_per_s": rates, "median_gb_per_s": statistics.median(rates),
            "min_gb_per_s": min(rates), "max_gb_per_s": max(rates)}


def limit_samples_per_s(bandwidth_gb_per_s: float, bytes_read: int, bytes_written: int) -> float:
    """A reader's bandwidth limit: 2 x copy bandwidth / bytes read + written per sample."""
    traffic = bytes_read + bytes_written
    if traffic <= 0 or not bandwidth_gb_per_s > 0:
        return float("nan")
    return 2 * bandwidth_gb_per_s * 1e9 / traffic


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m converter.bench.bandwidth", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bytes", type=int, default=PROBE_BYTES, help=f"array size (default {PROBE_BYTES})")
    p.add_argument("--trials", type=int, default=PROBE_TRIALS, help=f"timed copies (default {PROBE_TRIALS})")
    args = p.parse_args(argv)
    print(json.dumps(copy_bandwidth(args.bytes, args.trials)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
