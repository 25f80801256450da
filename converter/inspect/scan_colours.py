"""Colour masks without a class table: the classes are the colours present.

`scan` reads every mask once with no class (every colour is then "unknown", and counted
per file), makes the table, and counts those colours as its classes (`counted_as_classes`):
each colour present is a class, named ``#rrggbb``, in ascending order of its RGB value (r,
then g, then b; so black ``#000000``, usually the background, comes first). The order
depends on the colours only, never on file order or worker count. `scan --write-classes
FILE` writes it as a class_dict.csv (name,r,g,b); convert then reads the masks by colour
with ``--classes FILE`` (`scan --write-spec` writes it beside the spec and names it
there), so new colours cannot renumber the classes of a nightly job.
"""

from __future__ import annotations

import os
from typing import Any

from converter.discover.classes import load_class_table
from converter.discover.labels import colour_table
from converter.inspect.scan_core import FileSummary
from readers.manifest import ClassInfo

#: More colours than this are not classes (a photo or a JPEG saved as a mask).
MAX_COLOUR_CLASSES = 255


class TooManyColours(ValueError):
    """The masks hold more colours than classes can be (exit 65)."""

    exit_code = 65


def needs_census(spec: Any, found: Any) -> bool:
    """Colour masks whose sources bring no class table (no class_dict.csv, no --classes)."""
    return spec.classes is None and colour_table(spec, found) is None


def census_classes(summaries: list[FileSummary], where: str) -> tuple[ClassInfo, ...]:
    """The class table of the colours present (see the module docstring)."""
    colours: set[tuple[int, int, int]] = set()
    for s in summaries:
        colours.update(s.unknown)
        if s.unknown_other_colors:
            colours.add((-1, -1, -1))  # more than a file lists: over the limit below
    if len(colours) > MAX_COLOUR_CLASSES or (-1, -1, -1) in colours:
        raise TooManyColours(f"{where}: the masks hold more than {MAX_COLOUR_CLASSES} colours, too many for each "
                             "to be a class (photos, or JPEG-compressed masks?). Give their class table with "
                             f"--classes class_dict.csv (name,r,g,b). Received: {len(colours)}+ colours")
    return tuple(ClassInfo(colour_name(c), c) for c in sorted(colours))


def counted_as_classes(summaries: list[FileSummary], classes: tuple[ClassInfo, ...]) -> list[FileSummary]:
    """`summaries` of a scan with no class, as the scan with `classes` (the colours present) would
    have made them: each file's colours become its pixels per class, and none is unknown. So the
    census and the report come from one read of every mask."""
    index = {tuple(c.color): i for i, c in enumerate(classes)}  # type: ignore[arg-type]
    for s in summaries:
        if s.class_pixels is None:  # not decoded: its error stands
            continue
        counts = [0] * len(classes)
        for colour, pixels in s.unknown.items():
            counts[index[tuple(colour)]] += pixels
        s.class_pixels, s.unknown = tuple(counts), {}
    return summaries


def census_verdict(v: dict, classes: tuple[ClassInfo, ...]) -> dict:
    """The verdict of a scan whose classes are the colours present: convert needs the table written first,
    so no command until it is (`commands/scan.py` fills it in after --write-classes or --write-spec)."""
    if v["status"] == "no_data":
        return v
    problem = (f"colour masks without a class table: the classes are the {len(classes)} colours present (ascending "
               "RGB, named #rrggbb); write the table with --write-classes FILE (or --write-spec FILE)")
    return v | {"status": "needs_flags", "convert_ok_without_flags": False, "command_after_write": v["command"],
                "command": None, "reason": problem, "problems": [problem, *v["problems"]]}


def colour_name(c: tuple[int, int, int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*c)


def table_lines(classes: tuple[ClassInfo, ...]) -> list[str]:
    """The table as scan prints it."""
    return [f"  {i:3d}  {c.name}  rgb{tuple(c.color)}" for i, c in enumerate(classes)]  # type: ignore[arg-type]


def write_classes(path: str, classes: tuple[ClassInfo, ...]) -> None:
    """Write `classes` as a class_dict.csv (name,r,g,b), atomically; read back to check it."""
    from converter.fsutil import write_atomic

    text = "name,r,g,b\n" + "".join(f"{c.name},{c.color[0]},{c.color[1]},{c.color[2]}\n" for c in classes)  # type: ignore[index]
    write_atomic(os.path.abspath(path), text.encode("utf-8"))
    if load_class_table(path) != tuple(classes):
        raise ValueError(f"--write-classes {path}: the written table does not read back as written")


__all__ = ["MAX_COLOUR_CLASSES", "TooManyColours", "census_classes", "census_verdict", "colour_name",
           "counted_as_classes", "needs_census", "table_lines", "write_classes"]
