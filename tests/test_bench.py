"""`imgshard bench` and `scripts/bench_gpu.py` (issue 4): the quick modes run end to end.

Benchmarks are scripts, not timed tests: these tests only check that every pipeline
and measurement runs and lands in the table and the JSON, never how fast anything is.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from converter.bench.options import BenchOptions, quick_options
from converter.bench.report import Target, targets
from converter.bench.suite import BenchResult, Row

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

READER_ROWS = {
    "p1_tf_png", "p2_pydataset_png", "p3_saved_float32", "p3_saved_sparse", "p3_saved_compact", "p4_imgshard_float32",
    "p4_imgshard_sparse", "p5_imgshard_compact", "p5_imgshard_compact_expand", "p6_imgshard_npz_deflate",
    "p6_np_load_deflate",
    "p6_imgshard_npz_none", "p6_np_load_none", "p8_plain_big", "p8_augment_float32", "p8_augment_compact",
    "p8_augment_device_feed", "p9_bands_float32", "p9_bands_augment", "p10_keras_compact", "p10_keras_float32",
    "p10_pydataset_ceiling", "p10_keras_compact_mp", "p10_keras_float32_mp", "p10_pydataset_ceiling_mp", "p11_rotate_float32", "p11_rotate_compact", "p11_albumentations_float32",
    "p11_albumentations_compact", "p11_keras_layers_float32",
}
CONVERT_ROWS = {"decode_floor", "bare_transform", "naive_pillow", "convert_w1", "convert_w2"}


def _env() -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _run_quick(script: str, tmp_path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    """`scripts/SCRIPT --quick` in a child process; its result and the JSON it wrote."""
    out_json = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", script), "--quick", "--cache", str(tmp_path / "cache"),
         "--json", str(out_json), *extra],
        capture_output=True, text=True, env=_env(), timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads(out_json.read_text())


def _check_reader_rows(data: dict, rows: dict, *, kept: int) -> None:
    """Every reader row: `kept` rounds plus one dropped warm-up, median within min-max, its
    share of the bandwidth limit recomputed from the bytes it shows."""
    bw = data["bandwidth"]
    assert len(bw["probes"]) == 2 and bw["median_gb_per_s"] > 0
    trials = [t for p in bw["probes"] for t in p["trials_gb_per_s"]]
    assert bw["min_gb_per_s"] <= bw["median_gb_per_s"] <= bw["max_gb_per_s"] and min(trials) == bw["min_gb_per_s"]
    for key in READER_ROWS:
        row = rows[key]
        assert row["rounds"] == kept + 1 and len(row["repeats"]) == kept and len(row["warmup"]) == 1, key
        assert row["min"] <= row["samples_per_s"] <= row["max"], key
        assert row["samples_per_s"] == pytest.approx(sorted(row["repeats"])[kept // 2] if kept % 2 else
                                                     sum(sorted(row["repeats"])[kept // 2 - 1:kept // 2 + 1]) / 2)
        assert row["bytes_read"] > 0 and row["bytes_written"] == row["bytes_per_sample"] > 0
        assert row["bytes_read_written"] == row["bytes_read"] + row["bytes_written"]
        limit = 2 * bw["median_gb_per_s"] * 1e9 / (row["bytes_read"] + row["bytes_written"])
        assert row["limit_samples_per_s"] == pytest.approx(limit), key
        assert row["share_of_limit"] == pytest.approx(row["samples_per_s"] / limit), key
    h, w = data["options"]["size"]
    c = data["sources"]["classes"]
    assert rows["p4_imgshard_float32"]["bytes_written"] == rows["p3_saved_float32"]["bytes_written"] == 4 * h * w * (3 + c)
    assert rows["p4_imgshard_sparse"]["bytes_written"] == rows["p3_saved_sparse"]["bytes_written"] == 13 * h * w
    assert rows["p5_imgshard_compact"]["bytes_written"] == rows["p3_saved_compact"]["bytes_written"] == 4 * h * w
    comps = data["comparisons"]
    float_vs = comps["imgshard float32 + one-hot vs Dataset.save/load float32 + one-hot"]
    assert len(float_vs["per_round"]) == kept
    assert float_vs["ratio_of_medians"] == pytest.approx(rows["p4_imgshard_float32"]["samples_per_s"]
                                                         / rows["p3_saved_float32"]["samples_per_s"])


@pytest.mark.slow
def test_bench_quick_mode_reports_every_pipeline_and_target(tmp_path):
    proc, data = _run_quick("bench.py", tmp_path, "--repeats", "2", "--convert-repeats", "2")
    rows = {r["key"]: r for r in data["rows"]}
    assert READER_ROWS | CONVERT_ROWS <= set(rows)
    for key, row in rows.items():
        assert row["samples_per_s"] > 0 and math.isfinite(row["samples_per_s"]), key
    _check_reader_rows(data, rows, kept=2)
    assert len(rows["convert_w1"]["repeats"]) == len(rows["convert_w2"]["repeats"]) == 2
    names = {t["name"] for t in data["targets"]}
    assert "reader compact vs Dataset.save/load compact" in names
    assert "reader float32+one-hot share of its bandwidth limit" in names
    assert "converter 2 workers vs 1 (wall clock)" in names
    assert any(k.startswith("reader_tfrecord") for k in data["memory"])
    assert "1. tf.data over PNG" in proc.stdout and "-- targets" in proc.stdout and "copy bandwidth" in proc.stdout
    assert data["machine"]["bytecode_compiled"] is True  # converter start-up measured as a pip install runs it
    storage = data["storage"]
    assert set(storage) == {"raw", "png", "jpeg90", "jpeg95", "webp90"}
    assert storage["png"]["bit_exact"] and all(row["masks_identical"] for row in storage.values())
    assert storage["jpeg90"]["ratio_to_raw"] < 1 and storage["jpeg90"]["cold_median"] > 0
    assert "JPEG q90 PSNR vs raw" in names and "-- storage" in proc.stdout


@pytest.mark.slow
def test_bench_gpu_quick_mode_trains_all_three_feeds_on_cpu(tmp_path):
    proc, data = _run_quick("bench_gpu.py", tmp_path)
    assert [f["name"] for f in data["feeds"]] == ["png_tf_data", "imgshard_compact", "imgshard_compact_augment",
                                                  "in_device_memory"]
    for feed in data["feeds"]:
        assert feed["steps"] == 3 and feed["step_time_s"] > 0
        assert 0.0 <= feed["blocked_on_input_share"] <= 1.0
    assert data["feeds"][3]["vs_ceiling"] == pytest.approx(1.0)
    assert "(b) imgshard compact" in proc.stdout


def test_bench_quick_read_section_runs_every_reader_row_in_interleaved_rounds(tmp_path):
    """The reader rows alone (no conversion timing, storage or memory): fast enough for every run."""
    proc, data = _run_quick("bench.py", tmp_path, "--only", "read", "--repeats", "3")
    rows = {r["key"]: r for r in data["rows"]}
    assert READER_ROWS <= set(rows) and not CONVERT_ROWS & set(rows)
    _check_reader_rows(data, rows, kept=3)
    assert "4 interleaved rounds, the first (warm-up) dropped" in proc.stdout
    assert "-- side by side" in proc.stdout
    assert "imgshard Augment(rotate=10) vs albumentations, compact" in data["comparisons"]


def test_targets_are_ratios_of_medians_and_say_when_unmeasured():
    result = BenchResult(BenchOptions(), {}, {})
    for key, rates in {"p1_tf_png": [40, 50, 45], "p4_imgshard_float32": [1000, 900, 1100]}.items():
        row = result.add(Row(key, key, "reader", 1))
        row.timing.rates.extend(rates)
    by_name = {t.name: t for t in targets(result)}
    vs_p1 = by_name["reader float32+one-hot vs pipeline 1"]
    assert vs_p1.value == pytest.approx(1000 / 45) and vs_p1.met is True
    assert by_name["converter 2 workers vs 1 (wall clock)"].met is None  # not measured: neither met nor missed


def test_rotate_targets_read_cpu_ms_per_sample_and_the_albumentations_ratio():
    result = BenchResult(BenchOptions(), {}, {})
    for key, wall, cpu in (("p11_rotate_compact", [900, 1000, 800], [500, 400, 450]),
                           ("p11_albumentations_compact", [300, 400, 350], [200, 250, 300])):
        row = result.add(Row(key, key, "reader", 1))
        row.timing.rates.extend(wall)
        row.cpu.rates.extend(cpu)
    by_name = {t.name: t for t in targets(result)}
    ms = by_name["augmented rotate=10 compact, CPU-ms per sample"]
    assert ms.value == pytest.approx(1000 / 450) and ms.met is True  # lower is better: 2.22 <= 2.5
    vs = by_name["augmented rotate=10 compact vs albumentations"]
    assert vs.value == pytest.approx(900 / 350) and vs.met is True
    assert by_name["augmented rotate=10 float32+one-hot vs albumentations"].met is None


def test_target_lower_is_better_compares_the_other_way():
    assert Target("overhead", 12.0, 15, False, "%").met is True
    assert Target("overhead", 16.0, 15, False, "%").met is False


def test_bench_options_reject_a_missing_src_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="--src"):
        BenchOptions(src=str(tmp_path / "nope"))


def test_bench_options_reject_a_zero_batch_size():
    with pytest.raises(ValueError, match="batch_size"):
        quick_options(batch_size=0)


def test_process_tree_memory_counts_a_child_forked_during_the_run():
    """The sampler finds processes that join the tree after it started (within RESCAN_SECONDS)."""
    from converter.bench.measure import RESCAN_SECONDS, SAMPLE_SECONDS, run_process

    mb = 1 << 20
    code = (
        "import os, time\n"
        "time.sleep(0.3)\n"  # the tree is scanned at least once before the child exists
        "pid = os.fork()\n"
        "if pid == 0:\n"
        f"    block = bytearray(os.urandom(1024)) * ({160 * mb} // 1024)\n"  # 160 MB, every page touched
        f"    time.sleep({4 * RESCAN_SECONDS + 4 * SAMPLE_SECONDS})\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    run = run_process([sys.executable, "-c", code])
    assert run.returncode == 0, run.stderr
    assert run.max_process_rss >= 160 * mb
    assert run.peak_tree_rss >= 160 * mb


def test_storage_targets_compare_jpeg_size_quality_and_speed():
    from converter.bench.report import storage_targets

    result = BenchResult(BenchOptions(), {}, {})
    result.add(Row("p1_tf_png", "p1", "reader", 1)).timing.rates.extend([40, 50, 45])
    base = {"masks_identical": True, "bit_exact": False, "psnr_db": 37.0, "warm_median": 450.0}
    result.storage = {"raw": {**base, "bit_exact": True, "ratio_to_raw": 1.0},
                      "png": {**base, "bit_exact": True, "ratio_to_raw": 0.6},
                      "jpeg90": {**base, "ratio_to_raw": 0.12}}
    by_name = {t.name: t for t in storage_targets(result)}
    assert by_name["JPEG q90 bytes per sample vs raw"].met is True
    assert by_name["JPEG q90 PSNR vs raw"].met is True
    assert by_name["JPEG q90 float32+one-hot reader vs pipeline 1 (warm)"].value == pytest.approx(10.0)
    result.storage["png"]["masks_identical"] = False
    assert {t.name: t for t in storage_targets(result)}["masks identical in every encoding (1 = yes)"].met is False


def test_drop_from_page_cache_accepts_a_written_file(tmp_path):
    from converter.bench.storage import drop_from_page_cache

    path = tmp_path / "shard.bin"
    path.write_bytes(os.urandom(1 << 16))
    drop_from_page_cache([str(path)])  # clean pages dropped; the file is still whole
    assert len(path.read_bytes()) == 1 << 16


def test_converter_memory_target_checks_the_worst_growth_against_the_stated_bound():
    from converter.bench.memory import CONVERTER_SAMPLE_METADATA_BYTES, converter_growth_bound_bytes
    from converter.run.steal import AHEAD_SAMPLES, HANDOFF_SAMPLES

    bound = converter_growth_bound_bytes(200, 2000, workers=2, size=(512, 512))
    handoff = (HANDOFF_SAMPLES + AHEAD_SAMPLES + 2) * 512 * 512 * 4
    assert bound == 2 * CONVERTER_SAMPLE_METADATA_BYTES * 1800 + handoff
    mb = 1 << 20
    for worst_large, met in ((90 * mb + bound, True), (90 * mb + bound + 1, False)):
        result = BenchResult(BenchOptions(), {}, {})
        result.memory["converter"] = {
            "200": {"peak_tree_rss": 90 * mb, "peak_tree_rss_median": 85 * mb, "peak_tree_rss_min": 80 * mb},
            "2000": {"peak_tree_rss": worst_large, "peak_tree_rss_median": 85 * mb, "peak_tree_rss_min": 84 * mb},
        }
        result.memory["converter_growth_bound"] = bound
        row = {t.name: t for t in targets(result)}["converter peak RSS growth 200->2000 samples within bound"]
        assert row.value == pytest.approx((worst_large - 90 * mb) / 1e6) and row.met is met  # largest vs largest


@pytest.mark.slow
def test_bench_gpu_quick_mode_on_the_jax_backend_runs_without_tensorflow(tmp_path):
    """The GPU machines this project is lent have JAX and no TensorFlow: the jax feeds must
    run with TensorFlow unimportable (a `sitecustomize` that blocks it)."""
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text("import sys\nsys.modules['tensorflow'] = None\n")
    env = _env()
    env["PYTHONPATH"] = str(block) + os.pathsep + env["PYTHONPATH"]
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_gpu.py"), "--quick",
                           "--cache", str(tmp_path / "cache"), "--json", str(out)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["backend"] == "jax"
    assert [f["name"] for f in data["feeds"]] == ["imgshard_float", "imgshard_compact",
                                                  "imgshard_compact_host_augment", "in_device_memory"]
    for feed in data["feeds"]:
        assert feed["steps"] == 3 and feed["step_time_s"] > 0
        assert 0.0 <= feed["blocked_on_input_share"] <= 1.0
    assert "imgshard_compact_device_augment" in data["not_measured"]
    assert "not measured: imgshard_compact_device_augment" in proc.stdout
