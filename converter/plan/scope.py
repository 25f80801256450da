"""Source scope: what a run looked at, and what a dataset was built from.

A run's scope is its folder pairs with their splits (``{"split", "images", "masks"}``);
the dataset's is the union of its runs' scopes (since the last ``--rebuild``), recorded in
the manifest's ``sources`` with the source spec (`readers.manifest.Manifest.sources`).
Records of splits outside the run's scope are never judged deleted; ``--prune`` with a
run scope that does not cover the dataset's refuses, naming both, instead of deleting
what the run did not look at. A dataset built from a spec refuses a run that follows
another spec (or none) unless ``--rebuild``.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from converter.plan.shards import PlanError
from readers.manifest import Manifest

Entry = Mapping[str, Any]


def run_scope(folder_pairs: Iterable[tuple[str, str, str]]) -> list[dict]:
    """The scope of a run: (split, images folder, masks folder) per folder pair it listed, sorted, once each."""
    entries = {(split, images.rstrip("/"), (masks or "").rstrip("/")) for split, images, masks in folder_pairs}
    return [{"split": s, "images": i, "masks": m or None} for s, i, m in sorted(entries)]


def dataset_scope(old: Manifest | None) -> list[dict]:
    """The scope a dataset records; a manifest from before scopes: its splits, folders unknown."""
    if old is None:
        return []
    if old.sources is not None and "scope" in old.sources:
        return [dict(e) for e in old.sources["scope"]]
    return [{"split": s, "images": None, "masks": None} for s in sorted(old.splits)]


def covers(run: list[dict], entry: Entry) -> bool:
    """Whether the run looked at `entry` (same split and folders; a split alone when its folders are unknown)."""
    return any(r["split"] == entry["split"] and (entry.get("images") is None or (
        r["images"] == entry["images"] and r.get("masks") == entry.get("masks"))) for r in run)


def merged(old: list[dict], run: list[dict]) -> list[dict]:
    """The dataset's scope after this run: the run's entries, and the old ones it does not cover."""
    keep = [e for e in old if not covers(run, e)]
    return sorted(keep + run, key=lambda e: (e["split"], e.get("images") or "", e.get("masks") or ""))


def _describe(scope: list[dict]) -> str:
    return "; ".join(f"{e['split']}: " + (f"{e['images']} + {e['masks']}" if e.get("images") else "(folders unknown)")
                     for e in scope) or "nothing"


def check_prune(old: Manifest | None, run: list[dict], prune: bool) -> None:
    """Refuse `--prune` when the run looked at less than the dataset holds, naming both scopes."""
    if not prune or old is None:
        return
    outside = [e for e in dataset_scope(old) if not covers(run, e)]
    if outside:
        raise PlanError(
            f"--prune: this run looked at {_describe(run)}, but the dataset was also built from "
            f"{_describe(outside)}. Pruning would delete the records of sources this run did not look at, so "
            "nothing was pruned or published. Convert every folder pair in one run (--spec FILE, or repeated "
            "--images/--masks/--split) to prune, or drop --prune.")


def check_spec(old: Manifest | None, spec_text: str | None, rebuild: bool) -> None:
    """A dataset built from a source spec follows that spec; another one (or none) needs --rebuild."""
    if old is None or rebuild or old.sources is None or old.sources.get("spec") is None:
        return
    if old.sources["spec"] != spec_text:
        what = "no spec" if spec_text is None else "a different spec"
        raise PlanError(
            f"The dataset was built from the source spec {_short(old.sources['spec'])}; this run has {what}"
            f"{'' if spec_text is None else ' ' + _short(spec_text)}. Run with the same --spec FILE, or add "
            "--rebuild to convert everything again from this one.")


def _short(text: str, limit: int = 300) -> str:
    try:
        text = json.dumps(json.loads(text), sort_keys=True)
    except ValueError:
        pass
    return text if len(text) <= limit else text[:limit] + "..."


def sources_record(old: Manifest | None, run: list[dict], spec_text: str | None, rebuild: bool) -> dict:
    """The manifest's `sources` after this run."""
    scope = run if rebuild or old is None else merged(dataset_scope(old), run)
    return {"scope": scope, "spec": spec_text}


__all__ = ["check_prune", "check_spec", "covers", "dataset_scope", "run_scope", "sources_record"]
