"""A `model.fit` run for tests/test_resume.py: logs a digest of every batch it trains on
(before the step) and kills itself with SIGKILL before global step `--kill-at`.

    python tests/_resume_child.py DATASET BACKUP LOG --source tf|keras|keras-mp [--augment] [--kill-at K]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import readers  # noqa: E402
from readers.augment import Augment  # noqa: E402

AUGMENT = Augment(hflip=0.5, scale=(0.75, 1.5), crop=(16, 16), brightness=0.2)
SEED, BATCH, EPOCHS, SAVE_FREQ = 7, 2, 3, 5


def digest(x: np.ndarray, y: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(x).tobytes() + np.ascontiguousarray(y).tobytes()).hexdigest()[:16]


def build_input(ds, source: str, augment: bool, resume=None):
    aug = AUGMENT if augment else None
    if source == "tf":
        return ds.tf_dataset("train", BATCH, seed=SEED, augment=aug, resume=resume)
    return ds.keras_dataset("train", BATCH, seed=SEED, augment=aug, workers=2, resume=resume,
                            use_multiprocessing=source == "keras-mp")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset")
    parser.add_argument("backup")
    parser.add_argument("log")
    parser.add_argument("--source", choices=["tf", "keras", "keras-mp"], required=True)
    parser.add_argument("--augment", action="store_true")
    parser.add_argument("--kill-at", type=int, default=-1)
    args = parser.parse_args()
    ds = readers.open(args.dataset)
    size = (16, 16) if args.augment else ds.image_shape[:2]
    log = open(args.log, "a", encoding="utf-8")

    class Logged(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = keras.layers.Conv2D(4, 3, padding="same", activation="relu")
            self.c2 = keras.layers.Conv2D(ds.num_classes, 1, activation="softmax")

        def call(self, x):
            return self.c2(self.c1(x))

        def train_step(self, data):
            if int(self.optimizer.iterations.numpy()) == args.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            x, y = data
            log.write(f"{int(self.optimizer.iterations.numpy())} {digest(x.numpy(), y.numpy())}\n")
            log.flush()
            return super().train_step(data)

    model = Logged()
    model(np.zeros((1, *size, 3), np.float32))  # builds the layers
    model.compile(optimizer="adam", loss="categorical_crossentropy", run_eagerly=True)
    resume = readers.ResumableInput(args.backup)
    train = build_input(ds, args.source, args.augment, resume)
    model.fit(train, epochs=EPOCHS, verbose=0, shuffle=False,  # keras_dataset shuffles itself (seed, epoch)
              callbacks=[keras.callbacks.BackupAndRestore(args.backup, save_freq=SAVE_FREQ), resume])
    log.write("done\n")


if __name__ == "__main__":
    main()
