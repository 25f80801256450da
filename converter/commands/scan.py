"""`imgshard scan SRC`: check raw sources before converting (colours, bad files, duplicates, sizes).

The task is detected as convert detects it (--task overrides; --val-fraction implies
classification). Class folders: images per split and class, classes missing from a
split, bad files, EXIF, duplicates (also under different classes), sizes/modes/formats.

Exit codes: 0 when `imgshard convert` with default flags would succeed (warnings
allowed), 65 when it would fail (the verdict names the flags that make it succeed).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from converter.commands import progress_bar
from converter.commands import add_source_arguments, add_task_arguments, label_options, resolve_task, source_spec
from converter.commands.image_args import add_image_arguments, image_kind
from converter.options import DEFAULT_MAX_PIXELS
from readers.tasks import task_kind

EX_DATAERR = 65


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scan", help="check raw sources before converting: colours, bad files, duplicates, sizes",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_source_arguments(p)
    add_task_arguments(p)
    p.add_argument("--color-tolerance", type=int, default=0, metavar="N",
                   help="judge mask colours as convert --color-tolerance N would (default 0: exact)")
    p.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS, help="as convert: larger images are bad")
    p.add_argument("--workers", type=int, default=0, help="worker processes (default: all cores)")
    p.add_argument("--write-spec", metavar="FILE", default=None,
                   help="write what scan found as a source spec (JSON; TOML when FILE ends in .toml): folder pairs, "
                        "splits, name tokens, mask meaning; `imgshard convert --spec FILE OUT` then converts exactly "
                        "that (docs/LAYOUTS.md)")
    p.add_argument("--write-classes", metavar="FILE", default=None,
                   help="colour masks without a class table: write the colours present as a class_dict.csv "
                        "(name #rrggbb, ascending RGB); convert then takes --classes FILE")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.add_argument("--preview", metavar="FILE", default=None,
                   help="also draw a few source masks under the reading scan chose, with a class legend (PNG)")
    add_image_arguments(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar; print only the verdict")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from converter.discover.files import source_scope

    with source_scope():  # sources in a bucket: one listing for the task detection and the scan
        try:
            return _main(args)
        except Exception as e:
            if args.json:  # a script reading stdout gets JSON on errors too (ties, no layout): no command
                print(json.dumps({"error": {"kind": type(e).__name__, "message": str(e)},
                                  "verdict": {"status": "error", "command": None, "reason": str(e)}},
                                 indent=1, sort_keys=True))
            raise


def _preview(report, path: str, quiet: bool) -> None:
    from converter.inspect.scan import ScanReport
    from converter.inspect.scan_readings import preview_reading

    if not isinstance(report, ScanReport):
        raise ValueError(f"--preview draws masks; these sources are class folders. Use imgshard preview SRC -o {path}. "
                         "Received: --preview with a classification source")
    preview_reading(report, path)
    if not quiet:
        print(f"imgshard scan: masks under the chosen reading drawn to {path}", file=sys.stderr)


def _main(args: argparse.Namespace) -> int:
    from converter.inspect.scan import ScanOptions, format_report, format_verdict, scan

    spec = source_spec(args)
    task = resolve_task(args, spec)
    options = ScanOptions(color_tolerance=args.color_tolerance, max_pixels=args.max_pixels, workers=args.workers,
                          task=task, val_fraction=args.val_fraction,
                          labels=label_options(args) if task_kind(task).dense else None,
                          image_kind=image_kind(args), exif=args.exif)
    unit = task_kind(task).source_unit
    if args.task is None and not args.quiet and not args.json:
        print(f"imgshard scan: task {task.value} (detected from the sources; --task overrides)", file=sys.stderr)
    bar = None

    def on_start(total: int) -> None:
        nonlocal bar
        if not args.quiet and total:
            bar = progress_bar(total, unit, "scan")

    def on_progress(n: int) -> None:
        if bar is not None:
            bar.update(n)

    try:
        report = scan(spec, options, on_start=on_start, on_progress=on_progress)
    finally:
        if bar is not None:
            bar.close()
    spec_line = _write_files(args, task, report)
    if args.preview is not None:
        _preview(report, args.preview, quiet=args.quiet or args.json)
    if args.json:
        print(json.dumps(report.to_json(), indent=1, sort_keys=True))
    elif args.quiet:
        print("\n".join(format_verdict(report)))
    else:
        print(format_report(report))
    if spec_line is not None and not args.json:
        print(f"Spec written to {args.write_spec}; convert exactly it with: {spec_line}")
    return 0 if report.verdict["convert_ok_without_flags"] else EX_DATAERR


def _write_files(args: argparse.Namespace, task, report) -> str | None:
    """--write-classes and --write-spec: the files, and the commands that use them (in the verdict)."""
    if (args.write_spec or args.write_classes) and not task_kind(task).dense:
        raise ValueError(f"--write-spec and --write-classes apply to segmentation sources (image + mask folders). "
                         f"Received: task {task.value}")
    from converter.inspect.scan_colours import write_classes
    from converter.inspect.scan_spec import write_scan_spec

    census = bool(getattr(report, "labels", {}).get("classes_from_colours"))
    classes_file = args.write_classes
    if classes_file is None and census and args.write_spec is not None:
        classes_file = os.path.splitext(args.write_spec)[0] + ".classes.csv"  # beside the spec, named in it
    if classes_file is not None:
        if not census:
            raise ValueError(f"--write-classes {classes_file}: writes the colours present of colour masks without a "
                             "class table; these sources have their classes already. Received: "
                             f"{report.labels.get('semantics')} masks")
        write_classes(classes_file, report.classes)
        after = report.verdict.get("command_after_write")
        if after:
            report.verdict["command"] = after + " --classes " + shlex.quote(classes_file)
    if args.write_spec is None:
        return None
    line = write_scan_spec(report, args.write_spec, classes_file)
    report.verdict["spec_command"] = line
    return line
