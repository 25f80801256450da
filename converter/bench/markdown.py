"""The README's and docs/PERFORMANCE.md's measured tables, regenerated from a bench JSON.

    python scripts/bench_docs.py bench.json [--note "shared machine, preliminary"]

rewrites what lies between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` in the
README (NAME ``readme``) and in docs/PERFORMANCE.md (NAME ``performance``), and nothing
else. Every number comes from the JSON `imgshard bench --json` wrote (medians of the kept
rounds, their min-max, bytes per sample, the bandwidth limit, the targets).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

#: The README's reader rows (key, label), in order; those the run lacks are left out.
README_ROWS = (
    ("p1_tf_png", "`tf.data` over raw PNGs (decode, resize, one-hot)"),
    ("p3_saved_float32", "`Dataset.save`/`load`, float32 + one-hot"),
    ("p4_imgshard_float32", "**imgshard, float32 + one-hot**"),
    ("p3_saved_sparse", "`Dataset.save`/`load`, float32 + sparse labels"),
    ("p4_imgshard_sparse", "**imgshard, float32 + sparse labels** (`one_hot=False`)"),
    ("p3_saved_compact", "`Dataset.save`/`load`, compact uint8"),
    ("p5_imgshard_compact", "**imgshard, compact uint8** (`one_hot=False, normalize=False`)"),
    ("p8_augment_float32", None),  # None: the row's own label (it names the sizes)
    ("p11_rotate_compact", "imgshard `Augment(rotate=10, ...)`, compact"),
    ("p11_albumentations_compact", "albumentations, same recipe, 2 threads, compact"),
)
#: Which baseline each README row is compared with ("x save/load" column).
BASELINE_OF = {"p4_imgshard_float32": "p3_saved_float32", "p4_imgshard_sparse": "p3_saved_sparse",
               "p5_imgshard_compact": "p3_saved_compact"}


def _fmt(x: float, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:,.{digits}f}"


def _rows(data: dict) -> dict[str, dict]:
    return {r["key"]: r for r in data.get("rows", [])}


def _share(row: dict) -> str:
    share = row.get("share_of_limit")
    if share is None or (isinstance(share, float) and math.isnan(share)):
        return "n/a"
    return "<1%" if share < 0.01 else f"{100 * share:.0f}%"


def run_line(data: dict, note: str = "") -> str:
    """One sentence saying what was run, where and how."""
    o, s, m, bw = data["options"], data["sources"], data["machine"], data.get("bandwidth", {})
    rounds = o["repeats"] + 1
    text = (f"{s['pairs']} {'generated' if s['generated'] else 'real'} pairs -> {o['size'][0]}x{o['size'][1]}, "
            f"batch {o['batch_size']}, shuffle buffer {o['shuffle_buffer']}; {rounds} interleaved rounds of >= "
            f"{o['min_seconds']:g} s per reader, the first dropped, medians (min-max) of the other {rounds - 1}; "
            f"{m.get('cores', '?')} cores ({m.get('cpu', '?')}), load {m.get('loadavg_start', '?')} at start")
    probe = _rows(data).get("cpu_scaling")
    if probe:
        text += f"; CPU probe {probe['samples_per_s']:.2f}x (2.0 = two free cores)"
    if bw:
        text += f"; copy bandwidth {bw['median_gb_per_s']:.1f} GB/s"
    return text + (f". **{note}**" if note else ".")


def readme_tables(data: dict, note: str = "") -> str:
    """The README's two small tables: readers against `Dataset.save`/`load`, and conversion."""
    rows = _rows(data)
    out = [f"`imgshard bench --json bench.json`: {run_line(data, note)}", "",
           f"| reader ({data['options']['size'][0]}x{data['options']['size'][1]}, batch {data['options']['batch_size']}) "
           "| samples/s (min-max) | x `save`/`load`, same output | share of bandwidth limit |",
           "| --- | ---: | ---: | ---: |"]
    for key, label in README_ROWS:
        r = rows.get(key)
        if r is None:
            continue
        label = label or r["label"].split(". ", 1)[-1]
        base = rows.get(BASELINE_OF.get(key, ""))
        vs = _fmt(r["samples_per_s"] / base["samples_per_s"], 2) + "x" if base and base["samples_per_s"] else ""
        out.append(f"| {label} | {_fmt(r['samples_per_s'])} ({_fmt(r['min'])}-{_fmt(r['max'])}) | {vs} | {_share(r)} |")
    w1, w2 = rows.get("convert_w1"), rows.get("convert_w2")
    if w1 and w2:
        per = data.get("comparisons", {}).get("converter 2 workers vs 1 (wall clock, run by run)", {})
        out += ["", f"| conversion, {data['sources']['pairs']} source pairs | samples/s (min-max) | per CPU-second |", "| --- | ---: | ---: |"]
        for r in (w1, w2):
            out.append(f"| `imgshard convert --workers {r['key'][-1]}` | {_fmt(r['samples_per_s'], 1)} "
                       f"({_fmt(r['min'], 1)}-{_fmt(r['max'], 1)}) | {_fmt(r['samples_per_cpu_s'], 1)} |")
        out.append(f"| 2 workers vs 1 | {_fmt(w2['samples_per_s'] / w1['samples_per_s'], 2)}x (run by run "
                   f"{_fmt(per.get('per_round_min'), 2)}-{_fmt(per.get('per_round_max'), 2)}x, "
                   f"{len(per.get('per_round', []))} runs) | |")
    return "\n".join(out)


