"""The generator pipeline shared by NPZ and mapped TFRecord shards.

Whole shards are loaded by a few threads (`LOADER_THREADS`, started once per process,
`SHARDS_AHEAD` shards ahead; the loaders do their heavy work -- inflating, CRC checks,
page-cache copies -- without the GIL; a shard's layout is found once per process,
`readers.formats.layouts`), a generator plans the batches and has them cut, up to
`BATCHES_AHEAD` at once, each whole on one of the batch threads (`batch_pool`): every
record is written straight from the shard's arrays (for stored shards: the file
mapping) into a pooled, 64-byte aligned batch (`readers.formats.blocks`), and
`python_batches` hands the batches over in plan order without a copy. Cutting batches
ahead keeps every core writing while the generator hands a batch to `tf.data` (one
batch at a time, spread over the decoder threads, left ~15% of two cores idle). Compact mode
(uint8 images, class maps or labels): that write is a copy, the only one between the
page cache and the `tf.Tensor`. Otherwise the write is the expansion itself
(`RecordExpander`: float32 / 255, one-hot rows, in one pass per output, in C): no
compact batch, no cast, scale or one-hot pass, no `tf.data` map. Augmented pipelines cut
compact batches and augment + expand them in a parallel map (`augment_map`).

Fixed cost per epoch (every `iter()` of the dataset) matters on small splits and
frequent evaluation: `python_batches` builds the generator dataset so that tf.data
instantiates its functions without Grappler, and compact mode adds no map.

Order: shuffle=False gives shard order and record order, as `Dataset.records()`.
shuffle=True shuffles the shard order every epoch and permutes records across a window
of at least `options.buffer_records()` records (a block shuffle whose memory is bounded
like a shuffle buffer). Each epoch is planned from the manifest's record counts with
`np.random.default_rng([seed, epoch])` (`BatchGenerator.plan_epoch`), so the stream is
a pure function of (seed, epoch, step): every epoch reshuffles, and a pipeline can start
at any (epoch, step) without reading the shards that only earlier batches use. With
augmentation, each batch carries its samples' parameters into `augment_map`.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import ctypes
import functools
import gc
import itertools
import logging
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from readers.errors import describe
from readers.formats import layouts, workers
from readers.formats.blocks import reusable_block
from readers.formats.encoding import DECODE_THREADS, parallel_for, row_layout
from readers.formats.expand import RecordExpander, expand_tf, make_expand_tf
from readers.formats.pipeline import PipelineOptions
from readers.formats.spec import RecordSpec, ShardRef, y_signature

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

logger = logging.getLogger(__name__)

#: Threads loading shards ahead of the `tf.data` pipeline.
LOADER_THREADS = min(4, max(2, os.cpu_count() or 2))
#: Shards loaded ahead of the one being batched (each held in memory whole).
SHARDS_AHEAD = LOADER_THREADS
#: Batches cut at once ahead of the one handed to `tf.data`, each whole on one thread of
#: `batch_pool` (so every core works while the generator hands a batch over, and no batch
#: is split across threads that must meet at its end), at most... (2 x cores + 2: compact
#: batches of 8 at 512x512 on 2 cores, in-process A/B, medians of 8 rounds: 3 ahead
#: 5,469 samples/s, 6 ahead 5,696 (+4%), 10 ahead +1.6% more; float32 + one-hot batches
#: are held to 3 by `AHEAD_BYTES`)
BATCHES_AHEAD = 2 * DECODE_THREADS + 2
#: ...and at most this many bytes of them (a batch larger than this is cut alone, its
#: records spread over the decoder threads: `parallel_for`).
AHEAD_BYTES = 256 << 20
#: Expand (cast, scale, one-hot) while gathering the records into the batch, in one pass
#: per output (`RecordExpander`); False: gather a compact batch and expand it in a
#: `tf.data` map (`make_expand_tf`, XLA), the pipeline before issue 19, kept for comparison.
EXPAND_IN_GENERATOR = True


@dataclass(frozen=True)
class ShardArrays:
    """The records of one shard: arrays (N, ...) or sequences of per-record arrays."""

    images: Any
    targets: Any  # masks or labels
    keys: Any = None

    @property
    def nbytes(self) -> int:
        def size(x: Any) -> int:  # arrays and encoded columns know their size; lists of views are summed
            return int(x.nbytes) if hasattr(x, "nbytes") else sum(int(np.asarray(a).nbytes) for a in x)

        return size(self.images) + size(self.targets)


LoadFn = Callable[[ShardRef, RecordSpec], ShardArrays]


def generator_dataset(shards: Sequence[ShardRef], spec: RecordSpec, options: PipelineOptions,
                      load: LoadFn, ids: np.ndarray | None = None) -> "tf.data.Dataset":
    """One epoch of expanded (x, y) batches from shards read by `load` (augmented per
    `options.augment`, see `BatchGenerator`; `ids`: one uint64 per record, its key's id)."""
    import tensorflow as tf

    lead = options.batch_size if options.drop_remainder else None
    direct = expands_in_generator(spec, options)
    expander = RecordExpander(spec, one_hot=options.one_hot, normalize=options.normalize) if direct else None
    if expander is not None:
        (x_shape, x_dtype), (y_shape, y_dtype) = expander.layout(0)
    else:
        x_shape, x_dtype = (0, *spec.image_shape), spec.image_np_dtype.newbyteorder("=")
        y_shape, y_dtype = y_signature(spec)
    signature = (tf.TensorSpec((lead, *x_shape[1:]), tf.dtypes.as_dtype(x_dtype)),
                 tf.TensorSpec((lead, *y_shape[1:]), tf.dtypes.as_dtype(y_dtype)))
    if options.augment is not None:
        from readers.augment import PARAMS

        signature += (tf.TensorSpec((lead, PARAMS), tf.float32),)
    generator = BatchGenerator(list(shards), spec, options, load, ids, expander)
    ds = python_batches(generator, signature)
    if options.augment is not None:
        return ds.map(augment_map(spec, options), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if direct or expansion_is_identity(spec, one_hot=options.one_hot, normalize=options.normalize):
        return ds  # expanded in the generator, or compact mode: no map (one more function per epoch)
    expand = make_expand_tf(spec, one_hot=options.one_hot, normalize=options.normalize)
    return ds.map(expand, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def augment_map(spec: RecordSpec, options: PipelineOptions) -> Callable[..., Any]:
    """(uint8 images, targets, params) -> expanded (x, y): augmentation, then one-hot (in C,
    `readers.augment_host`, when built; else TensorFlow ops); with
    `options.augment_on == "device"`, ((images, params), targets) untouched (compact)."""
    from readers.augment import make_augment_tf

    options.augment.check_images(spec.channels, spec.image_dtype)  # colour jitter on RGB only: said now, by name
    if options.augment_on == "device":
        return lambda images, targets, params: ((images, params), targets)
    from readers.augment import host_kernel_takes
    from readers.augment_host import make_host_map

    if host_kernel_takes(spec.channels, spec.image_dtype):  # C: one numpy_function per batch, GIL released
        return make_host_map(spec, options.augment, normalize=options.normalize, one_hot=options.one_hot,
                             y_dtype=y_signature(spec)[1])
    identity = expansion_is_identity(spec, one_hot=options.one_hot, normalize=False)

    def expand(x: Any, y: Any) -> tuple[Any, Any]:
        return expand_tf(x, y, spec, one_hot=options.one_hot, normalize=False)

    return make_augment_tf(options.augment, ignore_index=spec.ignore_index, segmentation=spec.segmentation,
                           normalize=options.normalize, expand=None if identity else expand,
                           channels=spec.channels, image_dtype=spec.image_dtype)


def expands_in_generator(spec: RecordSpec, options: PipelineOptions) -> bool:
    """Whether the generator writes expanded (x, y) batches (`RecordExpander`); else it
    writes the stored records unchanged (compact batches, augmented or not)."""
    return (options.augment is None and EXPAND_IN_GENERATOR
            and not expansion_is_identity(spec, one_hot=options.one_hot, normalize=options.normalize))


def expansion_is_identity(spec: RecordSpec, *, one_hot: bool, normalize: bool) -> bool:
    """Whether `expand_tf` hands the compact batch through unchanged."""
    return not one_hot and not normalize and spec.mask_encoding != "onehot"


# -- the Python source of the pipeline ------------------------------------------------------------

#: "generator": each `tf.data` iterator runs one call of the batch generator through a
#: bare generator dataset whose three functions (init / next / finalize, each one
#: numpy_function) are instantiated as single-device functions, without Grappler;
#: "from_generator": through `tf.data.Dataset.from_generator` (the public API). Measured
#: per epoch of this reader: from_generator wraps the same dataset in a flat_map,
#: instantiates four functions through Grappler and checks every element's structure in
#: Python, ~12 ms of fixed cost against ~1 ms here. "generator" uses TensorFlow-internal
#: classes and falls back to "from_generator" where they are missing.
SOURCE = "generator"


def python_batches(make: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]],
                   signature: tuple["tf.TensorSpec", "tf.TensorSpec"]) -> "tf.data.Dataset":
    """A dataset of the (x, y) arrays that one call of `make` yields, per iterator.

    Like `tf.data.Dataset.from_generator(make, output_signature=signature)`: every
    iterator (every epoch) calls `make` once, concurrent iterators get their own call,
    and an iterator dropped early closes its generator. Arrays are handed over without a
    copy when they are C-contiguous and 64-byte aligned (see `readers.formats.blocks`).
    """
    import tensorflow as tf

    source_class = _source_class() if SOURCE == "generator" else None
    if source_class is None:
        return _python_source(tf.data.Dataset.from_generator(make, output_signature=signature))
    epochs = _Epochs(make)
    dtypes = tuple(s.dtype for s in signature)
    shapes = tuple(s.shape for s in signature)

    @tf.autograph.experimental.do_not_convert
    def init(_: Any) -> Any:
        return tf.numpy_function(epochs.start, [], tf.int64, stateful=True)

    @tf.autograph.experimental.do_not_convert
    def next_batch(epoch: Any) -> Any:
        out = tf.numpy_function(epochs.next, [epoch], dtypes, stateful=True)
        for tensor, shape in zip(out, shapes):
            tensor.set_shape(shape)
        return tuple(out)

    @tf.autograph.experimental.do_not_convert
    def finalize(epoch: Any) -> Any:
        return tf.numpy_function(epochs.finish, [epoch], tf.int64, stateful=True)

    try:
        return _python_source(source_class(init, next_batch, finalize, tuple(signature)))
    except (TypeError, AttributeError) as e:  # TensorFlow-internal signatures changed
        logger.debug("imgshard: building the batch source failed (%s); using from_generator", describe(e))
        return _python_source(tf.data.Dataset.from_generator(make, output_signature=signature))


#: Attribute marking the datasets `python_batches` returned (`_pin_open_iterators`).
_SOURCE_MARK = "_imgshard_python_source"


def _python_source(dataset: "tf.data.Dataset") -> "tf.data.Dataset":
    setattr(dataset, _SOURCE_MARK, True)
    return dataset


@functools.cache
def _source_class() -> Any:
    """`_PythonSource`, built on first use (it subclasses a TensorFlow class); None
    where this TensorFlow lacks what it needs."""
    try:
        from tensorflow.python.data.ops import dataset_ops, structured_function
        from tensorflow.python.data.util import structure
        from tensorflow.python.ops import gen_dataset_ops
    except ImportError:  # pragma: no cover - other TensorFlow versions
        return None
    return _build_source_class(dataset_ops, structured_function, structure, gen_dataset_ops)


def _build_source_class(dataset_ops: Any, structured_function: Any, structure: Any, gen_dataset_ops: Any) -> type:
    # The same op as `from_generator`'s inner dataset (GeneratorDataset), without its
    # flat_map, and with functions marked "experimental_ints_on_device": tf.data then
    # instantiates them as single-device functions and skips the Grappler pass that a
    # multi-device instantiation runs for every new iterator (~5 ms per epoch here).
    # Right for these functions: each is one numpy_function, which runs on the host.
    attributes = {"experimental_ints_on_device": True}

    class _PythonSource(dataset_ops.DatasetSource):
        def __init__(self, init_func: Any, next_func: Any, finalize_func: Any, signature: Any):
            init_args = np.int64(0)
            init_structure = structure.type_spec_from_value(init_args)
            name = "imgshard.python_batches()"
            self._init_func = structured_function.StructuredFunctionWrapper(
                init_func, name, input_structure=init_structure, defun_kwargs=dict(attributes))
            self._next_func = structured_function.StructuredFunctionWrapper(
                next_func, name, input_structure=self._init_func.output_structure, defun_kwargs=dict(attributes))
            self._finalize_func = structured_function.StructuredFunctionWrapper(
                finalize_func, name, input_structure=self._init_func.output_structure,
                defun_kwargs=dict(attributes))
            self._signature = signature
            self._name = None
            variant = gen_dataset_ops.generator_dataset(
                structure.to_tensor_list(init_structure, init_args) + self._init_func.function.captured_inputs,
                self._next_func.function.captured_inputs,
                self._finalize_func.function.captured_inputs,
                init_func=self._init_func.function,
                next_func=self._next_func.function,
                finalize_func=self._finalize_func.function,
                **self._common_args)
            super().__init__(variant)

        @property
        def element_spec(self) -> Any:
            return self._signature

    return _PythonSource


class _Epochs:
    """The live Python iterators of one `python_batches` dataset, by iterator id.

    At interpreter exit (`_quiesce`, an `atexit` hook) every pipeline's stream ends: a
    `tf.data` iterator still alive then (a module global, a repeating `fit` input) would
    be destroyed during finalization and wait for its prefetch thread, which cannot run
    Python any more once finalization has begun: a hang at exit. Ended streams make the
    prefetch threads stop calling into Python first, and the iterators still open are
    never destroyed (`_pin_open_iterators`)."""

    def __init__(self, make: Callable[[], Iterator[Any]]):
        self.make = make
        self.live: dict[int, Iterator[Any]] = {}
        self.ids = itertools.count()
        self.lock = threading.Lock()
        self.busy = 0  # calls running now
        self.started = False  # an iterator was ever made (`_pin_open_iterators`)
        _ALL_EPOCHS.add(self)

    def start(self) -> np.ndarray:
        self.started = True
        it = iter(()) if _closing.is_set() else iter(self.make())
        with self.lock:
            key = next(self.ids)
            self.live[key] = it
        return np.array(key, np.int64)

    def next(self, key: np.ndarray) -> tuple[np.ndarray, ...]:
        if _closing.is_set():
            raise StopIteration  # exiting: end the stream (see the class doc)
        with self.lock:
            self.busy += 1
        try:
            return next(self.live[int(key)])  # StopIteration ends the epoch (OutOfRangeError)
        finally:
            with self.lock:
                self.busy -= 1

    def finish(self, key: np.ndarray) -> np.ndarray:
        with self.lock:
            it = self.live.pop(int(key), None)
        close = getattr(it, "close", None)
        if close is not None:
            try:
                close()  # a generator dropped early: cancel its pending loads now
            except ValueError:  # still running in another thread: collected when it returns
                pass
        return np.array(0, np.int64)


_ALL_EPOCHS: "weakref.WeakSet[_Epochs]" = weakref.WeakSet()
_closing = threading.Event()
#: Longest wait at exit for the batches being cut to finish (`_quiesce`).
EXIT_WAIT_SECONDS = 5.0


@atexit.register
def _quiesce() -> None:
    """End every pipeline's stream and wait (releasing the GIL) until no batch is being
    cut and no call came in for a while, so that no prefetch thread is inside a
    `numpy_function` when finalization begins (see `_Epochs`); then keep the iterators
    still open from being destroyed during finalization (`_pin_open_iterators`)."""
    _closing.set()
    if any(e.live for e in list(_ALL_EPOCHS)):
        deadline, quiet_since = time.monotonic() + EXIT_WAIT_SECONDS, time.monotonic()
        while time.monotonic() < deadline:
            if any(e.busy for e in list(_ALL_EPOCHS)):
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > 0.1:
                break
            time.sleep(0.01)
    try:
        _pin_open_iterators()
    except Exception as e:  # noqa: BLE001 - an atexit hook's error would print a traceback at every exit
        logger.warning("imgshard: could not keep the open tf.data iterators at exit (%s); the "
                       "process may hang while exiting", describe(e))


def _pin_open_iterators() -> None:
    """Give every `tf.data` iterator still open over a `python_batches` dataset a
    reference that is never dropped, so that finalization never destroys it.

    Waiting in `_quiesce` cannot make the exit safe alone: a prefetch thread can pass
    TensorFlow's "is Python initialized" check just before finalization begins and ask
    for the GIL just after; CPython then ends that thread (3.11) or blocks it forever
    (3.14), the function it ran never returns, and destroying the iterator (module
    globals are cleared during finalization) waits for it forever -- the hang seen once
    in ~40 exits of a repeating pipeline on a loaded machine. An iterator never
    destroyed waits for nothing; its threads end with the process. Costs one scan of
    the garbage collector's objects (~40 ms per 300,000), only in processes that
    iterated such a dataset and only at exit."""
    if not any(e.started for e in list(_ALL_EPOCHS)):
        return
    iterator_ops = sys.modules.get("tensorflow.python.data.ops.iterator_ops")
    owned = getattr(iterator_ops, "OwnedIterator", None)
    if owned is None:
        return
    for obj in gc.get_objects():
        if isinstance(obj, owned) and _reads_python_source(getattr(obj, "_dataset", None)):
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def _reads_python_source(dataset: Any) -> bool:
    """Whether `dataset` is, or reads from, a dataset `python_batches` returned."""
    stack, seen = [dataset], set()
    while stack:
        ds = stack.pop()
        if ds is None or id(ds) in seen:
            continue
        seen.add(id(ds))
        if getattr(ds, _SOURCE_MARK, False):
            return True
        try:
            stack.extend(ds._inputs())
        except (AttributeError, NotImplementedError) as e:  # not a dataset, or one that does not list them
            logger.debug("imgshard: at exit, the inputs of %s are unknown (%s)", type(ds).__name__, describe(e))
    return False


def loader_pool() -> workers.DaemonPool:
    """The process's `LOADER_THREADS` loader threads, started on first use and kept: an
    epoch that started its own threads waited for them (a new thread needs the GIL to
    start; measured up to 8 ms before an epoch's first batch); daemons, see
    `readers.formats.workers`."""
    return workers.pool("load", LOADER_THREADS)


def batches_ahead(batch_bytes: int) -> int:
    """Batches of `batch_bytes` cut at once: `BATCHES_AHEAD`, fewer when they would pass `AHEAD_BYTES`."""
    return int(max(1, min(BATCHES_AHEAD, AHEAD_BYTES // max(1, batch_bytes))))


def batch_pool() -> workers.DaemonPool:
    """The process's `DECODE_THREADS` batch-cutting threads (daemons, kept)."""
    return workers.pool("batch", DECODE_THREADS)


class BatchGenerator:
    """Callable that `python_batches` calls once per epoch (per iterator); yields compact batches.

    Each call plans one whole epoch from the manifest's record counts alone
    (`plan_epoch`: which records form which batch, a pure function of (seed, epoch)),
    then loads the shards that the batches from the start step on need, in order of
    first use, and drops each after its last use. Call n is epoch `options.epoch + n`;
    the first call starts at `options.start_step`, skipping the shards that only
    earlier batches use without reading them. With `options.augment`, each batch also
    carries the samples' augmentation parameters (`readers.augment.draw_params`,
    from (seed, epoch, `ids`)).
    """

    def __init__(self, shards: list[ShardRef], spec: RecordSpec, options: PipelineOptions, load: LoadFn,
                 ids: np.ndarray | None = None, expander: RecordExpander | None = None):
        self.shards = shards
        self.expander = expander
        self.load = load
        self.spec = spec
        self.options = options
        self.seed = options.effective_seed()
        self.calls = 0
        self.window = options.buffer_records(shards)
        counts = np.array([s.records for s in shards], np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.ids = ids

    def plan_epoch(self, epoch: int) -> list[np.ndarray]:
        """The batches of `epoch`, each an array of global record numbers (shard starts + record)."""
        if self.options.replicas is not None or self.options.repeat_factors is not None:  # readers.order
            from readers.order import replica_plan

            return replica_plan(self.starts, self.seed, epoch, self.options, self.window)
        rng = np.random.default_rng([self.seed, int(epoch)])
        opts = self.options
        order = list(range(len(self.shards)))
        if opts.shuffle and opts.record_shard is None:
            rng.shuffle(order)
        seq, offset = [], 0
        for i in order:
            n = int(self.starts[i + 1] - self.starts[i])
            idx = np.arange(n)
            if opts.record_shard is not None:
                num, index = opts.record_shard
                idx = idx[(idx + offset) % num == index]
            offset += n
            seq.append(self.starts[i] + idx)
        bs = opts.batch_size
        if not opts.shuffle:
            flat = np.concatenate(seq) if seq else np.zeros(0, np.int64)
            return _cut(flat, bs, opts.drop_remainder)
        batches: list[np.ndarray] = []
        window = np.zeros(0, np.int64)  # leftover samples of the previous window first
        for part in seq + [None]:
            final = part is None
            if not final:
                window = np.concatenate([window, part])
                if len(window) < self.window:
                    continue
            perm = window[rng.permutation(len(window))]
            full = len(perm) // bs * bs
            batches.extend(_cut(perm[:full], bs, True))
            window = perm[full:]
            if final and len(window) and not opts.drop_remainder:
                batches.append(window)
        return batches

    def _loaded(self, order: list[int]) -> Iterator[ShardArrays]:
        """Shards in `order`, loaded `SHARDS_AHEAD` ahead by a thread pool."""
        pool = loader_pool()
        pending: collections.deque = collections.deque()
        try:
            todo = iter(order)
            for i in todo:
                pending.append(pool.submit(self.load, self.shards[i], self.spec))
                if len(pending) > SHARDS_AHEAD:
                    break
            while pending:
                data = pending.popleft().result()
                nxt = next(todo, None)
                if nxt is not None:
                    pending.append(pool.submit(self.load, self.shards[nxt], self.spec))
                yield data
        finally:
            for fut in pending:
                fut.cancel()  # loads already running finish in the pool; their result is dropped

    def __call__(self) -> Iterator[tuple[np.ndarray, ...]]:
        epoch, start = self.options.epoch + self.calls, self.options.start_step if self.calls == 0 else 0
        self.calls += 1
        batches = self.plan_epoch(epoch)[start:]
        repeats = self.occurrence_plan(epoch)
        repeats = repeats[start:] if repeats is not None else [None] * len(batches)
        shard_of = [np.searchsorted(self.starts, b, side="right") - 1 for b in batches]
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for n, owners in enumerate(shard_of):
            for i in np.unique(owners).tolist():
                first.setdefault(i, n)
                last[i] = n
        loads = self._loaded(sorted(first, key=first.__getitem__))
        live: dict[int, ShardArrays] = {}
        ahead = self.batches_ahead()
        pool = batch_pool() if ahead > 1 else None
        cutting: collections.deque = collections.deque()  # (future, batch) in plan order

        def hand_over(keep: int) -> Iterator[tuple[np.ndarray, ...]]:
            while len(cutting) > keep:
                future, done, occurrence = cutting.popleft()
                yield future.result() + self._extra(epoch, done, occurrence)

        try:
            for n, (batch, owners) in enumerate(zip(batches, shard_of)):
                used = sorted(set(owners.tolist()), key=first.__getitem__)
                try:
                    for i in used:
                        if i not in live:
                            live[i] = next(loads)
                except Exception:
                    yield from hand_over(0)  # a damaged shard: the batches before it first, in order
                    raise
                held = {i: live[i] for i in used}  # a batch being cut keeps its shards alive
                cutting.append((self._cut(pool, batch, owners, held), batch, repeats[n]))
                for i in used:
                    if last[i] == n:
                        del live[i]
                yield from hand_over(ahead - 1)
            yield from hand_over(0)
        finally:
            for future, *_ in cutting:
                future.cancel()  # batches already being cut finish on their thread; dropped
            loads.close()

    def _cut(self, pool: workers.DaemonPool | None, batch: np.ndarray, owners: np.ndarray,
             held: dict[int, ShardArrays]) -> Any:
        """Start cutting a batch on `pool` (whole on one thread), or without a pool cut it
        now, its records spread over the decoder threads; returns its future."""
        if pool is not None:
            return pool.submit(self._emit, batch, owners, held, parallel=False)
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(self._emit(batch, owners, held))
        return done

    def batches_ahead(self) -> int:
        """Batches cut at once (`batches_ahead` of this generator's batch size)."""
        return batches_ahead(self.batch_bytes())

    def batch_bytes(self) -> int:
        """Bytes of one full batch as the generator yields it."""
        bs, spec = self.options.batch_size, self.spec
        if self.expander is not None:
            return sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in self.expander.layout(bs))
        image = spec.image_bytes
        if not spec.segmentation:
            return bs * (image + 8)
        return bs * (image + int(np.prod(spec.mask_shape)) * np.dtype(spec.mask_np_dtype).itemsize)

    def _extra(self, epoch: int, batch: np.ndarray, occurrence: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        augment = self.options.augment
        if augment is None:
            return ()
        from readers.augment import draw_params, repeat_ids

        ids = repeat_ids(self.ids[batch] if self.ids is not None else batch.astype(np.uint64), occurrence)
        return (draw_params(augment, self.spec.height, self.spec.width, self.seed, epoch, ids),)

    def occurrence_plan(self, epoch: int) -> list[np.ndarray] | None:
        """Per batch of `plan_epoch(epoch)`, each sample's earlier copies in the epoch
        (repeat-factor sampling, augmenting); None when no sample repeats."""
        if self.options.repeat_factors is None or self.options.augment is None:
            return None
        from readers.order import replica_occurrences

        return replica_occurrences(self.starts, self.seed, epoch, self.options, self.window)

    def _emit(self, batch: np.ndarray, owners: np.ndarray, live: dict[int, ShardArrays], *,
              parallel: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Gather (and expand) a batch; a contiguous, aligned run of one shard's records is a view.
        `parallel`: spread the records over the decoder threads (else this thread does all)."""
        records = batch - self.starts[owners]
        if self.expander is None and owners[0] == owners[-1] and (owners == owners[0]).all():
            data = live[int(owners[0])]
            lo, hi = int(records[0]), int(records[-1])
            if (isinstance(data.images, np.ndarray) and hi - lo + 1 == len(records) and (np.diff(records) == 1).all()
                    and _aligned(data.images[lo]) and _aligned(data.targets[lo])):
                return data.images[lo:hi + 1], data.targets[lo:hi + 1]
        return self._gather([(live[int(i)], int(r)) for i, r in zip(owners, records)], parallel=parallel)

    def _gather(self, samples: list[tuple[ShardArrays, int]], *, parallel: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Copy (raw), decode (encoded shards) or expand (`self.expander`) the records
        straight into the batch's arrays: pooled, 64-byte aligned blocks that TensorFlow
        takes without a copy. The records are spread over the decoder threads (the
        copies and the C loops release the GIL)."""
        n, expander = len(samples), self.expander
        if expander is not None:
            (x_shape, x_dtype), (y_shape, y_dtype) = expander.layout(n)
        else:
            first = samples[0][0]
            image_shape, x_dtype = row_layout(first.images)
            target_shape, y_dtype = row_layout(first.targets)
            x_shape, y_shape = (n, *image_shape), (n, *target_shape)
        images, _ = reusable_block(x_shape, x_dtype, zeroed=False)
        targets, _ = reusable_block(y_shape, y_dtype, zeroed=False)

        def fill(j: int) -> None:
            data, i = samples[j]
            if expander is not None:
                expander.fill(images, targets, j, data.images[i], data.targets[i])
            else:
                _put(images, j, data.images, i)
                _put(targets, j, data.targets, i)

        if expander is None and not parallel:  # compact, on one thread: read in one go where possible
            _put_all(images, [(data.images, i) for data, i in samples])
            _put_all(targets, [(data.targets, i) for data, i in samples])
        elif parallel:
            parallel_for(n, fill)
        else:
            for j in range(n):
                fill(j)
        return images, targets


def _put(block: np.ndarray, j: int, column: Any, i: int) -> None:
    """block[j] = record i of `column`; a `layouts.ReadColumn` reads it from the file straight into the row."""
    read_into = getattr(column, "read_into", None)
    if read_into is not None:
        read_into(i, block[j])
    else:
        block[j] = column[i]


def _put_all(block: np.ndarray, rows: list[tuple[Any, int]]) -> None:
    """block[j] = record i of column c for (c, i) = rows[j]; records of `layouts.ReadColumn`s
    are read from their files in one call (`layouts.read_rows`)."""
    if all(isinstance(column, layouts.ReadColumn) for column, _ in rows):
        layouts.read_rows(rows, block)
        return
    for j, (column, i) in enumerate(rows):
        block[j] = column[i]


def _aligned(a: Any) -> bool:
    """Whether TensorFlow takes `a` without a copy (64-byte aligned, C-contiguous)."""
    return isinstance(a, np.ndarray) and a.ctypes.data % 64 == 0 and a.flags.c_contiguous


def _cut(flat: np.ndarray, bs: int, drop_remainder: bool) -> list[np.ndarray]:
    """`flat` in consecutive batches of `bs` (the last one shorter unless dropped)."""
    end = len(flat) // bs * bs if drop_remainder else len(flat)
    return [flat[i:min(i + bs, end)] for i in range(0, end, bs)]


__all__ = ["AHEAD_BYTES", "BATCHES_AHEAD", "EXPAND_IN_GENERATOR", "LOADER_THREADS", "SHARDS_AHEAD", "SOURCE",
           "BatchGenerator", "ShardArrays", "batch_pool", "batches_ahead", "expands_in_generator",
           "expansion_is_identity", "generator_dataset", "loader_pool", "python_batches"]
