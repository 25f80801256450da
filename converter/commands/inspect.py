"""`imgshard inspect OUT`: what a converted dataset holds (from its manifest; no shard is read)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from converter.commands.storage_args import add_storage_option_argument, storage_options


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="describe a converted dataset: splits, shapes, sizes, class shares, history",
                       description=__doc__)
    p.add_argument("out", help="dataset folder (holds imgshard.json), or its s3:// / gs:// URL")
    p.add_argument("--json", action="store_true", help="print JSON on stdout")
    p.add_argument("--color", action=argparse.BooleanOptionalAction, default=None,
                   help="colour swatches in the terminal (default: when stdout is a terminal and NO_COLOR is unset)")
    add_storage_option_argument(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from converter.inspect.describe import describe, format_description

    d = describe(args.out, storage_options=storage_options(args))
    if args.json:
        print(json.dumps(d, indent=1, sort_keys=True))
        return 0
    color = args.color
    if color is None:
        color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    print(format_description(d, color=color))
    return 0
