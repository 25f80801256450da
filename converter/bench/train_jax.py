"""The U-Net feed benchmark on the JAX backend (Keras 3), for machines without TensorFlow.

`converter/bench/train.py` measures the feeds through `tf.data` and `tf.function`; a GPU
machine with JAX but no TensorFlow (a plain CUDA image) cannot run it. This module runs the
same measurement with Keras on JAX: a jitted training step (`model.stateless_call`,
`jax.value_and_grad`, `optimizer.stateless_apply`) dispatched asynchronously as `model.fit`
does on JAX (the next batch is read while the device runs the last step; at most
`IN_FLIGHT` steps ahead), fed by

(a) `keras_dataset` in float mode (float32 x, one-hot y copied to the device every step);
(b) `keras_dataset` in compact mode (uint8 x and class map), expanded inside the jitted step
    on the device (`readers.device.expand_batch`, written with `keras.ops`);
(b3) the same with `Augment` applied on the host (the C kernel, in the PyDataset workers),
    expanded on the device;
(c) one float32 batch held in device memory and reused every step (the ceiling).

The batches are read in order by the PyDataset's `workers` threads, 10 batches ahead, as
Keras' PyDataset adapter reads them inside `model.fit`. `readers.device.augment_batch` (`augment_on="device"`) is
TensorFlow code and is not measured here (said in the output).
"""

from __future__ import annotations

import time
from typing import Any, Iterator

from converter.bench.train import FeedResult, build_unet


IN_FLIGHT = 2  # steps dispatched ahead of the one whose loss is read (Keras' JAX trainer runs ahead likewise)


def device_name_jax() -> str:
    import jax

    dev = jax.devices()[0]
    return f"{dev.platform.upper()}: {getattr(dev, 'device_kind', str(dev))} (JAX {jax.__version__})"


def make_step_jax(model: Any, num_classes: int, *, compact: bool) -> tuple[Any, Any]:
    """(jitted step(state, x, y) -> (loss, state), initial state) for `model`."""
    import jax
    import keras

    from readers.device import expand_batch

    loss_fn = keras.losses.CategoricalCrossentropy()
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)

    def loss_of(trainable: Any, non_trainable: Any, x: Any, y: Any) -> Any:
        pred, non_trainable = model.stateless_call(trainable, non_trainable, x, training=True)
        return loss_fn(y, pred), non_trainable

    grad_fn = jax.value_and_grad(loss_of, has_aux=True)

    @jax.jit
    def step(state: Any, x: Any, y: Any) -> Any:
        trainable, non_trainable, opt_vars = state
        if compact:
            x, y = expand_batch(x, y, num_classes)
        (loss, non_trainable), grads = grad_fn(trainable, non_trainable, x, y)
        trainable, opt_vars = optimizer.stateless_apply(opt_vars, grads, trainable)
        return loss, (trainable, non_trainable, opt_vars)

    state = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables],
             [v.value for v in optimizer.variables])
    return step, state


def _train_jax(step: Any, state: Any, batches: Iterator[tuple[Any, Any]], steps: int, warmup: int,
               result: FeedResult) -> None:
    """Steps dispatched as `model.fit` on JAX dispatches them: the next batch is fetched while
    the device still runs the last step (asynchronous dispatch; at most `IN_FLIGHT` steps
    queued), and the clock stops when the last step has finished. Each timed step is the
    whole run's time over `steps`; the time blocked in ``next()`` is kept per step."""
    import jax

    pending: list[Any] = []
    start = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            jax.block_until_ready(state)
            pending.clear()
            start = time.perf_counter()
        t0 = time.perf_counter()
        x, y = next(batches)
        t1 = time.perf_counter()
        loss, state = step(state, x, y)
        pending.append(loss)
        if len(pending) > IN_FLIGHT:
            float(pending.pop(0))
        if i >= warmup:
            result.wait_seconds.append(t1 - t0)
    jax.block_until_ready(state)
    total = time.perf_counter() - start
    result.step_seconds.extend([total / steps] * steps)


