#!/usr/bin/env python
"""Regenerate the README's and docs/PERFORMANCE.md's measured tables from a bench JSON.

    python scripts/bench.py --json bench.json        # the run (see docs/PERFORMANCE.md)
    python scripts/bench_docs.py bench.json          # README.md + docs/PERFORMANCE.md rewritten
    python scripts/bench_docs.py bench.json --note "shared machine, preliminary"

Only the parts between the `<!-- bench:readme -->` / `<!-- bench:performance -->` markers
change (`converter.bench.markdown`).
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from converter.bench.markdown import check_bench_json, update_docs  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", help="the file `imgshard bench --json` wrote")
    p.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    p.add_argument("--performance", default=os.path.join(ROOT, "docs", "PERFORMANCE.md"))
    p.add_argument("--note", default="", help="said in bold after the run line, e.g. 'shared machine, preliminary'")
    args = p.parse_args(argv)
    try:
        with open(args.json, encoding="utf-8") as f:
            data = check_bench_json(json.load(f), args.json)
        written = update_docs(data, readme=args.readme, performance=args.performance, note=args.note)
    except (OSError, ValueError) as e:
        print(f"bench_docs: {e}", file=sys.stderr)
        return 2
    print("rewrote " + ", ".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
