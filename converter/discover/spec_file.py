"""The source spec file: what to convert, written once by `imgshard scan SRC --write-spec FILE`
and followed exactly by `imgshard convert --spec FILE OUT` (a nightly job then never
re-detects, so new files cannot change what the dataset means).

A small JSON document (or a ``.toml`` file of the same structure, read and written alike)::

    {
      "imgshard_source_spec": 1,
      "root": "..",                       # folders below are relative to it; a relative root
                                          # is relative to the spec file's folder
      "splits": {                         # split name -> its folder pairs
        "train": [{"images": "training/images", "masks": "training/1st_manual",
                   "image_suffix": "_training", "mask_suffix": "_manual1"}],
        "test":  [{"images": "test/images", "masks": "test/1st_manual",
                   "image_suffix": "_test", "mask_suffix": "_manual1"}]
      },
      "classes": "class_dict.csv",        # optional: the class table (relative to root)
      "labels": {"semantics": "index", "ignore_values": [255]},   # optional: LabelOptions fields
      "detected": {"layout": "content", "why": "..."}             # written by scan; not read
    }

Each folder pair takes the keys of `PAIR_KEYS` (a name is ``<prefix><base><suffix>.<ext>``;
a suffix left out is found from the names). Other engineers extend a pair by adding a key
there and a field to `converter.options.SplitSource` (annotation files, band folders);
an unknown key is refused, naming the file, the key and the keys allowed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

from converter.options import AnnotationOptions, LabelOptions, SourceSpec, SplitSource, check_split_name
from readers.files import NotRegularFileError, open_regular_file

SPEC_VERSION = 1
VERSION_KEY = "imgshard_source_spec"
#: Keys of one folder pair -> the `SplitSource` field each fills (extend both together).
PAIR_KEYS: dict[str, str] = {
    "images": "images", "masks": "masks", "image_prefix": "image_prefix", "image_suffix": "image_suffix",
    "mask_prefix": "mask_prefix", "mask_suffix": "mask_suffix", "split_list": "split_list",
    "recursive": "recursive", "skip_unpaired": "skip_unpaired", "bands": "bands",
    "annotations": "annotations", "format": "annotation_format",  # annotation files (issue 27)
}
#: Folder-pair keys whose values are lists of paths (band folders, in channel order; `images` defaults to the first).
LIST_PATH_KEYS = frozenset({"bands"})
#: Folder-pair keys whose values are true/false (all others are strings), and their defaults.
BOOL_KEYS = {"recursive": True, "skip_unpaired": False}
#: Folder-pair keys whose values are paths (joined to the root).
PATH_KEYS = frozenset({"images", "masks", "split_list", "annotations"})
TOP_KEYS = frozenset({VERSION_KEY, "root", "splits", "classes", "labels", "layout", "detected",
                      "annotation_options"})
#: "annotation_options": how annotation files become class maps (`converter.options.AnnotationOptions`).
ANNOTATION_OPTION_KEYS = frozenset({"overlap", "keep_crowd", "rle_class", "rle_order"})
#: Layouts whose mask meaning a spec may name (``"layout": "cityscapes"``: its label map, ...).
MEANING_LAYOUTS = ("camvid", "voc", "cityscapes", "ade", "mmseg", "unet")
LABEL_KEYS = frozenset({"semantics", "ignore_values", "reduce_zero_label", "label_map", "label_map_file",
                        "num_classes", "binary_threshold"})


class SpecFileError(ValueError):
    """A source spec file that cannot be followed (exit 65)."""

    exit_code = 65


@dataclass(frozen=True)
class LoadedSpec:
    """A spec file, read: the sources to convert, its labels, and its canonical text (the manifest's record)."""

    source: SourceSpec
    labels: LabelOptions | None
    text: str


def _fail(path: str, what: str, fix: str, received: Any) -> SpecFileError:
    return SpecFileError(f"source spec {path}: {what}. {fix} Received: {received!r:.200}")


def read_spec_document(path: str) -> dict:
    """The parsed document of `path` (JSON, or TOML for ``*.toml``), or a named error."""
    try:
        with open_regular_file(path) as f:  # never blocks on a FIFO, never reads a device
            raw = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"--spec: file not found: {path}. Write one with `imgshard scan SRC --write-spec "
                                f"{path}`.") from None
    except NotRegularFileError as e:
        raise SpecFileError(f"source spec {path}: {e}. Give a regular TOML or JSON file.") from e
    try:
        if path.lower().endswith(".toml"):
            import tomllib

            doc = tomllib.loads(raw.decode("utf-8"))
        else:
            doc = json.loads(raw.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError) as e:
        raise SpecFileError(f"source spec {path} is not valid {'TOML' if path.lower().endswith('.toml') else 'JSON'}"
                            f" ({e}). Fix the file, or write it again with `imgshard scan SRC --write-spec "
                            f"{path}`.") from e
    if not isinstance(doc, dict):
        raise _fail(path, "the document must be an object", "Start from `imgshard scan SRC --write-spec FILE`.",
                    type(doc).__name__)
    return doc


