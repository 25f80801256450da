"""Where a dataset or a source folder lives: a local path, ``file://``, ``s3://`` or ``gs://``.

Standard library only. Every command and `readers.open` accept any of these; a plain
path and a ``file://`` URL are the same local folder, ``s3://`` and ``gs://`` (also
spelled ``gcs://``) are object stores reached through fsspec (`readers.storage.store`).
"""

from __future__ import annotations

import os
from typing import Any, Iterable
from urllib.parse import unquote, urlsplit

#: URL scheme -> (fsspec protocol, pip extra that installs it, package imported).
OBJECT_SCHEMES: dict[str, tuple[str, str, str]] = {
    "s3": ("s3", "s3", "s3fs"),
    "gs": ("gcs", "gcs", "gcsfs"),
    "gcs": ("gcs", "gcs", "gcsfs"),
}


class StorageURLError(ValueError):
    """A location that is not a local path, ``file://``, ``s3://bucket/...`` or ``gs://bucket/...``."""

    exit_code = 2  # a usage error on the command line


def scheme_of(location: str | os.PathLike) -> str:
    """'' for a plain path, else the lower-case URL scheme ('s3', 'gs', 'file', ...)."""
    text = os.fspath(location)
    if "://" not in text:
        return ""
    return text.split("://", 1)[0].lower()


def is_remote(location: str | os.PathLike) -> bool:
    """True for an object-store URL (``s3://``, ``gs://``, ``gcs://``); raises for unknown schemes."""
    scheme = scheme_of(location)
    if scheme in ("", "file"):
        return False
    if scheme in OBJECT_SCHEMES:
        return True
    raise StorageURLError(
        f"location {os.fspath(location)!r}: unknown URL scheme {scheme!r}; expected a local path, "
        f"file://, s3:// or gs://")


def local_path(location: str | os.PathLike) -> str:
    """The local path of a plain path or a ``file://`` URL (``file:///data/x`` -> ``/data/x``)."""
    text = os.fspath(location)
    if scheme_of(text) != "file":
        return text
    parts = urlsplit(text)
    if parts.netloc not in ("", "localhost"):
        raise StorageURLError(f"location {text!r}: a file:// URL names a host ({parts.netloc!r}); "
                              "expected file:///absolute/path")
    return unquote(parts.path)


def split_url(location: str | os.PathLike) -> tuple[str, str, str]:
    """(scheme, bucket, key prefix without slashes at the ends) of an object-store URL."""
    text = os.fspath(location)
    scheme = scheme_of(text)
    if scheme not in OBJECT_SCHEMES:
        raise StorageURLError(f"location {text!r} is not an s3:// or gs:// URL")
    rest = text.split("://", 1)[1]
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.strip("/")
    if not bucket:
        raise StorageURLError(f"location {text!r} names no bucket; expected {scheme}://BUCKET/PREFIX")
    if any(part in (".", "..") for part in prefix.split("/")) or "//" in prefix:
        raise StorageURLError(f"location {text!r}: the key prefix has empty, '.' or '..' parts")
    return scheme, bucket, prefix


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_storage_options(items: Iterable[str] | None) -> dict[str, Any]:
    """``["anon=true", "client_kwargs.region_name=eu-west-1"]`` -> fsspec keyword arguments.

    A dotted key nests (``client_kwargs.region_name`` -> ``{"client_kwargs": {"region_name": ...}}``);
    ``true``/``false``/``none`` and numbers are converted, anything else stays a string.
    """
    options: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise StorageURLError(f"--storage-option {item!r}: expected KEY=VALUE (for example "
                                  "endpoint_url=http://127.0.0.1:9000)")
        *parents, leaf = key.strip().split(".")
        node = options
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise StorageURLError(f"--storage-option {item!r}: {p!r} is already set to a value")
        node[leaf] = _value(value)
    return options


def freeze_storage_options(options: Any) -> tuple[tuple[str, Any], ...]:
    """Storage options as sorted (key, value) pairs, nested mappings as nested pairs: hashable and
    picklable, for frozen option objects (`SourceSpec.storage_options`). Pairs pass through."""
    if not options:
        return ()
    items = options.items() if hasattr(options, "items") else options
    out = []
    for key, value in items:
        if hasattr(value, "items"):
            value = ("__mapping__", freeze_storage_options(value))
        elif isinstance(value, list):
            value = tuple(value)
        out.append((str(key), value))
    return tuple(sorted(out, key=lambda kv: kv[0]))


def thaw_storage_options(frozen: Any) -> dict[str, Any]:
    """The fsspec keyword arguments of `freeze_storage_options`' pairs (or of a mapping)."""
    if hasattr(frozen, "items"):
        return dict(frozen)
    out: dict[str, Any] = {}
    for key, value in frozen or ():
        if isinstance(value, tuple) and len(value) == 2 and value[0] == "__mapping__":
            value = thaw_storage_options(value[1])
        out[key] = value
    return out


#: Option names whose values are never printed (`storage_option_flags`).
_SECRET_WORDS = ("secret", "token", "password", "credential")


def storage_option_flags(options: Any) -> list[str]:
    """The ``--storage-option KEY=VALUE`` arguments that give `options` again (nested keys dotted);
    a value whose key names a secret (secret, token, password, credentials) reads ``<redacted>``."""
    flags: list[str] = []

    def walk(prefix: str, mapping: dict[str, Any]) -> None:
        for key, value in mapping.items():
            if isinstance(value, dict):
                walk(f"{prefix}{key}.", value)
            else:
                text = {True: "true", False: "false", None: "none"}.get(value, value) \
                    if isinstance(value, (bool, type(None))) else value
                if any(w in key.lower() for w in _SECRET_WORDS) and text not in ("anon", "none", "true", "false"):
                    text = "<redacted>"
                flags.extend(["--storage-option", f"{prefix}{key}={text}"])

    walk("", thaw_storage_options(options))
    return flags


__all__ = ["OBJECT_SCHEMES", "StorageURLError", "freeze_storage_options", "is_remote", "local_path",
           "parse_storage_options", "scheme_of", "split_url", "storage_option_flags", "thaw_storage_options"]
