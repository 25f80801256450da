"""`imgshard scan SRC --write-spec FILE`: what scan found, as a source spec (`converter.discover.spec_file`).

The spec names every folder pair with its split and name tokens, the layout whose mask
meaning applies, the class table, and the label options scan resolved (the layout's
defaults, the flags given, the label flags scan's verdict adds). The run-time flags of
the verdict (``--max-bad``, ``--unknown-color``, ``--color-tolerance``) stay on the
command line: `spec_command` is the convert command that follows the spec.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from converter.discover.files import absolute
from converter.discover.spec_file import spec_document, write_spec
from readers.storage.url import storage_option_flags
from converter.options import LabelOptions, Overlap

#: Verdict flags that say what mask values mean: they go into the spec's "labels".
_LABEL_FLAGS = {"--mask-semantics": "semantics", "--num-classes": "num_classes", "--ignore-index": "ignore_values",
                "--label-map": "label_map_file", "--binary-threshold": "binary_threshold"}


class NothingToWrite(ValueError):
    """scan found nothing that converts: no spec is written (exit 65)."""

    exit_code = 65


def _split_flags(flags: list[str]) -> tuple[dict[str, Any], str | None, list[str]]:
    """(label fields, --classes file, the other flags) of a verdict's flag list."""
    labels: dict[str, Any] = {}
    classes, rest = None, []
    i = 0
    while i < len(flags):
        flag = flags[i]
        if flag in ("--reduce-zero-label", "--no-reduce-zero-label"):
            labels["reduce_zero_label"] = flag == "--reduce-zero-label"
        elif flag == "--classes":
            classes, i = flags[i + 1], i + 1
        elif flag in _LABEL_FLAGS:
            field, value = _LABEL_FLAGS[flag], flags[i + 1]
            if field == "ignore_values":
                labels.setdefault(field, []).append(int(value))
            else:
                labels[field] = int(value) if field in ("num_classes", "binary_threshold") else value
            i += 1
        else:
            rest.append(flag)
        i += 1
    return labels, classes, rest


def spec_labels(report: Any, verdict_labels: dict[str, Any]) -> dict[str, Any]:
    """The spec's label options: the layout's defaults, then scan's semantics, the flags given, the verdict's."""
    found = report.found
    d = found.defaults
    labels: dict[str, Any] = {"semantics": report.labels.get("semantics")}
    if d.ignore_values:
        labels["ignore_values"] = list(d.ignore_values)
    if d.reduce_zero_label:
        labels["reduce_zero_label"] = True
    if d.label_map:
        labels["label_map_file"] = d.label_map
    given = report.options.labels or LabelOptions()
    default = LabelOptions()
    for key, value in given.to_json().items():
        if value is not None and value != default.to_json()[key]:
            labels[key] = value
    labels.update(verdict_labels)
    return {k: v for k, v in labels.items() if v is not None}


def _existing(path: str | None) -> str | None:
    from converter.discover.files import is_file

    return path if path is not None and is_file(path) else None


def write_scan_spec(report: Any, path: str, classes_file: str | None = None) -> str:
    """Write the spec of a segmentation scan to `path`; returns the convert command that follows it."""
    if hasattr(report, "overlap_rule"):  # annotation files (`converter.inspect.scan_annotations`)
        return write_annotation_spec(report, path)
    v = report.verdict
    if v["status"] == "no_data" or report.found is None or not report.found.sources:
        raise NothingToWrite(f"--write-spec {path}: scan found nothing to convert ({v.get('reason')}), so no spec "
                             f"was written. Received: {report.source}")
    spec = report.spec
    root = spec.root if spec.root is not None else spec.base
    labels, classes, rest = _split_flags(list(v["flags"]))
    classes = classes_file or classes or spec.classes or _existing(report.found.classes_csv)
    if classes is not None:
        classes = os.path.abspath(classes) if "://" not in classes else classes
    doc = spec_document(list(report.found.sources), os.path.abspath(root) if "://" not in root else root,
                        os.path.dirname(os.path.abspath(path)), classes=classes, labels=spec_labels(report, labels),
                        detected={"layout": report.found.layout, "why": report.found.why},
                        layout=report.found.layout)
    write_spec(path, doc)
    if not (v["command"] or v.get("command_after_write")):
        raise NothingToWrite(f"--write-spec {path}: {v['reason']}; no spec was written. Received: {report.source}")
    words = shlex.split(v["command"] or v["command_after_write"])
    size = words[words.index("--size") + 1]
    command = ["imgshard", "convert", "--spec", path, "OUT", "--size", size, *rest,
               *storage_option_flags(spec.storage_options)]
    return " ".join(shlex.quote(a) for a in command)


def _flag_value(command: str, flag: str) -> str | None:
    words = shlex.split(command)
    return words[words.index(flag) + 1] if flag in words else None


def write_annotation_spec(report: Any, path: str) -> str:
    """`scan --write-spec FILE` for annotation files: each split's annotation file (or folder of per-image
    files) with its image folder and format, and the annotation options; returns the convert command."""
    v, spec, found = report.verdict, report.spec, report.found
    if v["status"] == "no_data" or spec is None or found is None or not found.sources or spec.root is None:
        raise NothingToWrite(f"--write-spec {path}: scan found nothing to convert, so no spec was written. "
                             f"Received: {report.source}")
    root = absolute(spec.root)
    doc = spec_document(list(found.sources), root, os.path.dirname(os.path.abspath(path)), classes=spec.classes,
                        detected={"layout": found.layout, "why": found.why})
    a = spec.annotations
    options: dict[str, Any] = {}
    if a.overlap is not Overlap.TOOL:
        options["overlap"] = a.overlap.value
    if a.keep_crowd:
        options["keep_crowd"] = True
    if a.rle_class:
        options["rle_class"] = a.rle_class
    order = _flag_value(v["command"], "--rle-order") or a.rle_order.value
    if order != "columns":  # given, or found by scan from the shapes the runs draw
        options["rle_order"] = order
    if options:
        doc["annotation_options"] = options
    write_spec(path, doc)
    words = shlex.split(v["command"])
    rest = words[words.index("--max-bad"):words.index("--max-bad") + 2] if "--max-bad" in words else []
    size = words[words.index("--size") + 1]
    return shlex.join(["imgshard", "convert", "--spec", path, "OUT", "--size", size, *rest])
__all__ = ["NothingToWrite", "spec_labels", "write_annotation_spec", "write_scan_spec"]
