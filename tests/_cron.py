"""Helpers for the cron-safety tests: source folders that grow, CLI runs, dataset checks.

Sources come from `converter.testing.synth`; a "growing" source folder is a CamVid tree whose
files are hard links into a fully generated one, so adding samples costs nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

import readers
from converter import cli
from converter.testing import synth
from converter.inspect.verify import verify
from readers.manifest import MANIFEST_NAME

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def link_samples(full: synth.SynthDataset, dest: Path, pairs: Iterable[tuple[Path, Path]]) -> Path:
    """Make (or extend) CamVid folder `dest` with hard links to `pairs` of `full`."""
    dest.mkdir(parents=True, exist_ok=True)
    csv = dest / "class_dict.csv"
    if not csv.exists():
        shutil.copy2(full.class_dict_path, csv)
    for image, mask in pairs:
        for path in (image, mask):
            target = dest / path.relative_to(full.root)
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                os.link(path, target)
    return dest


def all_pairs(full: synth.SynthDataset) -> list[tuple[Path, Path]]:
    return [p for split in sorted(full.pairs) for p in full.pairs[split]]


def first_samples(full: synth.SynthDataset, dest: Path, n: int) -> Path:
    """A source folder at `dest` holding the first `n` pairs of `full` (hard links)."""
    return link_samples(full, dest, all_pairs(full)[:n])


def source_keys(src: Path) -> set[str]:
    """Keys the converter gives the images under a CamVid folder ('split/name.png')."""
    keys = set()
    for split_dir in src.iterdir():
        if split_dir.is_dir() and not split_dir.name.endswith("_labels"):
            keys |= {f"{split_dir.name}/{p.name}" for p in split_dir.iterdir() if p.is_file()}
    return keys


def convert_args(src: Path | str, out: Path | str, *extra: str, size: str = "32x32", workers: int = 1) -> list[str]:
    return ["convert", str(src), str(out), "--size", size, "--workers", str(workers), "-q", *extra]


def run_cli(args: Sequence[str]) -> int:
    """The CLI in this process (fast); returns its exit code."""
    return cli.main(list(args))


def cli_command(args: Sequence[str]) -> list[str]:
    return [PYTHON, "-m", "converter.cli", *args]


def run_cli_process(args: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """The CLI as a real process (for locking and crash tests)."""
    return subprocess.run(cli_command(args), cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=child_env())


def start_cli_session(args: Sequence[str], stderr=subprocess.PIPE) -> subprocess.Popen:
    """The CLI as a process in a session of its own, so that a killed run's orphans can be killed too."""
    return subprocess.Popen(cli_command(args), cwd=ROOT, env=child_env(), stdout=subprocess.DEVNULL,
                            stderr=stderr, start_new_session=True)


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL to the whole session of `proc` (the run and its workers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def shard_hashes(out: Path) -> dict[str, str]:
    """File name -> sha256 of every shard file in `out` (listed or not)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.iterdir()) if p.suffix in (".tfrecord", ".npz")}


def manifest_bytes(out: Path) -> bytes | None:
    path = out / MANIFEST_NAME
    return path.read_bytes() if path.exists() else None


def record_keys(out: Path) -> Counter:
    """How often each key occurs over all splits, read back through `readers`."""
    ds = readers.open(out)
    return Counter(r.key for split in ds.splits for r in ds.records(split))


def assert_whole(out: Path, expected_keys: set[str] | None = None, *, allow_warnings: bool = False) -> None:
    """`verify --deep` passes and (optionally) every expected key is there exactly once."""
    report = verify(out, deep=True)
    assert report.ok, [str(p) for p in report.errors]
    if not allow_warnings:
        assert not report.warnings, [str(p) for p in report.warnings]
    if expected_keys is not None:
        counts = record_keys(out)
        assert set(counts) == expected_keys, (sorted(set(counts) ^ expected_keys))[:10]
        assert max(counts.values()) == 1, [k for k, n in counts.items() if n > 1][:10]


def as_version_2(out: Path) -> dict:
    """Rewrite a dataset as imgshard wrote it before version 3: every sample inline in the
    manifest, no index files. Returns the manifest's JSON document."""
    import dataclasses

    from readers.index import shard_samples
    from readers.manifest import Manifest, SplitEntry

    m = Manifest.load(out)
    splits = {name: SplitEntry(tuple(dataclasses.replace(sh, samples=tuple(shard_samples(str(out), sh)), index=None)
                                     for sh in e.shards), e.next_shard_index)
              for name, e in m.splits.items()}
    legacy = m.replace(splits=splits, version=2)
    (out / MANIFEST_NAME).write_text(legacy.dumps())
    for _, sh in m.iter_shards():
        (out / sh.index.file).unlink()
    doc = json.loads((out / MANIFEST_NAME).read_text())
    assert doc["imgshard_manifest"] == 2 and all("samples" in sh for sp in doc["splits"].values() for sh in sp["shards"])
    return doc


def as_version_2_with_a_flipped_key(out: Path, shard: int) -> tuple[dict, str, str]:
    """`as_version_2`, then one bit of one character of sample 1's inline key in `shard` of
    "train" flipped (the manifest written back). Returns (that shard's entry, the key, the
    flipped key)."""
    doc = as_version_2(out)
    entry = doc["splits"]["train"]["shards"][shard]
    good = entry["samples"][1]["key"]
    flipped = good[:-5] + chr(ord(good[-5]) ^ 1) + good[-4:]
    assert flipped != good
    entry["samples"][1]["key"] = flipped
    (out / MANIFEST_NAME).write_text(json.dumps(doc))
    return entry, good, flipped


def startup_seconds() -> float:
    """How long starting the CLI takes right now (the machine is shared: timings are relative)."""
    import time

    t0 = time.monotonic()
    subprocess.run(cli_command(["--version"]), cwd=ROOT, env=child_env(), capture_output=True, timeout=60)
    return time.monotonic() - t0
