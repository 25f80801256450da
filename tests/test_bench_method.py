"""The method of `imgshard bench` (issue 19): interleaved rounds with the warm-up dropped, the
copy-bandwidth limit, the fair `tf.data.Dataset.save`/`load` baselines, the generated docs.

No timing is asserted: only the structure (which rounds are kept, what a share is computed
from) and that the baselines deliver exactly the tensors imgshard's readers deliver.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import _shards
from converter.bench.bandwidth import limit_samples_per_s
from converter.bench.options import BenchOptions
from converter.bench.pipelines import Shape
from converter.bench.result import BenchResult, Row
from converter.bench import rounds
from converter.bench.measure import cpu_seconds, descendant_cpu
from converter.bench.rounds import MIN_TIMED_BATCHES, SETTLE_BATCHES, forever, run_rounds, timed_round, wait_quiet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Counting:
    """A fake pipeline: makes iterators over batches of `batch` samples and logs each step."""

    def __init__(self, name: str, log: list, batch: int = 4):
        self.name, self.log, self.batch, self.closed = name, log, batch, 0

    def make(self):
        self.log.append(("start", self.name))

        def gen():
            try:
                while True:
                    self.log.append(("batch", self.name))
                    yield np.zeros((self.batch, 3), np.uint8), np.ones((self.batch,), np.uint8)
            finally:
                self.closed += 1

        return gen()


def test_run_rounds_interleaves_pipelines_and_keeps_the_warm_up_round_apart():
    log: list = []
    fakes = [_Counting("a", log), _Counting("b", log, batch=2)]
    rows = [Row(f.name, f.name, "reader", 1, bytes_read=1) for f in fakes]
    run_rounds([(r, f.make) for r, f in zip(rows, fakes)], 4, 0.0, lambda m: None)
    starts = [name for kind, name in log if kind == "start"]
    assert starts == ["a", "b"] * 4  # round-robin: one round of every pipeline, then the next round
    for row, fake in zip(rows, fakes):
        assert len(row.warmup.rates) == 1 and len(row.timing.rates) == 3  # 4 rounds, the first dropped
        assert len(row.cpu.rates) == 3 and len(row.warmup_cpu.rates) == 1
        assert fake.closed == 4  # every round's iterator closed before the next pipeline ran
    per_round = len([1 for kind, name in log if name == "a" and kind == "batch"]) // 4
    assert per_round == SETTLE_BATCHES + MIN_TIMED_BATCHES


def test_timed_round_counts_only_the_batches_after_the_settling_ones():
    log: list = []
    got = timed_round(_Counting("a", log, batch=5).make, 0.0)
    assert got.batches == MIN_TIMED_BATCHES and got.samples == 5 * MIN_TIMED_BATCHES
    assert got.seconds > 0


def _burn(seconds: float, ended=None) -> None:
    """Busy for `seconds` of CPU time; then the wall time it ended into `ended` (a shared Value)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    if ended is not None:
        ended.value = time.perf_counter()  # CLOCK_MONOTONIC: the same clock in every process


def test_a_rounds_timing_starts_after_the_work_the_last_round_left_behind(monkeypatch):
    """A pipeline closed mid-stream whose threads and processes go on working (Keras' process
    pool sending its queued batches): the next row's round waits for them to end, so their
    CPU is not charged to it."""
    monkeypatch.setattr(rounds, "QUIET_WINDOW", 0.3)  # a starved busy worker still shows in a window
    ctx = multiprocessing.get_context("fork")
    log: list = []
    ends: list = []

    class Leaving(_Counting):
        def make(self):
            inner = super().make()

            def gen():
                try:
                    yield from inner
                finally:
                    child_end, thread_end = ctx.Value("d", 0.0), ctx.Value("d", 0.0)
                    ends.append((child_end, thread_end))
                    ctx.Process(target=_burn, args=(0.6, child_end), daemon=True).start()  # a busy worker
                    threading.Thread(target=_burn, args=(0.4, thread_end), daemon=True).start()  # and a thread

            return gen()

    starts: list = []

    class Timed(_Counting):
        def make(self):
            starts.append(time.perf_counter())
            return super().make()

    fakes = [Leaving("a", log), Timed("b", log)]
    rows = [Row(f.name, f.name, "reader", 1, bytes_read=1) for f in fakes]
    run_rounds([(r, f.make) for r, f in zip(rows, fakes)], 2, 0.0, lambda m: None)
    assert len(ends) == 2 and len(starts) == 2
    for (child_end, thread_end), start in zip(ends, starts):
        assert child_end.value > 0 and thread_end.value > 0
        assert start >= max(child_end.value, thread_end.value)  # b began once a's leftover work had ended


