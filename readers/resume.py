"""Resume inside Keras: `ResumableInput`, a callback that puts the input back where the weights are.

Example (docs/READERS.md, "Resume inside Keras")::

    import keras, readers

    ds = readers.open("out/")
    resume = readers.ResumableInput("backup/")
    train = ds.tf_dataset("train", 8, seed=0, augment=aug, resume=resume)   # or keras_dataset(...)
    model.fit(train, epochs=50, callbacks=[
        keras.callbacks.BackupAndRestore("backup/", save_freq=200), resume])

How: the first run writes `imgshard_input.json` into the backup folder at the start of
training: the input's `(seed, epoch, step)` and the optimizer's step count then
(`iterations`). Every backup that `BackupAndRestore` writes carries the optimizer's
step count inside its weights file, so the input position of a backup is a pure
function of that count: `advance(start, iterations_in_backup - iterations_at_start)`
(`ResumeRecord.position`). On a restart, `ResumableInput(backup_dir)` reads both files
and the pipeline starts at the batch after the backup's last one; the first (resumed)
Keras epoch is the rest of the interrupted epoch, the later ones are whole. The record
is rewritten with the position of each backup it sees (`backup`: seed, epoch, step),
for people and tools; the position itself always comes from the weights file, so a kill
between Keras' writes and ours cannot shift it.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import asdict, dataclass
from typing import Any

from readers._lazy import LazyClass

#: The record's file name inside the backup folder.
RECORD_NAME = "imgshard_input.json"
#: Keras' `BackupAndRestore` files (Keras 3).
WEIGHTS_NAME = "latest.weights.h5"
METADATA_NAME = "training_metadata.json"
#: Keras warns when an epoch ends before its known length; a resumed epoch is meant to.
_RAN_OUT = "Your input ran out of data"


@dataclass(frozen=True)
class ResumeRecord:
    """Where the input started, in one run's terms: the pipeline's seed, epoch and start
    step, the optimizer's step count then, and the batches of one epoch."""

    seed: int
    epoch: int
    step: int
    iterations: int
    batches: int
    #: What the epoch order was built from (`dataset_identity`); None in records written before.
    dataset: dict | None = None

    def position(self, iterations: int) -> tuple[int, int]:
        """(epoch, step) of the batch after `iterations` optimizer steps."""
        done = int(iterations) - self.iterations
        if done < 0:
            raise ValueError(f"The backup's optimizer step count ({iterations}) is below the {self.iterations} "
                             f"recorded in {RECORD_NAME} when its input started: the folder mixes two trainings. "
                             "Delete the backup folder to start from scratch.")
        total = self.step + done
        return self.epoch + total // self.batches, total % self.batches


def read_record(backup_dir: str) -> ResumeRecord | None:
    """The record in `backup_dir`, or None."""
    path = os.path.join(backup_dir, RECORD_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        fields = {k: int(data[k]) for k in ("seed", "epoch", "step", "iterations", "batches")}
        dataset = data.get("dataset")
        if dataset is not None:
            dataset = {"records": int(dataset["records"]), "shards": str(dataset["shards"])}
        return ResumeRecord(**fields, dataset=dataset)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: expected imgshard's resume record {{seed, epoch, step, iterations, batches}}. "
                         f"Received an unreadable file ({e}). Delete the backup folder to start from scratch.") from e


def dataset_identity(shards: Any) -> dict:
    """What an input's epoch order is built from: the record count of `shards` (its
    `ShardRef`s, in pipeline order) and a digest of their ordered (file, records, content
    digest) from the manifest, so that appended, removed or replaced samples change it
    (no read of the shards)."""
    listed = [[s.entry.file, int(s.entry.records), s.entry.digest] for s in shards]
    digest = hashlib.sha256(json.dumps(listed, separators=(",", ":")).encode("utf-8")).hexdigest()
    return {"records": sum(row[1] for row in listed), "shards": f"sha256:{digest}"}


