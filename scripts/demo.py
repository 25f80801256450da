"""The demo behind scripts/demo.sh: sample data -> imgshard convert -> Keras model.fit.

Makes a small CamVid-style dataset (textured photos, colour/palette masks, a quirky
class_dict.csv), converts it with the real `imgshard convert` command, verifies the
result, then trains a tiny segmentation model for one epoch from the shards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time


def run(cmd: list[str]) -> None:
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def main(work: str) -> int:
    from converter.testing import synth

    src = os.path.join(work, "camvid")
    out = os.path.join(work, "shards")
    if os.path.exists(work):
        shutil.rmtree(work)
    os.makedirs(work)
    t0 = time.perf_counter()
    ds = synth.make_camvid(
        src, splits={"train": 24, "val": 8}, size=[(360, 480), (300, 400)],
        image_modes=("RGB", "RGBA", "P", "L"), mask_modes=("RGB", "RGBA", "P"), seed=0,
    )
    print(f"Made a sample dataset: {ds.num_samples} image/mask pairs, {len(ds.classes)} classes in {src} "
          f"({time.perf_counter() - t0:.1f} s)")

    imgshard = [sys.executable, "-m", "converter.cli"]
    run(imgshard + ["scan", src, "--quiet"])  # what a user runs first: is the data sound?
    run(imgshard + ["convert", src, out, "--size", "128x160", "--fit", "cover"])
    run(imgshard + ["convert", src, out, "--size", "128x160", "--fit", "cover"])  # the nightly re-run: nothing new
    run(imgshard + ["verify", out])
    run(imgshard + ["inspect", out])
    run(imgshard + ["preview", out, "-o", os.path.join(work, "preview.png"), "-n", "4"])

    import keras

    import readers

    data = readers.open(out)
    print(f"Opened {out}: splits {data.splits}, classes {[name for name, _ in data.classes]}")
    h, w, _ = data.image_shape
    n = data.num_classes
    inputs = keras.Input((h, w, 3))
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = keras.layers.UpSampling2D()(x)
    outputs = keras.layers.Conv2D(n, 1, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(data.tf_dataset("train", 8, seed=0), validation_data=data.tf_dataset("val", 8, shuffle=False),
                        epochs=1, verbose=2)
    loss = history.history["loss"][-1]
    print(f"Trained one epoch from the shards: loss {loss:.3f}, "
          f"val accuracy {history.history['val_accuracy'][-1]:.3f}")
    print(f"Demo done in {time.perf_counter() - t0:.1f} s. Sources: {src}  Shards: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "demo-out")))
