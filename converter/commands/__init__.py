"""One module per CLI subcommand: `register(subparsers)` adds it, `main(args)` runs it."""

from __future__ import annotations

import sys


def progress_bar(total: int, unit: str, desc: str):
    """A tqdm bar on stderr, without tqdm's monitor thread (workers are forked from a single-threaded run)."""
    from tqdm import tqdm

    tqdm.monitor_interval = 0
    return tqdm(total=total, unit=unit, desc=desc, file=sys.stderr, dynamic_ncols=True)
