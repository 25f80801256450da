"""The table, the targets of issues 4, 16 and 19 and the JSON of one benchmark run."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from converter.bench.result import BenchResult


@dataclass(frozen=True)
class Target:
    name: str
    value: float
    threshold: float
    higher_is_better: bool
    unit: str = "x"

    @property
    def met(self) -> bool | None:
        if math.isnan(self.value):
            return None
        return self.value >= self.threshold if self.higher_is_better else self.value <= self.threshold

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "threshold": self.threshold,
                "higher_is_better": self.higher_is_better, "unit": self.unit, "met": self.met}

    def line(self) -> str:
        verdict = {True: "MET", False: "NOT MET", None: "not measured"}[self.met]
        op = ">=" if self.higher_is_better else "<="
        return f"{verdict:>12}  {self.name}: {self.value:.2f}{self.unit} (target {op} {self.threshold:g}{self.unit})"


def _ratio(result: "BenchResult", a: str, b: str, *, cpu: bool = False) -> float:
    x, y = result.rate(a, cpu=cpu), result.rate(b, cpu=cpu)
    return x / y if y and not math.isnan(x) and not math.isnan(y) else float("nan")


def _cpu_ms(result: "BenchResult", key: str) -> float:
    rate = result.rate(key, cpu=True) if key in result.rows else float("nan")
    return 1000 / rate if rate and not math.isnan(rate) else float("nan")


def rotate_targets(result: "BenchResult") -> list[Target]:
    """Issue 29: the rotate=10 recipe in CPU-ms per sample (the whole reader: read, augment,
    hand-over) and against albumentations, float32 + one-hot and compact."""
    out = []
    for form, key in (("float32+one-hot", "float32"), ("compact", "compact")):
        out += [Target(f"augmented rotate=10 {form}, CPU-ms per sample", _cpu_ms(result, f"p11_rotate_{key}"), 2.5,
                       False, " ms"),
                Target(f"augmented rotate=10 {form} vs albumentations",
                       _ratio(result, f"p11_rotate_{key}", f"p11_albumentations_{key}"), 2, True)]
    return out


def keras_targets(result: "BenchResult") -> list[Target]:
    """Issue 30: keras_dataset (through Keras' own adapter) against tf_dataset and against the
    ceiling of Keras' machinery (ready batches), with threads and with processes."""
    out = []
    for suffix, how in (("", "threads"), ("_mp", "processes")):
        out += [
            Target(f"keras_dataset compact vs tf_dataset compact ({how})",
                   _ratio(result, f"p10_keras_compact{suffix}", "p5_imgshard_compact"), 0.5, True),
            Target(f"keras_dataset float32 vs tf_dataset float32 ({how})",
                   _ratio(result, f"p10_keras_float32{suffix}", "p4_imgshard_float32"), 0.5, True),
            Target(f"keras_dataset float32 vs in-memory PyDataset, Keras' ceiling ({how})",
                   100 * _ratio(result, f"p10_keras_float32{suffix}", f"p10_pydataset_ceiling{suffix}"), 80, True,
                   "%"),
        ]
    return out


def targets(result: "BenchResult") -> list[Target]:
    """Every target of issues 4 and 19 that this run measured (ratios of medians)."""
    out = [
        Target("reader float32+one-hot vs Dataset.save/load float32+one-hot",
               _ratio(result, "p4_imgshard_float32", "p3_saved_float32"), 2, True),
        Target("reader float32+one-hot share of its bandwidth limit",
               100 * result.share_of_limit("p4_imgshard_float32"), 40, True, "%"),
        Target("reader compact vs Dataset.save/load compact",
               _ratio(result, "p5_imgshard_compact", "p3_saved_compact"), 2, True),
        Target("reader compact share of its bandwidth limit",
               100 * result.share_of_limit("p5_imgshard_compact"), 50, True, "%"),
        Target("reader float32+one-hot vs pipeline 1", _ratio(result, "p4_imgshard_float32", "p1_tf_png"), 20, True),
        Target("reader compact vs pipeline 1", _ratio(result, "p5_imgshard_compact", "p1_tf_png"), 45, True),
        Target("augmented float32+one-hot vs pipeline 1", _ratio(result, "p8_augment_float32", "p1_tf_png"), 10, True),
        Target("augmented float32+one-hot vs un-augmented reader",
               _ratio(result, "p8_augment_float32", "p4_imgshard_float32"), 0.5, True),
        *rotate_targets(result),
        Target("NPZ reader (compressed) vs np.load loop",
               _ratio(result, "p6_imgshard_npz_deflate", "p6_np_load_deflate"), 2, True),
        Target("NPZ reader (stored) vs np.load loop", _ratio(result, "p6_imgshard_npz_none", "p6_np_load_none"), 2, True),
        Target("converter 2 workers vs 1 (wall clock)", _ratio(result, "convert_w2", "convert_w1"), 1.8, True),
        Target("converter per core vs naive Pillow loop (per CPU-second)",
               _ratio(result, "convert_w1", "naive_pillow", cpu=True), 1.5, True),
        Target("tool overhead over bare decode+resize+lookup (CPU time)",
               100 * (_ratio(result, "bare_transform", "convert_w1", cpu=True) - 1), 15, False, "%"),
    ]
    out += storage_targets(result) + keras_targets(result)
    conv = result.memory.get("converter")
    if conv and len(conv) == 2:
        small, large = (conv[k] for k in sorted(conv, key=int))
        counts = "->".join(sorted(conv, key=int))
        bound = result.memory.get("converter_growth_bound")
        if bound is None:  # a result file from before the bound: the old percentage row
            out.append(Target(f"converter peak RSS growth {counts} samples",
                              100 * (large["peak_tree_rss"] / small["peak_tree_rss"] - 1), 10, False, "%"))
        else:  # the largest run at each count: sampling the tree can miss a peak (a worker not yet
            # forked or already gone when sampled), never invent one, so the largest is the best estimate
            growth = large["peak_tree_rss"] - small["peak_tree_rss"]
            out.append(Target(f"converter peak RSS growth {counts} samples within bound", growth / 1e6, bound / 1e6,
                              False, " MB"))
    for key, m in sorted(result.memory.items()):
        if key.startswith("reader_"):
            out.append(Target(f"reader RSS growth within bound ({key[7:]})", m["growth"] / 1e6, m["bound"] / 1e6,
                              False, " MB"))
    return out


def storage_targets(result: "BenchResult") -> list[Target]:
    """Targets of the storage section (issue 16), when it ran."""
    st = result.storage
    if not st or "jpeg90" not in st:
        return []
    jpeg, png = st["jpeg90"], st.get("png", {})
    every_mask = all(row["masks_identical"] for row in st.values())
    return [
        Target("JPEG q90 bytes per sample vs raw", jpeg["ratio_to_raw"], 1 / 6, False),
        Target("JPEG q90 PSNR vs raw", float(jpeg["psnr_db"] or float("nan")), 36, True, " dB"),
        Target("PNG images bit-exact with raw (1 = yes)", float(bool(png.get("bit_exact"))), 1, True, ""),
        Target("masks identical in every encoding (1 = yes)", float(every_mask), 1, True, ""),
        Target("JPEG q90 float32+one-hot reader vs pipeline 1 (warm)",
               jpeg["warm_median"] / result.rate("p1_tf_png") if result.rate("p1_tf_png") else float("nan"), 8, True),
        Target("JPEG q90 float32+one-hot reader vs pipeline 1 (per CPU-second)",
               jpeg.get("warm_cpu_median", float("nan")) / result.rate("p1_tf_png", cpu=True)
               if result.rate("p1_tf_png", cpu=True) else float("nan"), 8, True),
    ]


def _reader_line(row: Any, base: float, bw: float) -> str:
    rate, (lo, hi) = row.timing.median, row.timing.spread
    limit = row.limit(bw)
    share = f"{100 * rate / limit:>5.0f}%" if limit > 0 else f"{'':>6}"
    per_cpu = f"{row.cpu.median:>9.0f}" if row.cpu.rates else f"{'':>9}"
    vs = rate / base if base and not math.isnan(base) else float("nan")
    return (f"{row.label:<62} {rate:>9.0f} {lo:>7.0f}-{hi:<7.0f} {vs:>7.2f} {row.bytes_read / 1e6:>6.2f}+"
            f"{row.bytes_per_sample / 1e6:<6.2f} {limit:>7.0f} {share}  {per_cpu}" + (f"  {row.note}" if row.note else ""))


def reader_table(result: "BenchResult") -> list[str]:
    """The reader rows: median and min-max of the kept rounds, bytes read + written, share of the limit."""
    o, bw = result.options, result.bandwidth_gb_per_s
    rows = [r for r in result.rows.values() if r.group == "reader"]
    if not rows:
        return []
    rounds = max(len(r.timing.rates) + len(r.warmup.rates) for r in rows)
    lines = [f"-- reading (batch {o.batch_size}, shuffled, buffer {o.shuffle_buffer}): {rounds} interleaved rounds, "
             f"the first (warm-up) dropped; median and min-max of the other {rounds - 1}"]
    if result.bandwidth:
        b = result.bandwidth
        lines.append(f"   copy bandwidth {bw:.1f} GB/s (numpy copyto, fresh process, {len(b['probes'])} probes, "
                     f"{b['min_gb_per_s']:.1f}-{b['max_gb_per_s']:.1f}); limit = 2 x bandwidth / (bytes read + "
                     "written per sample)")
    lines.append(f"{'pipeline':<62} {'samples/s':>9} {'min-max':>15} {'x p1':>7} {'MB read+written':>13} "
                 f"{'limit/s':>7} {'share':>6}  {'per CPU-s':>9}")
    base = result.rate("p1_tf_png")
    lines += [_reader_line(r, base, bw) for r in rows]
    return lines


def comparison_lines(result: "BenchResult") -> list[str]:
    """imgshard against its baselines (and 2 workers against 1): ratio of medians, per-round ratios."""
    from converter.bench.result import COMPARISONS

    lines = ["-- side by side (ratio of medians; per-round ratios: median, min-max)"]
    for name, a, b in COMPARISONS:
        if a in result.rows and b in result.rows:
            r = result.ratio(a, b)
            lines.append(f"{name:<72} {r['ratio_of_medians']:>6.2f}x   per round {r['per_round_median']:.2f}x "
                         f"({r['per_round_min']:.2f}-{r['per_round_max']:.2f}, {len(r['per_round'])} rounds)")
    return lines if len(lines) > 1 else []


def _other_line(row: Any, base: float) -> str:
    lo, hi = row.timing.spread
    if row.group == "probe":
        return f"{row.label:<62} {row.timing.median:>9.2f}x {'':>8} {'':>7}  {lo:>7.2f}-{hi:<7.2f}  {row.note}"
    rate = row.timing.median
    ratio = rate / base if base and not math.isnan(base) else float("nan")
    per_cpu = f"{row.cpu.median:>9.1f}" if row.cpu.rates else f"{'':>9}"
    return (f"{row.label:<62} {rate:>10.1f} {rate * row.bytes_per_sample / 1e6:>8.0f} {ratio:>7.2f}  "
            f"{lo:>7.1f}-{hi:<7.1f}  {per_cpu}" + (f"  {row.note}" if row.note else ""))


def table(result: "BenchResult") -> str:
    base = result.rate("p1_tf_png")
    lines = []
    others = [r for r in result.rows.values() if r.group != "reader"]
    if others:
        lines.append(f"{'pipeline':<62} {'samples/s':>10} {'MB/s':>8} {'x p1':>7}  {'min-max':>15}  {'per CPU-s':>9}")
    group = None
    for row in others:
        if row.group != group:
            group = row.group
            lines.append("-- " + {"convert": f"conversion (samples/s of source pairs; MB/s of source files; median of "
                                              f"{len(row.timing.rates)} interleaved runs)",
                                   "probe": "machine"}[group])
        lines.append(_other_line(row, base))
    lines += reader_table(result)
    lines += comparison_lines(result)
    lines += memory_lines(result)
    if result.storage:
        from converter.bench.storage import storage_table

        lines.append(storage_table(result.storage, result.rate("p1_tf_png"), result.rate("p1_tf_png", cpu=True)))
    lines.append("-- targets (issues 4, 16 and 19)")
    lines += [t.line() for t in targets(result)]
    return "\n".join(lines)


def memory_lines(result: "BenchResult") -> list[str]:
    mem = result.memory
    if not mem:
        return []
    lines = ["-- memory (MB)"]
    for key, m in sorted(mem.items()):
        if key.startswith("reader_"):
            lines.append(f"reader {key[7:]:<20} baseline {m['baseline_rss'] / 1e6:8.0f}  peak {m['peak_rss'] / 1e6:8.0f}"
                         f"  growth {m['growth'] / 1e6:7.0f}  bound {m['bound'] / 1e6:7.0f}")
    for n, m in sorted(mem.get("converter", {}).items(), key=lambda kv: int(kv[0])):
        spread = (f" (median {m['peak_tree_rss_median'] / 1e6:.0f}, min {m['peak_tree_rss_min'] / 1e6:.0f})"
                  if "peak_tree_rss_median" in m else "")
        lines.append(f"converter {n:>6} samples ({m['workers']} workers): peak tree RSS {m['peak_tree_rss'] / 1e6:7.0f}"
                     f"{spread}  largest process {m['max_process_rss'] / 1e6:7.0f}")
    if "converter_growth_bound" in mem:
        lines.append(f"converter growth bound {mem['converter_growth_bound'] / 1e6:7.1f} (per-sample metadata + "
                     "work-stealing hand-off)")
    for key in ("convert_w1", "convert_w2"):
        row = result.rows.get(key)
        if row is not None and row.extra.get("peak_tree_rss"):
            lines.append(f"{row.label} ({result.sources['pairs']}-pair run): peak tree RSS "
                         f"{max(row.extra['peak_tree_rss']) / 1e6:7.0f}  largest process "
                         f"{max(row.extra['max_process_rss']) / 1e6:7.0f}")
    return lines


def header(result: "BenchResult") -> str:
    m, s, o = result.machine, result.sources, result.options
    return (f"imgshard bench: {s['pairs']} pairs ({'generated' if s['generated'] else s['root']}, "
            f"{s['bytes'] / 1e6:.0f} MB of PNG), {s['classes']} classes -> {o.size[0]}x{o.size[1]}, batch {o.batch_size}, "
            f"shuffle buffer {o.shuffle_buffer}; readers: {o.repeats + 1} interleaved rounds of >= {o.min_seconds:g} s, "
            f"the first dropped; conversion: median of {o.convert_repeats} interleaved runs\n"
            f"machine: {m['cpu']}, {m['cores']} cores, {m['memory_bytes'] / 2**30:.0f} GiB, load "
            f"{m['loadavg_start']} at start; TensorFlow {m['tensorflow']}, Python {m['python']}, Pillow "
            f"{m.get('pillow', '?')}; PNG decoder: {m.get('png_decoder', '?')}, image resize: "
            f"{m.get('image_resize', '?')}, augmentation: {m.get('augment', '?')}; {result.seconds:.0f} s"
            + ("" if m.get("bytecode_compiled", True) else
               "\nnote: the project's bytecode could not be written (read-only checkout?): every `imgshard convert` "
               "started here compiled its modules from source, which a pip-installed copy does not"))


def write_json(result: "BenchResult", path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({**result.to_json(), "targets": [t.to_json() for t in targets(result)]}, f, indent=1, default=str)
    os.replace(tmp, path)
