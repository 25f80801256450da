"""`imgshard compact OUT [--target-shard-size SIZE]`: merge the small shards nightly runs leave.

Copies the records of each split's small shards into full shards (no source is read),
publishes the new manifest atomically, then deletes the old shards. Safe to kill at any
moment and to run from cron after `convert` (it takes the same output lock: exit 75
while another run holds it). Exit codes as `convert`: 0 done (also "nothing to
compact"), 1 error, 74 output I/O error, 75 locked.
"""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compact", help="merge small shards into full ones (copies records; cron-safe)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="dataset folder (holds imgshard.json)")
    p.add_argument("--target-shard-size", default="128MB",
                   help="uncompressed size of a merged shard (default 128MB, as convert's --shard-size); "
                        "shards under half of it are merged")
    p.add_argument("--workers", type=int, default=0, help="worker processes (default: all cores)")
    p.add_argument("-q", "--quiet", action="store_true", help="no summary")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from converter.run.compact import compact
    from converter.options import parse_bytes

    from readers.storage import is_remote, local_path

    if args.workers < 0:
        raise ValueError(f"--workers must be an integer >= 0 (0 = all cores). Received: {args.workers}")
    if is_remote(args.out):
        raise ValueError(f"imgshard compact works on local folders only (not yet on buckets). Received: {args.out}. "
                         "To regroup the small shards of a dataset in a bucket, re-convert it with --rebuild.")
    result = compact(local_path(args.out), parse_bytes(args.target_shard_size), workers=args.workers)
    if not args.quiet:
        if result.published:
            records = sum(s.records for s in result.written)
            print(f"Compacted {len(result.dropped)} small shard(s) into {len(result.written)} "
                  f"({records} record(s)) in {result.seconds:.1f} s -> {result.out_dir}", file=sys.stderr)
        else:
            print(f"Nothing to compact in {result.out_dir}: no two small shards in a split.", file=sys.stderr)
    return 0