def test_wait_quiet_waits_for_a_busy_worker_process_and_gives_up_at_its_limit(monkeypatch):
    monkeypatch.setattr(rounds, "QUIET_WINDOW", 0.3)
    ctx = multiprocessing.get_context("fork")
    ended = ctx.Value("d", 0.0)
    child = ctx.Process(target=_burn, args=(0.8, ended), daemon=True)
    child.start()
    waited, quiet = wait_quiet()
    assert quiet and ended.value > 0 and time.perf_counter() >= ended.value  # quiet only once it had finished
    child.join()
    child = ctx.Process(target=_burn, args=(30.0,), daemon=True)
    child.start()
    try:
        waited, quiet = wait_quiet(max_seconds=0.5)
        assert not quiet and 0.5 <= waited < 5.0
    finally:
        child.kill()
        child.join()


def test_descendant_cpu_counts_live_worker_processes():
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()

    def work(ev):
        _burn(0.5)
        ev.set()
        time.sleep(30)

    child = ctx.Process(target=work, args=(ready,), daemon=True)
    before_self = cpu_seconds()
    child.start()
    try:
        assert ready.wait(30)
        assert descendant_cpu().get(child.pid, 0.0) >= 0.4  # the child's CPU, which RUSAGE_SELF leaves out
        assert cpu_seconds() - before_self < 0.4
    finally:
        child.kill()
        child.join()


def test_run_rounds_refuses_a_single_round():
    with pytest.raises(ValueError, match="rounds must be at least 2"):
        run_rounds([], 1, 0.0, print)


def test_forever_chains_epochs_and_closing_it_closes_the_running_epoch():
    closed = []

    def epoch():
        try:
            yield from ((np.zeros((2, 1)), None), (np.zeros((1, 1)), None))
        finally:
            closed.append(1)

    it = forever(epoch)()
    sizes = [len(next(it)[0]) for _ in range(5)]
    assert sizes == [2, 1, 2, 1, 2] and closed == [1, 1]
    it.close()
    assert closed == [1, 1, 1]


def test_median_of_the_kept_rounds_lies_between_their_min_and_max():
    row = Row("p5_imgshard_compact", "compact", "reader", 4000, bytes_read=4100)
    row.record(10, 1.0, 1.0, warmup=True)  # the slow first round: dropped
    for samples in (300, 100, 200, 250):
        row.record(samples, 1.0, 1.0)
    out = row.to_json(10.0)
    assert out["warmup"] == [10.0] and out["rounds"] == 5
    assert out["min"] == 100 and out["max"] == 300 and out["samples_per_s"] == 225
    assert out["min"] <= out["samples_per_s"] <= out["max"]


def test_share_of_limit_is_computed_from_the_shown_bytes_read_and_written():
    result = BenchResult(BenchOptions(), {}, {}, bandwidth={"median_gb_per_s": 12.0})
    shape = Shape(512, 512, 5)
    row = result.add(Row("p4_imgshard_float32", "float", "reader", shape.written("float32"), bytes_read=1_050_000))
    row.timing.rates.extend([900.0, 1100.0, 1000.0])
    out = row.to_json(result.bandwidth_gb_per_s)
    assert out["bytes_written"] == 4 * 512 * 512 * 8  # float32 image + 5-class float32 one-hot
    limit = 2 * 12.0e9 / (1_050_000 + 4 * 512 * 512 * 8)
    assert out["bytes_read_written"] == 1_050_000 + 4 * 512 * 512 * 8
    assert out["limit_samples_per_s"] == pytest.approx(limit)
    assert out["share_of_limit"] == pytest.approx(1000.0 / limit) == result.share_of_limit("p4_imgshard_float32")
    assert limit_samples_per_s(12.0, 0, 0) != limit_samples_per_s(12.0, 0, 0)  # nothing moved: NaN, not a limit


