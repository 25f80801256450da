"""`imgshard inspect`: describe a converted dataset from its manifest (no shard is read).

Sizes on disk come from `os.stat` (one listing of the prefix for a bucket dataset); source
sizes from the shards' ``source_bytes`` (version 3; the inline fingerprints of versions 1
and 2); per
class pixel shares from the shards' ``class_pixels``. A class's share of a split is its
pixels over all pixels of the split's records (records x H x W), so the class shares
and the ignore share add up to 100%. For classification the share is of records.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Callable

from converter.options import LabelOptions
from readers.files import NotRegularFileError, check_inside, kind_of
from readers.manifest import MANIFEST_NAME, Manifest
from readers.tasks import task_kind

BAR_WIDTH = 12
_EIGHTHS = " ▏▎▍▌▋▊▉█"


def _hex(color) -> str | None:
    return "#{:02x}{:02x}{:02x}".format(*color) if color is not None else None


def _pct(n: int, total: int) -> float:
    return round(100.0 * n / total, 4) if total else 0.0


def _shard_size(root: str, name: str) -> int:
    """Size of shard `name` (stat only, nothing read); `OSError` when it is not a regular
    file inside `root` (symlinks resolved)."""
    path = os.path.join(root, name)
    check_inside(root, path)
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(f"{path} is {kind_of(st.st_mode)}, not a regular file")
    return st.st_size


def _located(path: str | os.PathLike, storage_options: dict | None) -> tuple[str, str, Manifest, Callable[[str], int]]:
    """(root, manifest location, manifest, size of a listed file) of a folder or a bucket
    dataset (sizes from one listing of the prefix; nothing else is read)."""
    from readers.storage.url import is_remote, local_path

    if is_remote(path):
        from readers.remote import list_objects, load_manifest
        from readers.storage import open_store

        url = os.fspath(path)
        store = open_store(url[:-len(MANIFEST_NAME) - 1] if url.endswith("/" + MANIFEST_NAME) else url,
                           storage_options)
        m = load_manifest(store)
        objects = list_objects(store)

        def object_size(name: str) -> int:
            if name not in objects:
                raise FileNotFoundError(store.url_of(name))
            return objects[name].size

        return store.url, store.url_of(MANIFEST_NAME), m, object_size
    root = os.path.abspath(local_path(path))
    if os.path.isfile(root):
        root = os.path.dirname(root)
    return root, os.path.join(root, MANIFEST_NAME), Manifest.load(root), lambda name: _shard_size(root, name)


def describe(path: str | os.PathLike, storage_options: dict | None = None) -> dict[str, Any]:
    """Everything `imgshard inspect` shows, as a JSON-ready dict (`path`: a folder or a bucket URL)."""
    root, manifest_at, m, size_of = _located(path, storage_options)
    h, w, ch = m.image_shape
    segmentation = task_kind(m.task).dense
    splits: dict[str, Any] = {}
    totals = {"samples": 0, "shards": 0, "bytes": 0, "bytes_on_disk": 0, "source_bytes": 0}
    for name in sorted(m.splits):
        entry = m.splits[name]
        on_disk = 0
        problems = []
        for shard in entry.shards:
            try:
                size = size_of(shard.file)
            except FileNotFoundError:
                problems.append(f"{shard.file}: missing")
                continue
            except OSError as e:  # not a regular file, outside the folder, unreadable
                problems.append(f"{shard.file}: {str(e).replace(os.path.join(root, shard.file), 'it', 1)}")
                continue
            on_disk += size
            if size != shard.bytes:
                problems.append(f"{shard.file}: {size} bytes on disk, manifest says {shard.bytes}")
        source = sum(shard.total_source_bytes for shard in entry.shards)  # no index file is read
        nbytes = sum(s.bytes for s in entry.shards)
        n = entry.num_samples
        denom = n * h * w if segmentation else n
        pixels = entry.class_pixels(m.num_classes)
        ignore = sum(s.ignore_pixels for s in entry.shards)
        splits[name] = {
            "samples": n, "shards": len(entry.shards), "bytes": nbytes, "bytes_on_disk": on_disk,
            "source_bytes": source, "ratio_to_sources": round(nbytes / source, 4) if source else None,
            "class_pixels": pixels, "ignore_pixels": ignore, "total_pixels": denom,
            "ignore_share": _pct(ignore, denom) if segmentation else 0.0,
            "class_images": entry.class_images(m.num_classes),
            "problems": problems,
        }
        for k in ("samples", "shards", "bytes", "bytes_on_disk", "source_bytes"):
            totals[k] += splits[name][k]
    totals["ratio_to_sources"] = round(totals["bytes"] / totals["source_bytes"], 4) if totals["source_bytes"] else None
    classes = []
    for i, c in enumerate(m.classes):
        classes.append({
            "index": i, "name": c.name, "color": list(c.color) if c.color is not None else None, "hex": _hex(c.color),
            "share": {sp: _pct(d["class_pixels"][i], d["total_pixels"]) for sp, d in splits.items()},
            "pixels": {sp: d["class_pixels"][i] for sp, d in splits.items()},
        })
        if not segmentation:  # a record per image: the counts are images
            classes[-1]["images"] = {sp: d["class_images"][i] for sp, d in splits.items()}
    return {
        "path": root,
        "manifest": manifest_at,
        "task": m.task,
        "format": m.format,
        "compression": m.compression,
        "tool_version": m.tool_version,
        "image": {"shape": [h, w, ch], "dtype": str(m.image.get("dtype", "uint8"))},
        "mask": dict(m.mask) if m.mask is not None else None,
        "record_shapes": _record_shapes(m),
        "storage": storage(m, totals["bytes"], totals["samples"]),
        "share_unit": "pixels" if segmentation else "records",
        "splits": splits,
        "totals": totals,
        "classes": classes,
        "options": dict(m.options),
        "history": [dict(x) for x in m.history],
    }


def raw_sample_bytes(m: Manifest) -> int:
    """Bytes of one sample's pixels stored raw: the image plus the mask (or an int64 label)."""
    h, w, ch = m.image_shape
    ch *= 2 if m.image.get("dtype") == "uint16" else 1  # bytes per pixel of the image
    if m.mask is None:
        return h * w * ch + 8
    if m.mask.get("encoding") == "onehot":
        return h * w * ch + h * w * m.num_classes
    return h * w * ch + h * w * (2 if m.mask.get("dtype") == "uint16" else 1)