def _forever(pydataset: Any, ahead: int = 10) -> Iterator[tuple[Any, Any]]:
    """Batches of a PyDataset in order, epoch after epoch, read by its `workers` threads
    `ahead` batches ahead (what Keras' PyDataset adapter does inside `model.fit`)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, int(getattr(pydataset, "workers", 1)))) as pool:
        while True:
            queued = [pool.submit(pydataset.__getitem__, i) for i in range(min(ahead, len(pydataset)))]
            for i in range(len(pydataset)):
                x, y = queued[i].result()[:2]
                if i + ahead < len(pydataset):
                    queued.append(pool.submit(pydataset.__getitem__, i + ahead))
                queued[i] = None
                yield x, y
            pydataset.on_epoch_end()


def run_train_bench_jax(compact_dir: str, *, size: tuple[int, int], batch_size: int, steps: int, warmup: int = 3,
                        base_filters: int = 16, depth: int = 3, workers: int = 4) -> dict[str, Any]:
    """Train the same U-Net fed the ways the module docstring lists; returns the numbers."""
    import jax
    import keras

    import readers
    from readers.augment import Augment

    ds = readers.open(compact_dir)
    split = next(iter(ds.splits))
    c = ds.num_classes
    results: list[FeedResult] = []
    skipped: dict[str, str] = {}

    def feed(name: str, label: str, pydataset: Any, compact: bool) -> None:
        keras.utils.set_random_seed(0)
        step, state = make_step_jax(build_unet(size, c, base=base_filters, depth=depth), c, compact=compact)
        r = FeedResult(name, label, batch_size=batch_size)
        _train_jax(step, state, pydataset if not hasattr(pydataset, "__getitem__") else _forever(pydataset),
                   steps, warmup, r)
        results.append(r)

    feed("imgshard_float", "(a) keras_dataset float32 + one-hot", 
         ds.keras_dataset(split, batch_size, seed=0, workers=workers), compact=False)
    feed("imgshard_compact", "(b) keras_dataset compact + expand_batch in the step",
         ds.keras_dataset(split, batch_size, seed=0, one_hot=False, normalize=False, workers=workers), compact=True)
    aug = Augment(hflip=0.5, scale=(0.75, 1.5), crop=tuple(size), rotate=10, brightness=0.2)
    try:
        pyd = ds.keras_dataset(split, batch_size, seed=0, one_hot=False, normalize=False, workers=workers,
                               augment=aug)
        feed("imgshard_compact_host_augment", "(b3) compact + host Augment (rotate=10), expand in the step",
             pyd, compact=True)
    except Exception as e:  # noqa: BLE001 - reported, not hidden: this feed needs what this machine may lack
        skipped["imgshard_compact_host_augment"] = f"{type(e).__name__}: {e}"[:300]

    x, y = next(_forever(ds.keras_dataset(split, batch_size, seed=0, shuffle=False)))
    x, y = jax.device_put(x), jax.device_put(y)

    def same() -> Iterator[tuple[Any, Any]]:
        while True:
            yield x, y

    feed("in_device_memory", "(c) one batch held in device memory (ceiling)", same(), compact=False)
    skipped["imgshard_compact_device_augment"] = ("augment_on='device' is TensorFlow code "
                                                  "(readers.device.augment_batch): not measured on JAX")
    return _summary(results, skipped, device_name_jax(), size, batch_size, steps, warmup, base_filters, depth)


def _summary(results: list[FeedResult], skipped: dict[str, str], device: str, size: tuple[int, int],
             batch_size: int, steps: int, warmup: int, base_filters: int, depth: int) -> dict[str, Any]:
    ceiling = results[-1].step_time
    out: dict[str, Any] = {"device": device, "backend": "jax", "size": list(size), "batch_size": batch_size,
                           "steps": steps, "warmup": warmup, "model": {"base_filters": base_filters, "depth": depth},
                           "feeds": [], "not_measured": skipped}
    for r in results:
        entry = r.to_json()
        entry["waiting_for_input_share"] = max(0.0, 1.0 - ceiling / r.step_time)
        entry["vs_ceiling"] = r.step_time / ceiling
        out["feeds"].append(entry)
    b = next(f for f in out["feeds"] if f["name"] == "imgshard_compact")
    out["target"] = {"name": "(b) within 5% of (c)", "value": b["vs_ceiling"], "met": b["vs_ceiling"] <= 1.05,
                     "meaningful": device.startswith("GPU")}
    return out


__all__ = ["make_step_jax", "run_train_bench_jax"]
