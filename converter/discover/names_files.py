"""Class names files found beside a dataset: which file, and the names it gives.

Files people ship with their data, line i (or key i) = class id i:

* ``class_names.txt`` (labelme2voc output), ``classes.txt``, ``labels.txt``, ``*.names``
  (darknet): one name per line; lines ``<id> <name>`` / ``<id>,<name>`` / ``<id>: <name>``
  give ids explicitly (missing ids become ``class_<id>``);
* labelme's ``labels.txt``: ``__ignore__`` first (id -1, stored as the ignore value) and
  ``_background_`` (id 0); ``__ignore__`` is not a class;
* ``data.yaml`` / ``data.yml`` (YOLO): the ``names:`` list or ``{id: name}`` mapping.

API: `find_names_file(folder)` -> the path or None; `read_names(path)` -> `NamesFile`.
Malformed files raise `NamesFileError` naming the file, the line and the fix.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from converter.discover.files import file_names, is_file, join
from converter.discover.labelmaps import read_text

#: Looked for in this order in a folder (the first found wins; ``*.names`` after these).
NAMES_FILE_NAMES = ("class_names.txt", "classes.txt", "labels.txt", "data.yaml", "data.yml")
#: labelme's marker of the ignore label (id -1) and its background class (id 0).
LABELME_IGNORE = "__ignore__"
LABELME_BACKGROUND = "_background_"
_ID_LINE = re.compile(r"^(\d+)\s*[,:\s]\s*(\S.*)$")


class NamesFileError(ValueError):
    """A names file is malformed."""


@dataclass(frozen=True)
class NamesFile:
    """The classes a names file gives: `names[i]` is class id i."""

    path: str
    names: tuple[str, ...]
    ignore_names: tuple[str, ...] = ()  # names marked as ignore (labelme's __ignore__), not classes
    background: str | None = None  # the name of class 0 when the file marks it as background
    kind: str = "lines"  # "lines", "labelme" or "yaml"

    def __post_init__(self) -> None:
        if not self.names:
            raise NamesFileError(f"{self.path} names no class. Expected one class name per line "
                                 "(line i = class id i). Received: an empty list")


def find_names_file(folder: str) -> str | None:
    """The names file in `folder` (see `NAMES_FILE_NAMES`; one ``*.names`` file), or None.

    A ``data.yaml`` without a ``names:`` key is not a names file."""
    for name in NAMES_FILE_NAMES:
        path = join(folder, name)
        if is_file(path) and (not name.startswith("data.") or _yaml_has_names(path)):
            return path
    darknet = sorted(n for n in file_names(folder) if n.endswith(".names") and not n.startswith("."))
    if len(darknet) == 1 and is_file(join(folder, darknet[0])):
        return join(folder, darknet[0])
    return None


def read_names(path: str | os.PathLike) -> NamesFile:
    """The classes of a names file (see the module docstring)."""
    path = os.fspath(path)
    text = _text(path)
    if path.endswith((".yaml", ".yml")):
        return NamesFile(path, _yaml_names(path, text), kind="yaml")
    lines = [line.strip() for line in text.splitlines()]
    numbered = [(n + 1, line) for n, line in enumerate(lines) if line and not line.startswith("#")]
    if not numbered:
        raise NamesFileError(f"{path} names no class. Expected one class name per line (line i = class id i).")
    gap = next((n + 1 for n, line in enumerate(lines[:numbered[-1][0]]) if not line and n + 1 > numbered[0][0]), None)
    if gap is not None:  # a blank line between names would shift every later class id, or be a class
        raise NamesFileError(f"{path}, line {gap}: empty line between class names (line i = class id i). "
                             "Remove it, or name the class. Received: an empty line")
    if all(_ID_LINE.match(line) for _, line in numbered):
        return NamesFile(path, _by_id(path, numbered))
    names = [line for _, line in numbered]
    ignore = tuple(n for n in names if n == LABELME_IGNORE)
    names = [n for n in names if n != LABELME_IGNORE]
    _check_unique(path, names)
    background = names[0] if names and names[0] == LABELME_BACKGROUND else None
    return NamesFile(path, tuple(names), ignore, background, "labelme" if ignore or background else "lines")


def _text(path: str) -> str:
    return read_text(path, "Names file", NamesFileError)


def _check_unique(path: str, names: list[str]) -> None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise NamesFileError(f"{path}: class name {n!r} is listed twice (line i = class id i). "
                                 f"Received: {names!r}")
        seen.add(n)


def _by_id(path: str, numbered: list[tuple[int, str]]) -> tuple[str, ...]:
    by_id: dict[int, str] = {}
    for lineno, line in numbered:
        m = _ID_LINE.match(line)
        cid, name = int(m.group(1)), m.group(2).strip()  # type: ignore[union-attr]
        if cid in by_id:
            raise NamesFileError(f"{path}, line {lineno}: id {cid} is listed twice. Received: {line!r}")
        by_id[cid] = name
    names = [by_id.get(i, f"class_{i}") for i in range(max(by_id) + 1)]
    _check_unique(path, names)
    return tuple(names)


def _yaml_names(path: str, text: str) -> tuple[str, ...]:
    """The ``names:`` of a YOLO data.yaml: a list, or a mapping of class ids to names."""
    names = _load_yaml(path, text).get("names")
    if isinstance(names, dict):
        try:
            by_id = {int(k): str(v) for k, v in names.items()}
        except (TypeError, ValueError):
            raise NamesFileError(f"{path}: the keys of 'names:' must be class ids 0, 1, ... "
                                 f"Received: {list(names)[:8]!r}") from None
        if not by_id or min(by_id) < 0:
            raise NamesFileError(f"{path}: 'names:' must map class ids >= 0 to names. Received: {names!r}")
        out = [by_id.get(i, f"class_{i}") for i in range(max(by_id) + 1)]
    elif isinstance(names, list) and all(isinstance(n, (str, int, float)) for n in names):
        out = [str(n) for n in names]
    else:
        raise NamesFileError(f"{path}: expected 'names:' as a list of class names or a mapping id: name. "
                             f"Received: {names!r}")
    _check_unique(path, out)
    return tuple(out)


def _load_yaml(path: str, text: str) -> dict:
    try:
        import yaml
    except ImportError:  # the common YOLO forms without PyYAML
        return {"names": _simple_yaml_names(text)}
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise NamesFileError(f"{path} is not valid YAML ({e}). Fix the file.") from e
    if not isinstance(data, dict):
        raise NamesFileError(f"{path}: expected a YAML mapping with a 'names:' key. Received: {type(data).__name__}")
    return data


def _simple_yaml_names(text: str):
    """``names: [a, b]``, ``names:`` + ``- a`` lines, or ``names:`` + ``0: a`` lines (no PyYAML)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("names:"):
            continue
        rest = line[len("names:"):].split("#")[0].strip()
        if rest.startswith("["):
            return [n.strip().strip("'\"") for n in rest.strip("[]").split(",") if n.strip()]
        items: list[str] = []
        for sub in lines[i + 1:]:
            if not sub.startswith((" ", "\t")) or not sub.strip():
                break
            items.append(sub.strip())
        if items and all(s.startswith("-") for s in items):
            return [s[1:].strip().strip("'\"") for s in items]
        return {k.strip(): v.strip().strip("'\"") for k, _, v in (s.partition(":") for s in items)}
    return None


def _yaml_has_names(path: str) -> bool:
    try:
        return any(line.startswith("names:") for line in _text(path).splitlines())
    except (FileNotFoundError, NamesFileError):
        return False


__all__ = ["NAMES_FILE_NAMES", "NamesFile", "NamesFileError", "find_names_file", "read_names"]
