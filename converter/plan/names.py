"""New shard names that cannot collide with published ones.

A shard's name comes from its split's `next_shard_index`, a number in the manifest. The
manifest's schema check (`readers.manifest.validate`) refuses a number at or below a listed
shard's; this is the converter's last look before anything is written: no new shard (nor
its index file, named after it) may take a name the manifest lists or a file on disk has.
Writing one would replace a published shard, and the run (or `compact`) would then delete
it as old.
"""

from __future__ import annotations

import os
from typing import Callable, Iterable

from readers.manifest import Manifest


class NameCollisionError(ValueError):
    """A new shard would take the name of a listed shard or of a file in OUT."""


def listed_names(manifest: Manifest | None) -> set[str]:
    """Every shard and index file name `manifest` lists."""
    if manifest is None:
        return set()
    return {f for _, s in manifest.iter_shards() for f in (s.file, s.index.file if s.index else None) if f}


def refuse_taken_names(out_dir: str, manifest: Manifest | None, new_files: Iterable[str],
                       exists: Callable[[str], bool] = os.path.lexists) -> None:
    """`NameCollisionError` naming the first new shard whose name (or its index file's, ``NAME.*``)
    the manifest lists, or that already exists in `out_dir`."""
    listed = listed_names(manifest)
    for file in new_files:
        clash = file if file in listed else next((n for n in sorted(listed) if n.startswith(file + ".")), None)
        where = "the manifest lists it" if clash else "a file of that name is in the output folder"
        if clash is None and exists(os.path.join(out_dir, file)):
            clash = file
        if clash is not None:
            raise NameCollisionError(
                f"{os.path.join(out_dir, file)}: the new shard's name is taken ({clash}: {where}), so writing it "
                "would replace a published file. The split's next_shard_index in the manifest is probably damaged; "
                "nothing was written. Run `imgshard verify OUT`, then restore imgshard.json from a backup or "
                f"re-convert with --rebuild into a new folder. Received: {file}"
            )
