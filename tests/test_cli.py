"""`imgshard` itself: the parser imports only the command that runs; help still lists them all."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from converter.cli import COMMANDS, _command_named, build_parser, main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("argv, expected", [
    (["convert", "SRC", "OUT"], "convert"),
    (["-v", "scan", "SRC"], "scan"),
    (["-vv", "verify", "--deep", "OUT"], "verify"),
    (["--help"], None),
    (["convrt", "SRC"], None),
    ([], None),
])
def test_command_named_is_the_first_word_that_is_not_an_option(argv, expected):
    assert _command_named(argv) == expected


def test_only_the_named_command_is_registered():
    parser = build_parser(only="inspect")
    sub = next(a for a in parser._actions if a.dest == "command")
    assert list(sub.choices) == ["inspect"]
    full = build_parser()
    assert list(next(a for a in full._actions if a.dest == "command").choices) == list(COMMANDS)


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_a_misspelt_command_names_every_choice(capsys):
    with pytest.raises(SystemExit) as e:
        main(["convrt", "SRC", "OUT"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'convrt'" in err and "'convert'" in err and "'preview'" in err


def test_convert_does_not_import_the_other_commands():
    """What every cron-started `imgshard convert` pays for at start-up (issue 4: tool overhead)."""
    code = (
        "import sys\n"
        "from converter.cli import build_parser\n"
        "args = build_parser(only='convert').parse_args(['convert', 'SRC', 'OUT', '--size', '64x64'])\n"
        "assert args.command == 'convert'\n"
        "helpers = ('converter.commands.storage_args', 'converter.commands.image_args')\n"  # shared arguments, not commands
        "loaded = sorted(m for m in sys.modules if m.startswith('converter.commands.') and m not in helpers)\n"
        "heavy = sorted(m for m in ('PIL.ImageDraw', 'tensorflow', 'converter.inspect.preview', 'converter.inspect.scan', 'multiprocessing')"
        " if m in sys.modules)\n"
        "print(loaded, heavy)\n"
    )
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "['converter.commands.convert'] []"
