"""`imgshard`: argparse subcommands. Each command module has `register(subparsers)` and `main(args)`.

The CLI only parses, reports and sets exit codes; the work lives in the stage modules.
Exit codes: 0 success, 1 unexpected error, 2 bad arguments, 65 bad input data,
69 Dask backend unavailable, 74 output I/O error (disk full), 75 another run holds
the output folder.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

# The converter never multiplies matrices: keep OpenBLAS (loaded with NumPy) from
# starting a thread pool, so `convert` runs single-threaded and may fork its workers,
# which then start in milliseconds (`converter.run.fork`). Set before NumPy loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from converter import __version__  # noqa: E402 - after the environment is set

#: Subcommand modules, in the order `imgshard --help` lists them.
COMMANDS = ("convert", "compact", "verify", "scan", "inspect", "preview", "bench")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The `imgshard` parser; with `only`, just that subcommand's (the others' modules stay unimported)."""
    parser = argparse.ArgumentParser(
        prog="imgshard",
        description="Convert image/mask folders once into sharded TFRecord or NPZ files, and read them fast.",
    )
    parser.add_argument("--version", action="version", version=f"imgshard {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in (only,) if only in COMMANDS else COMMANDS:
        try:
            module = importlib.import_module(f"converter.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"converter.commands.{name}":
                continue  # command not built yet
            raise
        module.register(sub)
    return parser


def _command_named(argv: list[str]) -> str | None:
    """The subcommand argv runs (its first word that is not an option), or None."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # Import only the command that runs: each command module pulls in its stage (about
    # 20 ms of start-up per command, paid by every `convert` a cron job starts).
    parser = build_parser(only=_command_named(argv))
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="imgshard: %(levelname)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("imgshard: interrupted; nothing was published.", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `imgshard inspect OUT | head`: the reader went away; that is not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # report, with the exit code the error carries
        code = getattr(e, "exit_code", None)
        if code is None:
            from readers.storage.store import StorageError
            from readers.storage.url import StorageURLError

            if isinstance(e, StorageURLError):  # an unknown scheme, a URL without a bucket: bad arguments
                code = 2
            elif isinstance(e, (ValueError, FileNotFoundError, KeyError, TypeError, StorageError)):
                code = 1
            else:
                raise
        print(f"imgshard {args.command}: error: {e}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
