"""Stage 1's entry point: the source samples and the class table of a conversion, found
the way the task's strategy (`readers.tasks`) says: the layout's image/mask pairs and the
mask semantics resolved into a class table for dense (per-pixel) tasks
(`converter.discover.layouts`, `converter.discover.labels`), class folders for
per-image labels."""

from __future__ import annotations

import dataclasses

from converter.discover.classfolders import discover_classification
from converter.discover.files import read_memo, source_scope
from converter.discover.labels import check_readings, resolve_labels
from converter.discover.layout import Discovery
from converter.discover.layouts import discover
from converter.options import OutputOptions, SourceSpec
from readers.manifest import ClassInfo
from readers.tasks import task_kind


def discover_sources(spec: SourceSpec, options: OutputOptions
                     ) -> tuple[Discovery, tuple[ClassInfo, ...], OutputOptions]:
    """(samples found, class table, options) of `spec` for `options.task`; for dense tasks the
    options carry the resolved mask semantics (what the manifest records). Sources in a
    bucket are listed once for all of it (`converter.discover.files.source_scope`), and each file
    discovery reads is read once (`read_memo`)."""
    spec.use_storage()
    with source_scope(), read_memo():
        if task_kind(options.task).dense:
            found = discover(spec)
            labels, classes = resolve_labels(spec, options.labels, found)
            check_readings(spec, options.labels, found, labels)
            return found, classes, dataclasses.replace(options, labels=labels)
        found, classes = discover_classification(spec, options.val_fraction)
        return found, classes, options


__all__ = ["discover_sources"]