def reader_table(data: dict) -> list[str]:
    """Every reader row: median, min-max, rounds kept/dropped, bytes read + written, limit, share."""
    out = ["| pipeline | samples/s | min-max | rounds (kept + warm-up) | bytes read + written per sample (MB) "
           "| limit/s | share of limit | per CPU-s |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in data.get("rows", []):
        if r["group"] != "reader":
            continue
        out.append(f"| {r['label']} | {_fmt(r['samples_per_s'])} | {_fmt(r['min'])}-{_fmt(r['max'])} | "
                   f"{len(r['repeats'])} + {len(r['warmup'])} | {r['bytes_read'] / 1e6:.2f} + "
                   f"{r['bytes_written'] / 1e6:.2f} = {r['bytes_read_written'] / 1e6:.2f} | "
                   f"{_fmt(r['limit_samples_per_s'])} | {_share(r)} | {_fmt(r.get('samples_per_cpu_s'))} |")
    return out


def performance_section(data: dict, note: str = "") -> str:
    """docs/PERFORMANCE.md's generated part: the run, every reader row, side by side, conversion, targets."""
    bw = data.get("bandwidth", {})
    out = [f"Run: {run_line(data, note)} Total {data.get('seconds', 0):.0f} s.", ""]
    if bw:
        probes = ", ".join(f"{p['median_gb_per_s']:.1f}" for p in bw["probes"])
        out += [f"Copy bandwidth (numpy `copyto` of {bw['probes'][0]['bytes'] >> 20} MiB, fresh process, before and "
                f"after the reader rounds): {bw['median_gb_per_s']:.1f} GB/s (median of all trials; probes {probes}; "
                f"{bw['min_gb_per_s']:.1f}-{bw['max_gb_per_s']:.1f}). Limit = 2 x bandwidth / (bytes read + written "
                "per sample).", ""]
    out += reader_table(data)
    comps = data.get("comparisons", {})
    if comps:
        out += ["", "| side by side | ratio of medians | per round: median (min-max) |", "| --- | ---: | ---: |"]
        for name, c in comps.items():
            out.append(f"| {name} | {_fmt(c['ratio_of_medians'], 2)}x | {_fmt(c['per_round_median'], 2)}x "
                       f"({_fmt(c['per_round_min'], 2)}-{_fmt(c['per_round_max'], 2)}) |")
    convert = [r for r in data.get("rows", []) if r["group"] == "convert"]
    if convert:
        out += ["", "| conversion | samples/s (median) | min-max | per CPU-s | note |", "| --- | ---: | ---: | ---: | --- |"]
        out += [f"| {r['label']} | {_fmt(r['samples_per_s'], 1)} | {_fmt(r['min'], 1)}-{_fmt(r['max'], 1)} | "
                f"{_fmt(r.get('samples_per_cpu_s'), 1)} | {r['note']} |" for r in convert]
    if data.get("targets"):
        out += ["", "| target | value | threshold | verdict |", "| --- | ---: | ---: | --- |"]
        for t in data["targets"]:
            verdict = {True: "met", False: "**not met**", None: "not measured"}[t["met"]]
            op = ">=" if t["higher_is_better"] else "<="
            out.append(f"| {t['name']} | {_fmt(t['value'], 2)}{t['unit']} | {op} {t['threshold']:.3g}{t['unit']} | "
                       f"{verdict} |")
    return "\n".join(out)


def replace_between_markers(text: str, name: str, content: str, *, path: str = "the file") -> str:
    """`text` with what lies between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` replaced."""
    pattern = re.compile(rf"(<!-- bench:{re.escape(name)} -->\n).*?(\n<!-- /bench:{re.escape(name)} -->)", re.S)
    if len(pattern.findall(text)) != 1:
        raise ValueError(f"{path} must hold exactly one pair of markers <!-- bench:{name} --> ... "
                         f"<!-- /bench:{name} --> (each on its own line) for the generated part. Received: "
                         f"{len(pattern.findall(text))} pairs; add them where the table belongs")
    return pattern.sub(lambda m: m.group(1) + content + m.group(2), text)


def update_docs(data: dict, *, readme: str, performance: str, note: str = "") -> list[str]:
    """Rewrite the generated parts of `readme` and `performance` (files); returns the paths written.
    Both files are checked before either is written."""
    new_texts = []
    for path, name, content in ((readme, "readme", readme_tables(data, note)),
                                (performance, "performance", performance_section(data, note))):
        with open(path, encoding="utf-8") as f:
            new_texts.append((path, replace_between_markers(f.read(), name, content, path=path)))
    for path, text in new_texts:
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    return [path for path, _ in new_texts]


def check_bench_json(data: Any, path: str) -> dict:
    """`data` if it is an `imgshard bench` JSON with reader rows; else a ValueError naming `path`."""
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) or "options" not in data:
        raise ValueError(f"{path} is not the JSON of an `imgshard bench --json` run (expected an object with "
                         f"'options' and 'rows'). Received: {type(data).__name__}")
    if not any(r.get("group") == "reader" for r in data["rows"]):
        raise ValueError(f"{path} holds no reader rows: run `imgshard bench` with the read section "
                         f"(no --only, or --only read,...). Received: {len(data['rows'])} other rows")
    return data


__all__ = ["check_bench_json", "performance_section", "readme_tables", "replace_between_markers", "update_docs"]
