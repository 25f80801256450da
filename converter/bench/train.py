"""Feed a small Keras U-Net four ways and see how long the accelerator waits for input.

`scripts/bench_gpu.py` runs `run_train_bench`: a U-Net at the benchmark size trained
for a fixed number of steps, each step a compiled `tf.function` (forward, loss,
gradients, optimizer update) whose loss is fetched so that every step is finished
before the next starts. It is fed by

(a) pipeline 1: `tf.data` over raw PNGs (float32 x, one-hot y);
(b) the imgshard reader in compact mode (uint8 x, uint8 class map) with the expansion
    done inside the step, on the device (`readers.device.expand_batch`);
(b2) the same with `readers.augment.Augment` applied on the device
    (`augment_on="device"`, `readers.device.augment_batch` in the step);
(c) one float32 batch held in device memory and reused every step (the ceiling).

For each it reports the median step time, samples/s, the share of the step spent
blocked on the input iterator (``next()``), and the slowdown against (c), which is
the fraction of time the accelerator waited for input: ``1 - t_c / t_x``. Target on a
GPU: (b) within 5% of (c). On a CPU it runs too (slowly), so CI can smoke-test it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Iterator


def build_unet(size: tuple[int, int], num_classes: int, *, base: int = 16, depth: int = 3) -> Any:
    """A small U-Net: `depth` down/up levels of two 3x3 convolutions, `base` filters at the top."""
    import keras
    from keras import layers

    inputs = keras.Input((*size, 3), dtype="float32")
    x, skips = inputs, []
    for level in range(depth):
        f = base * 2 ** level
        x = layers.Conv2D(f, 3, padding="same", activation="relu")(x)
        x = layers.Conv2D(f, 3, padding="same", activation="relu")(x)
        skips.append(x)
        x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(base * 2 ** depth, 3, padding="same", activation="relu")(x)
    for level in reversed(range(depth)):
        f = base * 2 ** level
        x = layers.Conv2DTranspose(f, 2, strides=2, padding="same")(x)
        x = layers.Concatenate()([x, skips[level]])
        x = layers.Conv2D(f, 3, padding="same", activation="relu")(x)
        x = layers.Conv2D(f, 3, padding="same", activation="relu")(x)
    outputs = layers.Conv2D(num_classes, 1, activation="softmax")(x)
    return keras.Model(inputs, outputs, name="small_unet")


def make_step(model: Any, num_classes: int, *, compact: bool, augment: Any = None) -> Any:
    """A compiled training step; with `compact` it expands uint8 (x, y) on the device first;
    with `augment` (a `readers.augment.Augment`) x is (uint8 images, params) and the
    augmentation runs on the device too (`readers.device.augment_batch`)."""
    import keras
    import tensorflow as tf

    from readers.device import augment_batch, expand_batch

    loss_fn = keras.losses.CategoricalCrossentropy()
    optimizer = keras.optimizers.Adam(1e-3)

    @tf.function
    def step(x: Any, y: Any) -> Any:
        if augment is not None:
            images, params = x
            x, y = augment_batch(images, y, params, augment, num_classes)
        elif compact:
            x, y = expand_batch(x, y, num_classes)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_weights)
        optimizer.apply(grads, model.trainable_weights)
        return loss

    return step


@dataclass
class FeedResult:
    name: str
    label: str
    step_seconds: list[float] = field(default_factory=list)
    wait_seconds: list[float] = field(default_factory=list)
    batch_size: int = 0

    @property
    def step_time(self) -> float:
        return statistics.median(self.step_seconds)

    @property
    def samples_per_s(self) -> float:
        return self.batch_size / self.step_time

    @property
    def input_share(self) -> float:
        return sum(self.wait_seconds) / sum(self.step_seconds)

    def to_json(self) -> dict:
        return {"name": self.name, "label": self.label, "step_time_s": self.step_time,
                "samples_per_s": self.samples_per_s, "blocked_on_input_share": self.input_share,
                "steps": len(self.step_seconds)}


def _train(step: Any, batches: Iterator[tuple[Any, Any]], steps: int, warmup: int, result: FeedResult) -> None:
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        x, y = next(batches)
        t1 = time.perf_counter()
        float(step(x, y))  # fetch the loss: the step is finished
        t2 = time.perf_counter()
        if i >= warmup:
            result.wait_seconds.append(t1 - t0)
            result.step_seconds.append(t2 - t0)


def device_name() -> str:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "CPU (no GPU visible to TensorFlow)"
    details = tf.config.experimental.get_device_details(gpus[0])
    return f"GPU: {details.get('device_name', gpus[0].name)}"


def run_train_bench(pairs: Any, colors: Any, compact_dir: str, *, size: tuple[int, int], batch_size: int,
                    steps: int, warmup: int = 3, base_filters: int = 16, depth: int = 3,
                    shuffle_buffer: int = 64) -> dict[str, Any]:
    """Train the same U-Net fed four ways (see the module docstring); returns the numbers."""
    import tensorflow as tf

    import readers
    from converter.bench.baselines import raw_png_tf_dataset

    c = len(colors)
    device = "/GPU:0" if tf.config.list_physical_devices("GPU") else "/CPU:0"
    results: list[FeedResult] = []

    def fresh_model() -> Any:
        import keras

        keras.utils.set_random_seed(0)
        return build_unet(size, c, base=base_filters, depth=depth)

    # (a) pipeline 1
    p1 = raw_png_tf_dataset(pairs, colors, size, batch_size).repeat()
    r = FeedResult("png_tf_data", "(a) tf.data over PNG (pipeline 1)", batch_size=batch_size)
    _train(make_step(fresh_model(), c, compact=False), iter(p1), steps, warmup, r)
    results.append(r)

    # (b) imgshard compact + device-side expansion
    ds = readers.open(compact_dir)
    split = next(iter(ds.splits))
    compact = ds.tf_dataset(split, batch_size, one_hot=False, normalize=False, repeat=True,
                            shuffle_buffer=shuffle_buffer)
    r = FeedResult("imgshard_compact", "(b) imgshard compact + expand_batch in the step", batch_size=batch_size)
    _train(make_step(fresh_model(), c, compact=True), iter(compact), steps, warmup, r)
    results.append(r)

    # (b2) the same, augmented on the device (hflip, scale, crop to the model's size, colour jitter)
    from readers.augment import Augment

    aug = Augment(hflip=0.5, scale=(0.75, 1.5), crop=tuple(size), brightness=0.2, contrast=0.2, saturation=0.2,
                  hue=0.02)
    augmented = ds.tf_dataset(split, batch_size, one_hot=False, normalize=False, repeat=True, seed=0,
                              shuffle_buffer=shuffle_buffer, augment=aug, augment_on="device")
    r = FeedResult("imgshard_compact_augment", "(b2) compact + augment_batch in the step", batch_size=batch_size)
    _train(make_step(fresh_model(), c, compact=True, augment=aug), iter(augmented), steps, warmup, r)
    results.append(r)

    # (c) one batch held in device memory
    x, y = next(iter(ds.tf_dataset(split, batch_size, shuffle=False)))
    with tf.device(device):
        x, y = tf.identity(x), tf.identity(y)

    def same() -> Iterator[tuple[Any, Any]]:
        while True:
            yield x, y

    r = FeedResult("in_device_memory", "(c) one batch held in device memory (ceiling)", batch_size=batch_size)
    _train(make_step(fresh_model(), c, compact=False), same(), steps, warmup, r)
    results.append(r)

    ceiling = results[-1].step_time
    out = {"device": device_name(), "size": list(size), "batch_size": batch_size, "steps": steps,
           "warmup": warmup, "model": {"base_filters": base_filters, "depth": depth}, "feeds": []}
    for r in results:
        entry = r.to_json()
        entry["waiting_for_input_share"] = max(0.0, 1.0 - ceiling / r.step_time)
        entry["vs_ceiling"] = r.step_time / ceiling
        out["feeds"].append(entry)
    b = out["feeds"][1]
    out["target"] = {"name": "(b) within 5% of (c)", "value": b["vs_ceiling"], "met": b["vs_ceiling"] <= 1.05,
                     "meaningful": device.startswith("/GPU")}
    return out


def format_train(out: dict[str, Any]) -> str:
    lines = [f"U-Net feed benchmark on {out['device']}: {out['size'][0]}x{out['size'][1]}, batch {out['batch_size']}, "
             f"{out['steps']} steps after {out['warmup']} warm-up",
             f"{'feed':<50} {'step ms':>9} {'samples/s':>10} {'blocked':>8} {'waiting':>8} {'x (c)':>7}"]
    for f in out["feeds"]:
        lines.append(f"{f['label']:<50} {f['step_time_s'] * 1000:>9.1f} {f['samples_per_s']:>10.1f} "
                     f"{f['blocked_on_input_share'] * 100:>7.1f}% {f['waiting_for_input_share'] * 100:>7.1f}% "
                     f"{f['vs_ceiling']:>7.2f}")
    t = out["target"]
    verdict = ("MET" if t["met"] else "NOT MET") if t["meaningful"] else "not measurable without a GPU"
    lines.append(f"target {t['name']}: {t['value']:.3f}x -> {verdict}")
    return "\n".join(lines)


__all__ = ["build_unet", "format_train", "make_step", "run_train_bench"]