def test_bytes_written_per_sample_follow_the_delivered_tensors():
    shape = Shape(4, 6, 3, mask_bytes=2)
    assert shape.written("float32") == 24 * (12 + 12)
    assert shape.written("sparse") == 24 * (12 + 2)
    assert shape.written("compact") == 24 * (3 + 2)


def test_round_ratios_pair_rounds_timed_side_by_side():
    result = BenchResult(BenchOptions(), {}, {})
    result.add(Row("a", "a", "reader", 1)).timing.rates.extend([200.0, 300.0, 100.0])
    result.add(Row("b", "b", "reader", 1)).timing.rates.extend([100.0, 100.0, 100.0])
    r = result.ratio("a", "b")
    assert r["per_round"] == [2.0, 3.0, 1.0] and r["per_round_median"] == 2.0 and r["ratio_of_medians"] == 2.0


def test_bandwidth_probe_runs_in_a_fresh_process_and_reports_gb_per_s():
    proc = subprocess.run([sys.executable, "-m", "converter.bench.bandwidth", "--bytes", str(4 << 20), "--trials", "3"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["bytes"] == 4 << 20 and len(out["trials_gb_per_s"]) == 3
    assert 0 < out["min_gb_per_s"] <= out["median_gb_per_s"] <= out["max_gb_per_s"]


# -- the Dataset.save/load baselines ------------------------------------------------------------------

tf = pytest.importorskip("tensorflow")


@pytest.fixture
def saved(tmp_path):
    """A tiny imgshard dataset (random size and classes), and its records `Dataset.save`d the baseline's way."""
    import readers
    from converter.bench import baselines

    rng = np.random.default_rng(19)
    h, w, c = int(rng.integers(12, 24)), int(rng.integers(12, 24)), int(rng.integers(3, 7))
    _shards.write_dataset(tmp_path / "ds", "tfrecord", splits={"train": 11}, height=h, width=w, num_classes=c, seed=3)
    ds = readers.open(str(tmp_path / "ds"))
    path = str(tmp_path / "saved")
    assert baselines.save_tensors(ds.records("train"), path, image_shape=ds.image_shape) == 11
    records = {r.image.tobytes(): r for r in ds.records("train")}
    return ds, path, records, (h, w, c)


def _dataset_ops(ds) -> list[str]:
    """The chain of dataset ops behind `ds`, from the source to the output."""
    graph = tf.compat.v1.GraphDef.FromString(tf.raw_ops.DatasetToGraphV2(input_dataset=ds._variant_tensor).numpy())
    nodes = {n.name: n for n in graph.node}
    node = next(n for n in graph.node if n.op == "PrefetchDataset")
    chain = [node.op]
    while node.input and node.input[0].split(":")[0] in nodes and "Dataset" in nodes[node.input[0].split(":")[0]].op:
        node = nodes[node.input[0].split(":")[0]]
        chain.append(node.op)
    return chain[::-1]


def test_saved_baseline_is_load_repeat_shuffle_batch_then_a_parallel_map_and_prefetch(saved):
    from converter.bench import baselines

    _, path, _, (h, w, c) = saved
    floats = baselines.saved_tf_dataset(path, 4, shuffle_buffer=8, num_classes=c, mode="float32")
    ops = _dataset_ops(floats)
    assert ops[:4] == ["LoadDataset", "RepeatDataset", ops[2], "BatchDatasetV2"] and ops[2].startswith("Shuffle")
    assert ops[4].startswith("ParallelMapDataset") and ops[5] == "PrefetchDataset" and len(ops) == 6
    assert floats.cardinality() == tf.data.INFINITE_CARDINALITY
    x_spec, y_spec = floats.element_spec
    assert (x_spec.dtype, y_spec.dtype) == (tf.float32, tf.float32)
    assert tuple(x_spec.shape) == (None, h, w, 3) and tuple(y_spec.shape) == (None, h, w, c)
    compact = baselines.saved_tf_dataset(path, 4, shuffle_buffer=8, num_classes=c, mode="compact")
    assert "ParallelMapDataset" not in " ".join(_dataset_ops(compact))
    assert [s.dtype for s in compact.element_spec] == [tf.uint8, tf.uint8]
    sparse = baselines.saved_tf_dataset(path, 4, shuffle_buffer=8, num_classes=c, mode="sparse")
    assert [s.dtype for s in sparse.element_spec] == [tf.float32, tf.uint8]
    assert tuple(sparse.element_spec[1].shape) == (None, h, w)
    with pytest.raises(ValueError, match="mode must be one of"):
        baselines.saved_tf_dataset(path, 4, shuffle_buffer=8, num_classes=c, mode="onehot")


def test_saved_baseline_float_output_equals_the_records_one_hot_and_the_imgshard_reader(saved):
    from converter.bench import baselines

    ds, path, records, (h, w, c) = saved
    floats = baselines.saved_tf_dataset(path, 4, shuffle_buffer=8, num_classes=c, mode="float32", seed=5)
    ours = {}
    for x, y in ds.tf_dataset("train", 4, shuffle=False):  # imgshard's float32 + one-hot reader
        for xi, yi in zip(x.numpy(), y.numpy()):
            ours[np.round(xi * 255).astype(np.uint8).tobytes()] = (xi, yi)
    seen = set()
    for x, y in floats.take(6):  # 24 samples: past the first epoch of 11 (it repeats)
        for xi, yi in zip(x.numpy(), y.numpy()):
            key = np.round(xi * 255).astype(np.uint8).tobytes()
            record = records[key]
            np.testing.assert_array_equal(xi, record.image.astype(np.float32) / 255.0)
            expected = (record.mask[..., None] == np.arange(c)).astype(np.float32)  # ignore (255): all-zero row
            np.testing.assert_array_equal(yi, expected)
            np.testing.assert_allclose(xi, ours[key][0], rtol=0, atol=1e-7)
            np.testing.assert_array_equal(yi, ours[key][1])
            seen.add(key)
    assert len(seen) == 11 and any((r.mask == 255).any() for r in records.values())


def test_saved_baseline_sparse_and_compact_deliver_the_stored_class_map(saved):
    from converter.bench import baselines

    _, path, records, (h, w, c) = saved
    for mode in ("sparse", "compact"):
        pipe = baselines.saved_tf_dataset(path, 3, shuffle_buffer=8, num_classes=c, mode=mode, seed=1)
        for x, y in pipe.take(4):
            for xi, yi in zip(x.numpy(), y.numpy()):
                image = np.round(xi * 255).astype(np.uint8) if mode == "sparse" else xi
                record = records[image.tobytes()]
                np.testing.assert_array_equal(yi, record.mask)
                if mode == "sparse":
                    np.testing.assert_array_equal(xi, record.image.astype(np.float32) / 255.0)
                else:
                    assert xi.dtype == np.uint8


# -- the generated docs ---------------------------------------------------------------------------------

def _bench_json() -> dict:
    reader = {"group": "reader", "min": 900.0, "max": 1300.0, "repeats": [900.0, 1000.0, 1300.0], "warmup": [400.0],
              "bytes_read": 1_050_000, "bytes_written": 8_388_608, "bytes_read_written": 9_438_608,
              "limit_samples_per_s": 3000.0, "share_of_limit": 1000 / 3000, "samples_per_cpu_s": 800.0}
    rows = [dict(reader, key="p3_saved_float32", label="3. save/load float", samples_per_s=400.0),
            dict(reader, key="p4_imgshard_float32", label="4. imgshard float", samples_per_s=1000.0),
            {"key": "convert_w1", "label": "imgshard convert --workers 1", "group": "convert", "samples_per_s": 40.0,
             "min": 39.0, "max": 41.0, "samples_per_cpu_s": 41.0, "note": ""},
            {"key": "convert_w2", "label": "imgshard convert --workers 2", "group": "convert", "samples_per_s": 72.0,
             "min": 70.0, "max": 75.0, "samples_per_cpu_s": 40.0, "note": ""}]
    return {"options": {"repeats": 3, "size": [512, 512], "batch_size": 8, "shuffle_buffer": 64, "min_seconds": 2.0},
            "sources": {"pairs": 150, "generated": True}, "machine": {"cores": 2, "cpu": "EPYC", "loadavg_start": [0.1]},
            "bandwidth": {"median_gb_per_s": 14.2, "min_gb_per_s": 13.0, "max_gb_per_s": 15.0,
                          "probes": [{"bytes": 512 << 20, "median_gb_per_s": 14.2}]},
            "rows": rows, "comparisons": {"converter 2 workers vs 1 (wall clock, run by run)":
                                          {"per_round": [1.8, 1.7, 1.9], "per_round_min": 1.7, "per_round_max": 1.9,
                                           "per_round_median": 1.8, "ratio_of_medians": 1.8}},
            "targets": [{"name": "reader float32+one-hot vs Dataset.save/load float32+one-hot", "value": 2.5,
                         "threshold": 2, "higher_is_better": True, "unit": "x", "met": True}], "seconds": 600}


def _bench_docs(tmp_path, readme_text: str, perf_text: str, *extra: str):
    """`scripts/bench_docs.py` on `_bench_json()` and the two texts; (process, README path, PERFORMANCE path)."""
    readme, perf = tmp_path / "README.md", tmp_path / "PERFORMANCE.md"
    readme.write_text(readme_text)
    perf.write_text(perf_text)
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(_bench_json()))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_docs.py"), str(bench), "--readme",
                           str(readme), "--performance", str(perf), *extra], capture_output=True, text=True, timeout=60)
    return proc, readme, perf