def storage(m: Manifest, total_bytes: int, samples: int) -> dict[str, Any]:
    """How the records are stored: codecs, quality, bytes per sample and the ratio to raw pixels."""
    per_sample = total_bytes / samples if samples else None
    raw = raw_sample_bytes(m)
    return {
        "image_codec": str(m.image.get("codec", "raw")),
        "quality": m.image.get("quality"),
        "mask_codec": str(m.mask.get("codec", "raw")) if m.mask is not None else None,
        "bytes_per_sample": round(per_sample, 1) if per_sample is not None else None,
        "raw_bytes_per_sample": raw,
        "ratio_to_raw": round(per_sample / raw, 4) if per_sample is not None else None,
    }


def _record_shapes(m: Manifest) -> dict[str, Any]:
    h, w, ch = m.image_shape
    shapes: dict[str, Any] = {"image": {"shape": [h, w, ch], "dtype": str(m.image.get("dtype", "uint8"))}}
    if m.mask is not None:
        onehot = m.mask.get("encoding") == "onehot"
        shapes["mask"] = {"shape": [h, w, m.num_classes] if onehot else [h, w], "dtype": m.mask.get("dtype", "uint8")}
    else:
        shapes["label"] = {"shape": [], "dtype": "int64"}
    return shapes


def bar(fraction: float, width: int = BAR_WIDTH) -> str:
    """A bar of `width` cells filled to `fraction` (0..1), in eighths of a cell."""
    fraction = min(max(fraction, 0.0), 1.0)
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    s = "█" * full + (_EIGHTHS[part] if part else "")
    return s.ljust(width)


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return str(n)  # pragma: no cover


def _storage_line(st: dict[str, Any]) -> str:
    codec = st["image_codec"] + (f" q{st['quality']}" if st.get("quality") is not None else "")
    mask = f", masks {st['mask_codec']}" if st.get("mask_codec") else ""
    if st["bytes_per_sample"] is None:
        return f"Storage: images {codec}{mask}; no samples yet"
    return (f"Storage: images {codec}{mask}; {_size(round(st['bytes_per_sample']))} per sample, "
            f"{st['ratio_to_raw']:.3f}x the raw pixels ({_size(st['raw_bytes_per_sample'])}; "
            f"1/{1 / st['ratio_to_raw']:.1f})")