def check_document(doc: Mapping, path: str) -> None:
    """Version, top-level keys and the splits' shape, each refused by name."""
    if doc.get(VERSION_KEY) != SPEC_VERSION:
        raise _fail(path, f"'{VERSION_KEY}' must be {SPEC_VERSION}", "This imgshard reads spec version 1.",
                    doc.get(VERSION_KEY))
    unknown = sorted(set(doc) - TOP_KEYS)
    if unknown:
        raise _fail(path, f"unknown key(s) {unknown}", f"Allowed: {sorted(TOP_KEYS)}.", unknown)
    splits = doc.get("splits")
    if not isinstance(splits, dict) or not splits:
        raise _fail(path, "'splits' must map split names to lists of folder pairs",
                    'Example: "splits": {"train": [{"images": "img", "masks": "ann"}]}.', splits)
    if doc.get("layout") is not None and doc["layout"] not in MEANING_LAYOUTS:
        raise _fail(path, "'layout' names the layout whose mask meaning applies",
                    f"Give one of {list(MEANING_LAYOUTS)}, or leave it out.", doc["layout"])
    for key in ("root", "classes"):
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise _fail(path, f"'{key}' must be a path string", "", doc[key])
    labels = doc.get("labels")
    if labels is not None and (not isinstance(labels, dict) or set(labels) - LABEL_KEYS):
        raise _fail(path, "'labels' must be an object with keys among " + str(sorted(LABEL_KEYS)), "", labels)


def _pair(split: str, item: Any, root: str, path: str) -> SplitSource:
    if isinstance(item, dict) and "images" not in item and isinstance(item.get("bands"), list) and item["bands"]:
        item = {**item, "images": item["bands"][0]}  # band folders: the first band is the image folder
    if not isinstance(item, dict) or "images" not in item:
        raise _fail(path, f"each folder pair of split {split!r} must be an object with 'images'",
                    'Example: {"images": "img", "masks": "ann"}.', item)
    unknown = sorted(set(item) - set(PAIR_KEYS))
    if unknown:
        raise _fail(path, f"split {split!r}: unknown folder-pair key(s) {unknown}", f"Allowed: {sorted(PAIR_KEYS)}.",
                    unknown)
    fields = {}
    for key, value in item.items():
        if key in BOOL_KEYS:
            if not isinstance(value, bool):
                raise _fail(path, f"split {split!r}: '{key}' must be true or false", "", value)
        elif key in LIST_PATH_KEYS:
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise _fail(path, f"split {split!r}: '{key}' must be a list of folder paths", "", value)
            fields[PAIR_KEYS[key]] = tuple(_join(root, v) for v in value)
            continue
        elif value is not None and not isinstance(value, str):
            raise _fail(path, f"split {split!r}: '{key}' must be a string", "", value)
        fields[PAIR_KEYS[key]] = _join(root, value) if key in PATH_KEYS and value is not None else value
    try:
        return SplitSource(split=split, **fields)
    except (TypeError, ValueError) as e:
        raise SpecFileError(f"source spec {path}: {e}") from e


def _join(root: str, value: str) -> str:
    return value if os.path.isabs(value) or "://" in value else os.path.normpath(os.path.join(root, value))


def spec_root(doc: Mapping, path: str) -> str:
    """The root the spec's folders are relative to (a relative root: relative to the spec's folder)."""
    root = doc.get("root") or "."
    return root if "://" in root else os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(path)), root))


def canonical_text(doc: Mapping) -> str:
    """What a dataset records of its spec: the document without scan's notes, keys sorted."""
    return json.dumps({k: v for k, v in doc.items() if k != "detected"}, sort_keys=True, separators=(",", ":"))


