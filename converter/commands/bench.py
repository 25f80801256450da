"""`imgshard bench`: measure imgshard against the input pipelines people use today.

Prints a table (median samples/s of interleaved rounds with the warm-up dropped, min-max,
ratio to the raw-PNG tf.data pipeline, bytes read + written per sample and the share of
the memory-bandwidth limit) and the targets of docs/PERFORMANCE.md, and writes every
number as JSON (`python scripts/bench_docs.py bench.json` regenerates the README and
docs/PERFORMANCE.md tables from it). Same code as
`python scripts/bench.py`.
"""

from __future__ import annotations

import argparse
import sys
import time

from converter.options import parse_size


def _size(text: str) -> tuple[int, int]:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _workers(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers must be comma-separated integers, e.g. 1,2. Received: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--workers must be positive integers. Received: {text!r}")
    return values


def _sections(text: str) -> tuple[str, ...]:
    from converter.bench.options import SECTIONS

    values = tuple(v.strip() for v in text.split(",") if v.strip())
    if not values or any(v not in SECTIONS for v in values):
        raise argparse.ArgumentTypeError(f"--only takes a comma-separated subset of {list(SECTIONS)}. Received: {text!r}")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--src", help="CamVid-layout source folder (default: generated 1920x1080 PNG pairs, cached)")
    p.add_argument("--samples", type=int, default=150, help="generated pairs (default 150)")
    p.add_argument("--size", type=_size, default=(512, 512), help="output size HxW (default 512x512)")
    p.add_argument("--batch-size", type=int, default=8, help="batch size of every pipeline (default 8)")
    p.add_argument("--shuffle-buffer", type=int, default=64, help="records in every shuffle buffer (default 64)")
    p.add_argument("--repeats", type=int, default=None,
                   help="kept rounds per reader pipeline, interleaved; one warm-up round runs first and is "
                        "dropped (default 4: 5 rounds; --quick: 1)")
    p.add_argument("--convert-repeats", type=int, default=None,
                   help="interleaved runs per conversion (default 3; --quick: 1)")
    p.add_argument("--min-seconds", type=float, default=2.0, help="minimum length of one reader round (default 2)")
    p.add_argument("--bandwidth-mib", type=int, default=512,
                   help="array size of the memory-bandwidth probe in MiB (default 512)")
    p.add_argument("--workers", type=_workers, default=(), help="converter worker counts, e.g. 1,2 (default 1..cores)")
    p.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True,
                   help="also measure converter peak RSS at 200 and 2,000 samples (default on)")
    p.add_argument("--work-dir", help="keep converted outputs here (default: a temporary folder, removed)")
    p.add_argument("--cache", help="folder for generated sources (default ~/.cache/imgshard)")
    p.add_argument("--json", default="bench.json", help="write every number here (default bench.json)")
    p.add_argument("--only", type=_sections, default=None,
                   help="comma-separated parts to run: convert, read, memory, storage (default: all)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 24 tiny pairs at 64x64, one repeat (numbers not meaningful)")


def options_from_args(args: argparse.Namespace):
    from converter.bench.options import BenchOptions, quick_options

    fields = {
        "src": args.src, "batch_size": args.batch_size, "work_dir": args.work_dir,
    }
    if args.cache:
        fields["cache"] = args.cache
    if args.only:
        fields["sections"] = args.only
    for name in ("repeats", "convert_repeats"):  # given: also in the quick preset (tests count rounds)
        if getattr(args, name) is not None:
            fields[name] = getattr(args, name)
    if args.quick:
        return quick_options(**fields)
    fields.update(samples=args.samples, size=args.size, shuffle_buffer=args.shuffle_buffer,
                  min_seconds=args.min_seconds, workers=args.workers,
                  bandwidth_bytes=args.bandwidth_mib << 20,
                  memory=args.memory)
    return BenchOptions(**fields)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark imgshard against raw-PNG tf.data, PyDataset, Dataset.save/load",
                       description=__doc__)
    add_arguments(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from converter.bench.report import header, table, write_json
    from converter.bench.suite import run_bench

    opts = options_from_args(args)

    start = time.perf_counter()

    def say(message: str) -> None:  # elapsed seconds first: where a run spends its time
        print(f"bench [{time.perf_counter() - start:4.0f} s]: {message}", file=sys.stderr, flush=True)

    result = run_bench(opts, say)
    print(header(result))
    print(table(result))
    if args.json:
        write_json(result, args.json)
        print(f"wrote {args.json}")
    return 0


__all__ = ["add_arguments", "main", "options_from_args", "register"]