def test_bench_docs_rewrite_only_the_marked_parts_with_the_runs_numbers(tmp_path):
    proc, readme, perf = _bench_docs(
        tmp_path, "# t\nbefore\n<!-- bench:readme -->\nold table\n<!-- /bench:readme -->\nafter\n",
        "intro\n<!-- bench:performance -->\nold\n<!-- /bench:performance -->\nend\n",
        "--note", "shared machine, preliminary")
    assert proc.returncode == 0, proc.stderr
    text = readme.read_text()
    assert text.startswith("# t\nbefore\n<!-- bench:readme -->\n") and text.endswith("<!-- /bench:readme -->\nafter\n")
    assert "old table" not in text and "**shared machine, preliminary**" in text
    assert "| **imgshard, float32 + one-hot** | 1,000 (900-1,300) | 2.50x | 33% |" in text
    assert "| 2 workers vs 1 | 1.80x (run by run 1.70-1.90x, 3 runs) | |" in text
    ptext = perf.read_text()
    assert "| 4. imgshard float | 1,000 | 900-1,300 | 3 + 1 | 1.05 + 8.39 = 9.44 | 3,000 | 33% | 800 |" in ptext
    assert "14.2 GB/s" in ptext and "| reader float32+one-hot vs Dataset.save/load float32+one-hot | 2.50x" in ptext
    assert ptext.startswith("intro\n") and ptext.endswith("<!-- /bench:performance -->\nend\n")


def test_bench_docs_name_the_missing_markers_and_change_nothing(tmp_path):
    perf_text = "<!-- bench:performance -->\nold\n<!-- /bench:performance -->\n"
    proc, readme, perf = _bench_docs(tmp_path, "no markers here\n", perf_text)
    assert perf.read_text() == perf_text  # checked before either file is written
    assert proc.returncode == 2 and "<!-- bench:readme -->" in proc.stderr and "README.md" in proc.stderr
    assert readme.read_text() == "no markers here\n"


def test_bench_docs_refuse_a_json_without_reader_rows(tmp_path):
    from converter.bench.markdown import check_bench_json

    with pytest.raises(ValueError, match="no reader rows"):
        check_bench_json({"options": {}, "rows": [{"group": "convert"}]}, "bench.json")
    with pytest.raises(ValueError, match="not the JSON of an `imgshard bench"):
        check_bench_json([1, 2], "bench.json")
