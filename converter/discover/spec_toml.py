"""A source spec as TOML (`scan --write-spec FILE.toml`): the spec document's structure written
with the standard library's `tomllib` as the reader it must satisfy (no TOML writer is a
dependency). Tables for mappings, arrays of tables for a split's folder pairs, basic strings
with JSON's escapes (a subset of TOML's); None (TOML has no null) is left out, as the reader
takes a missing key for its default."""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(name: Any) -> str:
    name = str(name)
    return name if _BARE_KEY.match(name) else json.dumps(name, ensure_ascii=False)


def _value(v: Any, where: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x, where) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_value(x, where)}" for k, x in v.items() if x is not None) + "}"
    raise TypeError(f"spec value at {where}: expected a string, number, true/false, list or table. "
                    f"Received: {type(v).__name__}")


def _is_tables(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and bool(v) and all(isinstance(x, Mapping) for x in v)


def _table(doc: Mapping, path: list[str], lines: list[str]) -> None:
    """`doc`'s plain keys first (TOML puts them before any sub-table), then its tables and arrays of tables."""
    nested = []
    for k, v in doc.items():
        if v is None:
            continue
        if isinstance(v, Mapping) or _is_tables(v):
            nested.append((k, v))
        else:
            lines.append(f"{_key(k)} = {_value(v, '.'.join([*path, str(k)]))}")
    for k, v in nested:
        sub = [*path, _key(k)]
        if isinstance(v, Mapping):
            lines += ["", f"[{'.'.join(sub)}]"]
            _table(v, sub, lines)
        else:
            for item in v:
                lines += ["", f"[[{'.'.join(sub)}]]"]
                _table(item, sub, lines)


def dumps(doc: Mapping) -> str:
    """`doc` as a TOML document that `tomllib.loads` reads back equal (None values left out)."""
    lines: list[str] = []
    _table(doc, [], lines)
    return "\n".join(lines).lstrip("\n") + "\n"


__all__ = ["dumps"]
