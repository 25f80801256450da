#!/usr/bin/env python
"""Benchmark imgshard against the input pipelines people use today.

Same as `imgshard bench`; see `python scripts/bench.py --help` and docs/PERFORMANCE.md.

    python scripts/bench.py                 # full run (a few minutes), writes bench.json
    python scripts/bench.py --quick         # smoke test, under a minute
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from converter.cli import main  # noqa: E402

if __name__ == "__main__":  # spawn-safe: generated sources use worker processes
    sys.exit(main(["bench", *sys.argv[1:]]))
