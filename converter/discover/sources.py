"""Stage 1's entry point: the source samples and the class table of a conversion, found
the way the task's strategy (`readers.tasks`) says: a class table plus image/mask pairs
for dense (per-pixel) tasks, class folders for per-image labels."""

from __future__ import annotations

from converter.discover.classes import class_table_path, load_class_table
from converter.discover.classfolders import discover_classification
from converter.discover.layout import Discovery, DiscoveryStream, discover_stream
from converter.options import OutputOptions, SourceSpec
from readers.manifest import ClassInfo
from readers.tasks import task_kind


def discover_sources(spec: SourceSpec, options: OutputOptions
                     ) -> tuple[Discovery | DiscoveryStream, tuple[ClassInfo, ...]]:
    """(samples found, class table) of `spec` for `options.task`. Image/mask pairs come as a
    stream (`found.samples` is consumed once, `found.bad` fills as it is): one folder
    listing in memory at a time, whatever the number of sources."""
    if task_kind(options.task).dense:
        classes = load_class_table(class_table_path(spec))  # first: a missing table is the first error
        return discover_stream(spec), classes
    return discover_classification(spec, options.val_fraction)


__all__ = ["discover_sources"]
