"""Parse `class_dict.csv` (name,r,g,b), tolerating the quirks of real files.

Real files carry a UTF-8 BOM, spaces after commas, a fifth column (CamVid's
``class_11``), blank lines and Windows line endings. A malformed line or a duplicate
colour is an error naming the file and the line.
"""

from __future__ import annotations

import csv
import io
import os

from converter.discover.files import read_bytes
from readers.files import NotRegularFileError
from readers.manifest import ClassInfo


class ClassTableError(ValueError):
    """class_dict.csv is malformed."""


def _parse_channel(value: str, path: str, lineno: int, column: str) -> int:
    try:
        v = int(value.strip())
    except ValueError:
        raise ClassTableError(
            f"{path}, line {lineno}: column {column!r} must be an integer 0..255. Received: {value!r}"
        ) from None
    if not 0 <= v <= 255:
        raise ClassTableError(f"{path}, line {lineno}: column {column!r} must be in 0..255. Received: {v}")
    return v


def load_class_table(path: str | os.PathLike) -> tuple[ClassInfo, ...]:
    """Read classes in file order; class index = row index."""
    path = os.fspath(path)
    try:
        raw = read_bytes(path)
    except NotRegularFileError as e:
        raise ClassTableError(f"Class table: {e}. Pass --classes with a real CSV file.") from e
    except FileNotFoundError:
        raise FileNotFoundError(
            f"Class table not found: {path}. Put a class_dict.csv (name,r,g,b) in the source folder "
            "or pass --classes CSV."
        ) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ClassTableError(f"{path} is not UTF-8 text ({e}). Save it as UTF-8.") from e

    rows = [(i + 1, row) for i, row in enumerate(csv.reader(io.StringIO(text), skipinitialspace=True))]
    rows = [(n, [c.strip() for c in r]) for n, r in rows if any(c.strip() for c in r)]
    if not rows:
        raise ClassTableError(f"{path} is empty. Expected a header 'name,r,g,b' and one line per class.")
    header_line, header = rows[0]
    lower = [h.lower() for h in header]
    try:
        idx = [lower.index(k) for k in ("name", "r", "g", "b")]
    except ValueError:
        raise ClassTableError(
            f"{path}, line {header_line}: header must contain the columns name,r,g,b (extra columns are fine). "
            f"Received: {','.join(header)!r}"
        ) from None

    classes: list[ClassInfo] = []
    seen_colors: dict[tuple[int, int, int], tuple[str, int]] = {}
    seen_names: dict[str, int] = {}
    for lineno, row in rows[1:]:
        if len(row) <= max(idx):
            raise ClassTableError(
                f"{path}, line {lineno}: expected at least {max(idx) + 1} columns (name,r,g,b). "
                f"Received: {','.join(row)!r}"
            )
        name = row[idx[0]]
        if not name:
            raise ClassTableError(f"{path}, line {lineno}: the class name is empty.")
        color = tuple(_parse_channel(row[i], path, lineno, c) for i, c in zip(idx[1:], "rgb"))
        if color in seen_colors:
            other, other_line = seen_colors[color]
            raise ClassTableError(
                f"{path}, line {lineno}: colour {color} of class {name!r} is already used by class "
                f"{other!r} on line {other_line}. Each class needs its own colour."
            )
        if name in seen_names:
            raise ClassTableError(
                f"{path}, line {lineno}: class name {name!r} already appears on line {seen_names[name]}."
            )
        seen_colors[color] = (name, lineno)
        seen_names[name] = lineno
        classes.append(ClassInfo(name, color))  # type: ignore[arg-type]
    if not classes:
        raise ClassTableError(f"{path} has a header but no classes.")
    if len(classes) > 65534:
        raise ClassTableError(f"{path} lists {len(classes)} classes; at most 65534 are supported.")
    return tuple(classes)


def class_table_path(spec) -> str:
    """The class table of a `SourceSpec`: --classes, else SRC/class_dict.csv."""
    if spec.classes is not None:
        return spec.classes
    if spec.root is not None:
        return os.path.join(spec.root, "class_dict.csv")
    raise ValueError("--images/--masks needs --classes CSV (a class_dict.csv with name,r,g,b).")
