"""`imgshard verify OUT [--deep] [--json]`: check every shard against the manifest.

Exit codes: 0 every check holds; 1 a problem was found (each bad file is named, with
the record where known); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys

from converter.commands.storage_args import add_storage_option_argument, storage_options

EX_VERIFY_FAILED = 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="check every shard against the manifest (size, digest, records; --deep decodes)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="dataset folder (holds imgshard.json), or its s3:// / gs:// URL")
    p.add_argument("--deep", action=argparse.BooleanOptionalAction, default=False,
                   help="also decode every record: shapes, dtypes, class indices, keys (slower)")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    add_storage_option_argument(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from converter.inspect.verify import format_report, verify

    report = verify(args.out, deep=args.deep, storage_options=storage_options(args))
    if args.json:
        print(json.dumps(report.to_json(), indent=1, sort_keys=True))
    else:
        text = format_report(report)
        print(text, file=sys.stdout if report.ok else sys.stderr)
    return 0 if report.ok else EX_VERIFY_FAILED