def load_spec(path: str, storage_options: Any = ()) -> LoadedSpec:
    """Read and check a source spec file (see the module docstring)."""
    doc = read_spec_document(path)
    check_document(doc, path)
    root = spec_root(doc, path)
    sources = []
    for split, items in doc["splits"].items():
        try:
            check_split_name(split, "split name")
        except ValueError as e:
            raise SpecFileError(f"source spec {path}: {e}") from e
        if not isinstance(items, list) or not items:
            raise _fail(path, f"split {split!r} must be a non-empty list of folder pairs", "", items)
        sources += [_pair(split, item, root, path) for item in items]
    labels = None
    if doc.get("labels") is not None:
        try:
            labels = LabelOptions.from_json(doc["labels"])
        except (TypeError, ValueError) as e:
            raise SpecFileError(f"source spec {path}: labels: {e}") from e
    classes = _join(root, doc["classes"]) if doc.get("classes") else None
    source = SourceSpec(root=root, classes=classes, sources=tuple(sources), spec_text=canonical_text(doc),
                        spec_file=path, layout=doc.get("layout"), storage_options=storage_options,
                        annotations=_annotation_options(doc, path))
    return LoadedSpec(source, labels, source.spec_text)  # type: ignore[arg-type]


def _annotation_options(doc: Mapping, path: str) -> AnnotationOptions:
    given = doc.get("annotation_options") or {}
    if not isinstance(given, dict) or set(given) - ANNOTATION_OPTION_KEYS:
        raise _fail(path, f"'annotation_options' must be an object with keys among {sorted(ANNOTATION_OPTION_KEYS)}",
                    "", given)
    try:
        return AnnotationOptions(**given)
    except (TypeError, ValueError) as e:
        raise SpecFileError(f"source spec {path}: annotation_options: {e}") from e


def merge_labels(given: LabelOptions, from_spec: LabelOptions | None) -> LabelOptions:
    """The spec's label options, each overridden by a flag given on the command line."""
    if from_spec is None:
        return given
    default = LabelOptions()
    fields = {k: (v if v != getattr(default, k) else getattr(from_spec, k))
              for k, v in given.__dict__.items()}
    return LabelOptions(**fields)


def pair_document(s: SplitSource, root: str) -> dict:
    """One folder pair as the spec writes it: paths relative to `root`, empty tokens left out."""
    out: dict[str, Any] = {}
    for key, field_name in PAIR_KEYS.items():
        value = getattr(s, field_name, None)
        if value is None or (value == "" and key.endswith("prefix")) or (key in BOOL_KEYS and value == BOOL_KEYS[key]):
            continue  # a suffix "" stays: it says "no suffix" (left out: found from the names)
        if key in PATH_KEYS and "://" not in value:
            value = os.path.relpath(value, root).replace(os.sep, "/")
        out[key] = value
    return out


def spec_document(sources: list[SplitSource], root: str, spec_dir: str, *, classes: str | None = None,
                  labels: Mapping | None = None, detected: Mapping | None = None,
                  layout: str | None = None) -> dict:
    """The document `scan --write-spec` writes; `spec_dir`: the folder the file goes in (the root is
    written relative to it, so the spec and the sources can move together)."""
    splits: dict[str, list[dict]] = {}
    for s in sources:
        splits.setdefault(s.split, []).append(pair_document(s, root))
    rel_root = root if "://" in root else os.path.relpath(root, spec_dir).replace(os.sep, "/")
    doc: dict[str, Any] = {VERSION_KEY: SPEC_VERSION, "root": rel_root, "splits": splits}
    if layout in MEANING_LAYOUTS:
        doc["layout"] = layout
    if classes is not None:
        doc["classes"] = os.path.relpath(classes, root).replace(os.sep, "/") if "://" not in classes else classes
    if labels:
        doc["labels"] = {k: v for k, v in labels.items() if k in LABEL_KEYS and v is not None}
    if detected:
        doc["detected"] = dict(detected)
    return doc


def write_spec(path: str, doc: Mapping) -> None:
    """Write `doc` as indented JSON, or TOML when `path` ends in ``.toml`` (atomically: a temporary
    name, then renamed)."""
    from converter.fsutil import write_atomic

    if path.lower().endswith(".toml"):
        from converter.discover.spec_toml import dumps

        text = dumps(doc)
    else:
        text = json.dumps(doc, indent=2) + "\n"
    write_atomic(os.path.abspath(path), text.encode("utf-8"))


__all__ = ["LoadedSpec", "PAIR_KEYS", "SPEC_VERSION", "SpecFileError", "load_spec", "spec_document", "write_spec"]