def format_description(d: dict[str, Any], *, color: bool = False) -> str:
    """The text `imgshard inspect` prints; `color` adds 24-bit ANSI colour swatches."""
    out = [f"Dataset: {d['path']}"]
    img = d["image"]
    mask = d["mask"]
    out.append(f"Task: {d['task']}; format: {d['format']}, compression: {d['compression']}; "
               f"written by imgshard {d['tool_version']}")
    shapes = d["record_shapes"]
    parts = [f"image {tuple(img['shape'])} {img['dtype']}"]
    if "mask" in shapes:
        parts.append(f"mask {tuple(shapes['mask']['shape'])} {shapes['mask']['dtype']} ({mask.get('encoding')}, "
                     f"ignore index {mask.get('ignore_index')})")
    else:
        parts.append("label int64")
    out.append("Records: " + ", ".join(parts))
    out.append(_storage_line(d["storage"]))
    out.append("")
    out.append(f"{'split':<12}{'samples':>9}{'shards':>8}{'on disk':>12}{'sources':>12}{'ratio':>8}")
    for name, s in d["splits"].items():
        ratio = f"{s['ratio_to_sources']:.2f}x" if s["ratio_to_sources"] is not None else "?"
        out.append(f"{name:<12}{s['samples']:>9}{s['shards']:>8}{_size(s['bytes_on_disk']):>12}"
                   f"{_size(s['source_bytes']):>12}{ratio:>8}")
        for p in s["problems"]:
            out.append(f"  ! {p} (run imgshard verify)")
    t = d["totals"]
    ratio = f"{t['ratio_to_sources']:.2f}x" if t["ratio_to_sources"] is not None else "?"
    out.append(f"{'total':<12}{t['samples']:>9}{t['shards']:>8}{_size(t['bytes_on_disk']):>12}"
               f"{_size(t['source_bytes']):>12}{ratio:>8}")
    out.append("")
    unit = d["share_unit"]
    splits = list(d["splits"])
    top = max((c["share"][sp] for c in d["classes"] for sp in splits), default=0.0) or 100.0
    out.append(f"Classes: share of {unit} per split (bars scaled to the largest share, {top:.1f}%)")
    width = max([len(c["name"]) for c in d["classes"]] + [5])
    counts = not task_kind(d["task"]).dense  # classification: image counts beside the shares
    col = BAR_WIDTH + 8 + (8 if counts else 0)
    head = f"  {'#':>3} {width * ' '}" + (" " * 10 if task_kind(d["task"]).dense else "")
    out.append(head + "".join(f" {sp[:col - 1]:<{col}}" for sp in splits))
    for c in d["classes"]:
        swatch = ""
        if c["color"] is not None:
            r, g, b = c["color"]
            block = f"\x1b[48;2;{r};{g};{b}m  \x1b[0m" if color else "  "
            swatch = f" {block} {c['hex']}" if color else f" {c['hex']}  "
        cells = "".join(f" {c['share'][sp]:6.2f}%" + (f" {'(%d)' % c['images'][sp]:>7}" if counts else "")
                        + f" {bar(c['share'][sp] / top)}" for sp in splits)
        absent = [sp for sp in splits if c["pixels"][sp] == 0 and d["splits"][sp]["samples"]]
        note = f"  absent from {', '.join(absent)}" if absent else ""
        out.append(f"  {c['index']:>3} {c['name']:<{width}}{swatch}{cells}{note}")
    if task_kind(d["task"]).dense:
        cells = "".join(f" {d['splits'][sp]['ignore_share']:6.2f}% {bar(d['splits'][sp]['ignore_share'] / top)}"
                        for sp in splits)
        out.append(f"  {'':>3} {'(ignore)':<{width}}{' ' * 10}{cells}")
    out.append("")
    out.append("Options: " + ", ".join(f"{k}={_option(k, v)}" for k, v in sorted(d["options"].items())))
    out.append(f"History ({len(d['history'])} run(s)):")
    for h in d["history"][-10:]:
        out.append(f"  {h.get('time', '?')}  added {h.get('added', 0)}, replaced {h.get('replaced', 0)}, "
                   f"pruned {h.get('pruned', 0)}  (imgshard {h.get('tool_version', '?')})")
    return "\n".join(out)


__all__ = ["bar", "describe", "format_description"]


def _option(name: str, value):
    """An option as inspect prints it (mask semantics and mapping in one short phrase)."""
    if name == "labels" and isinstance(value, dict):
        try:
            return f"[{LabelOptions.from_json(value).summary()}]"
        except (TypeError, ValueError):
            return value
    return value