def backup_iterations(path: str) -> int | None:
    """The optimizer's step count stored in a Keras 3 weights file (None when absent)."""
    if not os.path.exists(path):
        return None
    import h5py

    try:
        with h5py.File(path, "r") as f:
            return int(_iterations_var(f)[()])
    except (OSError, KeyError, ValueError) as e:
        raise ValueError(f"{path}: expected a Keras 3 weights file with the optimizer's step count "
                         f"(optimizer/vars/0). Received: {e}. Delete the backup folder to start from scratch.") from e


def _iterations_var(f: Any) -> Any:
    """The optimizer's `iterations` (its first variable, an integer scalar), also inside a
    wrapping optimizer (loss scaling)."""
    group = f["optimizer"]
    while "vars" not in group or len(group["vars"]) == 0:
        inner = [k for k in group if k != "vars"]
        if not inner:
            raise KeyError("no optimizer variables")
        group = group[inner[0]]
    var = group["vars"]["0"]
    if var.shape != () or var.dtype.kind not in "iu":
        raise KeyError(f"optimizer/vars/0 is {var.dtype}{var.shape}, not an integer step count")
    return var


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _check_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0. Received: {name}={value!r}")
    return value


class _ResumableInput:
    """A Keras callback that makes `tf_dataset` / `keras_dataset` resume with
    `keras.callbacks.BackupAndRestore` at the batch after the restored step.

    Args:
        backup_dir: the `backup_dir` of the `BackupAndRestore` in the same `callbacks`.

    Pass it as `resume=` to one training input and in `callbacks`. Attributes:
    `resumed` (whether a backup was found), `position` ((seed, epoch, step) the input
    starts at, once an input claimed it).
    """

    def __init__(self, backup_dir: str | os.PathLike):
        super().__init__()
        if not isinstance(backup_dir, (str, os.PathLike)) or not os.fspath(backup_dir):
            raise TypeError(f"backup_dir must be a non-empty path. Received: backup_dir={backup_dir!r}")
        self.backup_dir = os.fspath(backup_dir)
        self._record = read_record(self.backup_dir)
        self._iterations = backup_iterations(os.path.join(self.backup_dir, WEIGHTS_NAME))
        self.resumed = self._record is not None and self._iterations is not None
        self.position: tuple[int, int, int] | None = None
        self._fresh: dict | None = None  # the record to write at train begin (a fresh run)
        self._inputs: list[Any] = []  # PyDatasets to shorten to the rest of the resumed epoch
        self._seen_backup: Any = None
        self._filter: Any = None

    # -- the input side ------------------------------------------------------------------
    def claim(self, seed: int | None, epoch: int, start_step: int, batches: int,
              effective_seed: int, dataset: dict | None = None) -> tuple[int, int, int]:
        """(seed, epoch, step) for an input of `batches` batches per epoch built with
        these arguments: the restored position, or the arguments on a fresh run.
        `dataset`: the input's `dataset_identity`, recorded on a fresh run and checked on
        a resumed one."""
        _check_int("epoch", epoch)
        _check_int("start_step", start_step)
        if self.resumed:
            rec = self._record
            if seed is not None and int(seed) % (1 << 64) != rec.seed:
                raise ValueError(f"seed must be the one the backup in {self.backup_dir} was trained with "
                                 f"({rec.seed}). Received: seed={seed}")
            self._check_dataset(dataset)
            if batches != rec.batches:
                raise ValueError(f"The input has {batches} batches per epoch, the one the backup in "
                                 f"{self.backup_dir} was trained with had {rec.batches}: same split, batch "
                                 f"size and drop_remainder needed. Received: {batches} batches")
            epoch_now, step_now = rec.position(self._iterations)
            self.position = (rec.seed, epoch_now, step_now)
        else:
            self._fresh = {"seed": effective_seed, "epoch": epoch, "step": start_step, "batches": batches,
                           "dataset": dataset}
            self.position = (effective_seed, epoch, start_step)
        return self.position

    def _check_dataset(self, dataset: dict | None) -> None:
        """A resumed input must read the samples the backup's input read, in that order."""
        known = self._record.dataset
        if known is None or dataset is None or dataset == known:
            return
        raise ValueError(f"The dataset changed since the backup in {self.backup_dir} was written: its input read "
                         f"{known['records']} records from shards {known['shards']}, so the restored step would "
                         "continue another order of other samples. Open the dataset as it was at the backup, or "
                         f"delete {self.backup_dir} to start the training over. Received: {dataset['records']} "
                         f"records from shards {dataset['shards']}")

    def attach(self, pydataset: Any) -> None:
        """A `keras_dataset` whose first epoch is to be cut to the rest of the resumed one."""
        self._inputs.append(pydataset)

    # -- the Keras side ------------------------------------------------------------------
    def on_train_begin(self, logs: Any = None) -> None:
        if self.position is None:
            raise ValueError("ResumableInput was passed in callbacks but to no input: give it to the training "
                             "input as tf_dataset(..., resume=resume) or keras_dataset(..., resume=resume).")
        if self._fresh is not None:
            os.makedirs(self.backup_dir, exist_ok=True)
            record = dict(self._fresh, iterations=int(self.model.optimizer.iterations.numpy()))
            self._record = ResumeRecord(**record)
            _write_json(os.path.join(self.backup_dir, RECORD_NAME), record)
        self._seen_backup = self._backup_stamp()
        for pydataset in self._inputs:
            pydataset.start_resumed_epoch()
        if self.position[2] > 0:
            self._filter = _quiet_ran_out()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._note_backup()
        if self._filter is not None:
            self._filter.__exit__(None, None, None)
            self._filter = None

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._note_backup()  # a backup written after this callback's batch end (list order)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._note_backup()

    def on_train_end(self, logs: Any = None) -> None:
        if self._filter is not None:
            self._filter.__exit__(None, None, None)
            self._filter = None

    def _backup_stamp(self) -> Any:
        try:
            st = os.stat(os.path.join(self.backup_dir, METADATA_NAME))
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def _note_backup(self) -> None:
        """After a new backup: the record gains its input position (`backup`)."""
        stamp = self._backup_stamp()
        if stamp is None or stamp == self._seen_backup or self._record is None:
            return
        self._seen_backup = stamp
        iterations = backup_iterations(os.path.join(self.backup_dir, WEIGHTS_NAME))
        if iterations is None:
            return
        epoch, step = self._record.position(iterations)
        data = asdict(self._record)
        data["backup"] = {"seed": self._record.seed, "epoch": epoch, "step": step, "iterations": iterations}
        _write_json(os.path.join(self.backup_dir, RECORD_NAME), data)


def _build_class() -> type:
    import keras

    return type("ResumableInput", (_ResumableInput, keras.callbacks.Callback), {"__doc__": _ResumableInput.__doc__})


class _quiet_ran_out:
    """Silences Keras' "ran out of data" warning while the resumed (shorter) epoch runs."""

    def __init__(self) -> None:
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.filterwarnings("ignore", message=_RAN_OUT)

    def __exit__(self, *exc: Any) -> None:
        self._catch.__exit__(*exc)


_LAZY = LazyClass(__name__, "ResumableInput", _build_class)
__getattr__ = _LAZY.module_getattr()


def check_resume(resume: Any) -> Any:
    """`resume` as given (None or a `ResumableInput`), or a TypeError naming the argument."""
    if resume is not None and not (hasattr(resume, "claim") and hasattr(resume, "backup_dir")):
        raise TypeError("resume must be a readers.ResumableInput or None. "
                        f"Received: resume={type(resume).__name__}")
    return resume


__all__ = ["METADATA_NAME", "RECORD_NAME", "WEIGHTS_NAME", "ResumeRecord", "backup_iterations", "check_resume",
           "dataset_identity", "read_record"]
