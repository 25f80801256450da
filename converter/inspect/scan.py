"""`imgshard scan`: check raw sources before converting them.

Same discovery, decoding and colour rules as `convert` (`converter.discover`,
`converter.transform.decode`, `converter.transform.colormap`), so what scan calls bad
is what convert would refuse, with the same `DecodeError` kinds. Workers (forked where
safe, else loky: `converter.run.execute.map_unordered`) decode each pair once and send back a small `FileSummary`: sizes, modes,
hashes, per-class pixel counts and the colours that matched no class. No pixel array
crosses a process boundary. The parent then:

* counts mask colours per class (pixel share and file count) and lists unknown colours
  with their nearest class, distance (Chebyshev, what ``--color-tolerance`` measures),
  the tolerance that would snap them and whether that snap would be ambiguous;
* finds classes of the CSV that never occur (overall and per split);
* groups exact duplicate images by content hash (sha256 of the decoded pixels, so a
  PNG saved twice with other settings still matches) within and across splits;
* tallies image sizes and modes;
* builds a verdict: the exact `imgshard convert` flags that would succeed.

Everything is deterministic: summaries are sorted by key before they are aggregated.
"""

from __future__ import annotations

import functools
import shlex
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from converter.discover.files import WithStorage, read_memo, source_scope
from converter.discover.labels import auto_semantics, resolve_labels
from converter.inspect.scan_colours import census_classes, census_verdict, counted_as_classes, needs_census
from converter.discover.layout import BadInput, SourceSample
from converter.discover.layouts import discover
from converter.inspect.scan_labels import (
    apply_labels,
    format_labels,
    given_label_args,
    labels_section,
    resolve_for_scan,
    source_args,
    source_positional,
    suggest_size,
    value_summary,
)
from converter.discover.annotations.coco import passed_over
from converter.discover.content import ContentTie
from converter.inspect.scan_images import (band_order, band_spec_from_tie, decode_for_scan, format_images,
                                           image_verdict, images_section)
from converter.inspect.scan_readings import format_readings, reading_problems, readings_section
from converter.options import ANNOTATION_FORMATS, ExifMode, LabelOptions, MaskSemantics, SourceSpec, Task
from converter.run.execute import map_unordered
from converter.transform.colormap import AMBIGUOUS, ColorMap, UnknownColors
from converter.transform.decode import DecodeError, decode_mask, read_source
from converter.transform.exif import apply_orientation, orientation_of
from converter.transform.sample import UnknownColorError, relative_key_path
from converter.inspect.scan_core import (
    EXAMPLES,
    MAX_UNKNOWN_COLORS_PER_FILE,
    Color,
    FileSummary,
    ScanOptions,
    bad_input,
    find_duplicates,
    file_header,
    format_bad_inputs,
    format_verdict,
    image_stats,
    pixel_hash,
    run_batched,
    share,
)
from readers.manifest import ClassInfo
from readers.tasks import task_kind

if TYPE_CHECKING:
    from converter.inspect.scan_classification import ClassScanReport

#: The verdict suggests snapping only colours at most this far (per channel) from a class;
#: farther colours are more likely a class missing from the CSV than compression damage.
SNAP_LIMIT = 10


# -- worker side ---------------------------------------------------------------------------------

_COLORMAPS: dict[tuple[ClassInfo, ...], ColorMap] = {}


def _colormap(classes: tuple[ClassInfo, ...]) -> ColorMap:
    cmap = _COLORMAPS.get(classes)
    if cmap is None:
        _COLORMAPS.clear()
        cmap = _COLORMAPS[classes] = ColorMap(classes, 0)
    return cmap


def scan_sample(sample: SourceSample, classes: tuple[ClassInfo, ...], base: str, max_pixels: int,
                values: str | None = None, exif: ExifMode = ExifMode.AUTO) -> FileSummary:
    """Decode one pair the way convert would (its `--exif`) and summarise it (never raises DecodeError).

    `values` ("index" or "binary"): summarise the mask's pixel values (`scan_labels`) instead
    of looking its colours up in `classes`."""
    s = FileSummary(sample.split, sample.key, sample.image, sample.mask)
    image = None
    try:
        src = read_source(sample.image, relative_key_path(sample.image, base))
        s.image_digest = src.fingerprint.digest
        s.image_mode, s.image_format = file_header(src.data)
        image = decode_for_scan(src, s, max_pixels, sample.bands or ())
        s.image_size = (int(image.shape[1]), int(image.shape[0]))
        s.pixel_hash = pixel_hash(image)
    except DecodeError as e:
        s.errors.append(bad_input(e, sample.key))
    if sample.mask is None:
        return s
    try:
        msrc = read_source(sample.mask, relative_key_path(sample.mask, base))
        s.mask_mode, s.mask_format = file_header(msrc.data)
        mask = decode_mask(msrc, max_pixels, wide=values is not None)
        if values is not None:
            s.values, s.thin = value_summary(mask, values == "binary")
    except DecodeError as e:
        s.errors.append(bad_input(e, sample.key))
        return s
    s.mask_size = (mask.width, mask.height)
    if image is not None:
        try:  # sizes as convert's --exif judges them: a mismatch, or a pair they cannot decide (auto)
            apply_orientation(exif, orientation_of(src), image.shape[:2], (mask.height, mask.width),
                              sample.image, sample.mask)
        except DecodeError as e:
            s.errors.append(bad_input(e, sample.key))
    if values is not None:
        s.mask_size = (mask.width, mask.height)
        return s
    try:  # a colour mask from the fast path is unfiltered here: a bad row filter shows now
        class_map, unknown = _colormap(classes).lookup(mask)
    except DecodeError as e:
        s.errors.append(bad_input(e, sample.key))
        return s
    known = class_map[class_map < AMBIGUOUS]
    s.class_pixels = tuple(int(c) for c in np.bincount(known, minlength=len(classes))[: len(classes)])
    items = sorted(unknown.counts.items(), key=lambda kv: (-kv[1], kv[0]))
    s.unknown = dict(items[:MAX_UNKNOWN_COLORS_PER_FILE])
    rest = items[MAX_UNKNOWN_COLORS_PER_FILE:]
    s.unknown_other_colors = len(rest)
    s.unknown_other_pixels = sum(n for _, n in rest)
    return s


def scan_batch(samples: Sequence[SourceSample], classes: tuple[ClassInfo, ...], base: str,
               max_pixels: int, values: str | None = None, exif: ExifMode = ExifMode.AUTO) -> list[FileSummary]:
    return [scan_sample(s, classes, base, max_pixels, values, exif) for s in samples]


def run_scan_workers(samples: Sequence[SourceSample], classes: tuple[ClassInfo, ...], base: str, max_pixels: int,
                     workers: int, on_progress: Callable[[int], None] | None = None,
                     values: str | None = None, storage_options: tuple = (),
                     exif: ExifMode = ExifMode.AUTO) -> list[FileSummary]:
    """Summaries of every sample, sorted by key; worker processes when workers > 1 (sources in a
    bucket read with `storage_options`)."""
    scan = functools.partial(scan_batch, classes=classes, base=base, max_pixels=max_pixels, values=values, exif=exif)
    return run_batched(WithStorage(scan, base, storage_options), samples, workers, on_progress)


# -- parent side: aggregation ---------------------------------------------------------------------

def _chebyshev(classes: tuple[ClassInfo, ...], color: Color) -> np.ndarray:
    colors = np.array([c.color for c in classes], np.int64).reshape(-1, 3)
    return np.abs(colors - np.array(color, np.int64)).max(axis=1)


@dataclass(frozen=True)
class UnknownColorInfo:
    color: Color
    pixels: int
    files: int
    share: float  # of all mask pixels
    nearest: str
    distance: int  # Chebyshev distance to the nearest class = the tolerance that would snap it
    ambiguous_at_snap: bool  # another class is just as near: that snap is ambiguous
    second_distance: int  # distance to the second-nearest class (256 when there is none)
    status: str  # at the scan's --color-tolerance: "unknown", "snapped" or "ambiguous"
    examples: tuple[str, ...]

    def to_json(self) -> dict:
        return {"color": list(self.color), "hex": _hex(self.color), "pixels": self.pixels, "files": self.files,
                "share": self.share, "nearest_class": self.nearest, "distance": self.distance,
                "tolerance_to_snap": self.distance, "ambiguous_at_snap": self.ambiguous_at_snap,
                "second_distance": self.second_distance, "status": self.status, "examples": list(self.examples)}


def _hex(color: Sequence[int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*color)


def _status(d1: int, d2: int, tolerance: int) -> str:
    if d2 <= tolerance:
        return "ambiguous"
    if d1 <= tolerance:
        return "snapped"
    return "unknown"


@dataclass
class ScanReport:
    source: str
    spec: SourceSpec
    options: ScanOptions
    classes: tuple[ClassInfo, ...]
    splits: dict[str, int]
    summaries: list[FileSummary]
    bad: list[BadInput]
    classes_table: list[dict]
    unknown_colors: list[UnknownColorInfo]
    unknown_unlisted: dict[str, int]
    never_present: list[str]
    missing_per_split: dict[str, list[str]]
    duplicates: dict[str, Any]
    images: dict[str, Any]
    verdict: dict[str, Any]
    labels: dict[str, Any] = field(default_factory=dict)  # layout, mask semantics, values (`scan_labels`)
    found: Any = None  # the `Discovery`
    passed_over: list[str] = field(default_factory=list)  # JSON files at SRC that detection passed over, with why

    def to_json(self) -> dict:
        return {
            "task": Task.SEGMENTATION.value,
            "labels": self.labels,
            "source": self.source,
            "options": {"color_tolerance": self.options.color_tolerance, "max_pixels": self.options.max_pixels,
                        "exif": self.options.exif.value},
            "pairs": self.splits,
            "total_pairs": sum(self.splits.values()),
            "bad": [b.to_json() for b in self.bad],
            "bad_counts": dict(sorted(Counter(b.kind for b in self.bad).items())),
            "classes": self.classes_table,
            "unknown_colors": [u.to_json() for u in self.unknown_colors],
            "unknown_colors_unlisted": self.unknown_unlisted,
            "classes_never_present": self.never_present,
            "classes_missing_per_split": self.missing_per_split,
            "duplicates": self.duplicates,
            "images": self.images,
            "verdict": self.verdict,
            "passed_over": self.passed_over,
        }


def scan(spec: SourceSpec, options: ScanOptions | None = None, *,
         on_start: Callable[[int], None] | None = None,
         on_progress: Callable[[int], None] | None = None) -> ScanReport | ClassScanReport:
    """Scan the sources of `spec`. `on_start(total)` is called once the pairs are known.

    Class-folder sources (task classification, given or detected as convert does) get a
    `converter.inspect.scan_classification.ClassScanReport` instead.
    """
    spec.use_storage()
    with source_scope():  # sources in a bucket: one listing for the whole scan
        return _scan(spec, options or ScanOptions(), on_start, on_progress)


def _discover_for_scan(spec: SourceSpec, labels: LabelOptions) -> tuple:
    """(spec, found, semantics, census, class table) before scan's pass over every pair; semantics None
    for annotation files. Each file it reads (class table, peeked masks) is read once (`read_memo`)."""
    with read_memo():
        try:
            found = discover(spec)  # first: a missing source folder is named as such
        except ContentTie:
            banded = band_spec_from_tie(spec)  # parallel band folders pair equally with one mask folder
            if banded is None:
                raise
            spec = banded
            found = discover(spec)
        if found.layout in ANNOTATION_FORMATS:
            return spec, found, None, False, ()
        semantics = labels.semantics or auto_semantics(spec, found)
        census = semantics is MaskSemantics.COLOUR and needs_census(spec, found)
        classes = resolve_labels(spec, labels, found)[1] if semantics is MaskSemantics.COLOUR and not census else ()
    return spec, found, semantics, census, classes


def _scan(spec: SourceSpec, options: ScanOptions, on_start: Callable[[int], None] | None,
          on_progress: Callable[[int], None] | None) -> ScanReport | ClassScanReport:
    if not task_kind(options.resolve_task(spec)).dense:  # class folders
        from converter.inspect.scan_classification import scan_classification

        return scan_classification(spec, options, on_start=on_start, on_progress=on_progress)
    labels = options.labels or LabelOptions()
    spec, found, semantics, census, classes = _discover_for_scan(spec, labels)
    if semantics is None:  # annotation files: their own report
        from converter.inspect.scan_annotations import scan_annotations

        return scan_annotations(spec, options, found, on_start, on_progress)  # type: ignore[return-value]
    if on_start is not None:
        on_start(len(found.samples))
    mode = None if semantics is MaskSemantics.COLOUR else semantics.value
    summaries = run_scan_workers(found.samples, classes, spec.base, options.max_pixels, options.effective_workers,
                                 on_progress, values=mode, storage_options=spec.storage_options, exif=options.exif)
    if census:  # colour masks without a class table: the colours present are the classes (one read of each mask)
        classes = census_classes(summaries, spec.base)
        summaries = counted_as_classes(summaries, classes)
    bad = list(found.bad)
    section: dict[str, Any] = {"layout": found.layout, "why": found.why, "semantics": semantics.value,
                               "flags": [], "notes": [], "suffixes": list(found.suffixes) if found.suffixes else None,
                               "unpaired_images": found.unpaired_images}
    resolved, pixels = LabelOptions.colour_default(), None
    if mode is not None:
        info = resolve_for_scan(spec, labels, found, summaries)  # grey and palette values are binary levels too
        classes = info["classes"]
        bad += apply_labels(info, summaries)
        section = labels_section(info, found, summaries)
        resolved, pixels = info["labels"], info["pixels"]
    section.update(readings_section(spec, found, resolved, classes, labels, section["flags"], pixels, summaries))
    section["classes_from_colours"] = census
    if census:
        section["classes_from"] = (f"the {len(classes)} colours present (no class table; ascending RGB, named "
                                   "#rrggbb: scan --write-classes FILE writes it)")
    report = build_report(spec, options, classes, found.splits, bad, summaries, labels=section, found=found)
    if census:
        report.verdict = census_verdict(report.verdict, classes)
    return report


def _unknown_colors(summaries: list[FileSummary], classes: tuple[ClassInfo, ...], tol: int, total_mask: int
                    ) -> tuple[list[UnknownColorInfo], dict[str, int]]:
    """Colours that matched no class, with their nearest class and what --color-tolerance
    `tol` does to them, most pixels first; and the pixels/colours of those not listed."""
    agg: dict[Color, list] = {}
    unlisted = {"pixels": 0, "colors": 0}
    for s in summaries:
        for color, n in s.unknown.items():
            a = agg.setdefault(color, [0, 0, []])
            a[0] += n
            a[1] += 1
            if len(a[2]) < EXAMPLES:
                a[2].append(s.key)
        unlisted["pixels"] += s.unknown_other_pixels
        unlisted["colors"] += s.unknown_other_colors
    unknown: list[UnknownColorInfo] = []
    for color, (n, nfiles, examples) in agg.items():
        d = _chebyshev(classes, color)
        order = np.argsort(d, kind="stable")
        d1 = int(d[order[0]])
        d2 = int(d[order[1]]) if len(order) > 1 else 256
        unknown.append(UnknownColorInfo(
            color, n, nfiles, share(n, total_mask), classes[int(order[0])].name, d1, d2 == d1, d2,
            _status(d1, d2, tol), tuple(examples)))
    unknown.sort(key=lambda u: (-u.pixels, u.color))
    return unknown, unlisted


def _bad_inputs(discovery_bad: Sequence[BadInput], summaries: list[FileSummary], unknown: list[UnknownColorInfo],
                classes: tuple[ClassInfo, ...], tol: int) -> list[BadInput]:
    """Bad inputs as convert would name them (colour problems at the scan's tolerance)."""
    bad = list(discovery_bad)
    status = {u.color: u for u in unknown}
    cmap = ColorMap(classes, tol)
    for s in summaries:
        bad += s.errors
        if s.errors:
            continue  # convert stops at a sample's first problem
        if s.unknown or s.unknown_other_pixels:
            uc = UnknownColors()
            for color, n in s.unknown.items():
                st = status[color].status
                if st == "unknown":
                    uc.counts[color] = n
                elif st == "ambiguous":
                    uc.ambiguous[color] = n
            if uc or s.unknown_other_pixels:
                e = UnknownColorError(s.mask or s.image, uc, cmap)
                reason = e.reason if uc else "unknown mask colours (many; not listed)"
                bad.append(BadInput(e.path, reason, e.fix, s.key, e.kind))
    bad.sort(key=lambda b: (b.path, b.kind, b.reason))
    return bad


def build_report(spec: SourceSpec, options: ScanOptions, classes: tuple[ClassInfo, ...], splits: Sequence[str],
                 discovery_bad: Sequence[BadInput], summaries: list[FileSummary], *,
                 labels: dict[str, Any] | None = None, found: Any = None) -> ScanReport:
    c = len(classes)
    split_names = sorted(splits)
    pairs = {s: 0 for s in split_names}
    for s in summaries:
        pairs[s.split] = pairs.get(s.split, 0) + 1

    # -- colours per class
    pixels = {sp: np.zeros(c, np.int64) for sp in split_names}
    files = np.zeros(c, np.int64)
    mask_pixels = {sp: 0 for sp in split_names}
    for s in summaries:
        if s.class_pixels is None:
            continue
        counts = np.asarray(s.class_pixels, np.int64)
        pixels[s.split] += counts
        files += counts > 0
        mask_pixels[s.split] += s.mask_pixels
    total_mask = sum(mask_pixels.values())
    overall = sum(pixels.values(), np.zeros(c, np.int64))

    tol = options.color_tolerance
    unknown, unlisted = _unknown_colors(summaries, classes, tol, total_mask)

    # snapped colours count for their class in the table, as convert would count them
    snapped: dict[str, int] = Counter()
    for u in unknown:
        if u.status == "snapped":
            snapped[u.nearest] += u.pixels
    classes_table = []
    for i, ci in enumerate(classes):
        classes_table.append({
            "index": i, "name": ci.name, "color": list(ci.color) if ci.color else None,
            "hex": _hex(ci.color) if ci.color else None,
            "pixels": int(overall[i]), "share": share(int(overall[i]), total_mask), "files": int(files[i]),
            "snapped_pixels": int(snapped.get(ci.name, 0)),
            "share_per_split": {sp: share(int(pixels[sp][i]), mask_pixels[sp]) for sp in split_names},
        })
    never = [ci.name for i, ci in enumerate(classes) if overall[i] == 0 and snapped.get(ci.name, 0) == 0]
    missing = {sp: [ci.name for i, ci in enumerate(classes) if pixels[sp][i] == 0 and ci.name not in never]
               for sp in split_names if pairs.get(sp)}
    missing = {sp: names for sp, names in missing.items() if names}

    bad = _bad_inputs(discovery_bad, summaries, unknown, classes, tol)

    duplicates = find_duplicates(summaries, split_names)
    images = image_stats(summaries)
    images["kinds"] = images_section(summaries, options.image_kind)
    images["kinds"]["band_order"] = band_order(spec)  # band folders: their order and how it reads
    report = ScanReport(
        source=spec.root or spec.images or "", spec=spec, options=options, classes=classes, splits=pairs,
        summaries=summaries, bad=bad, classes_table=classes_table, unknown_colors=unknown, unknown_unlisted=unlisted,
        never_present=never, missing_per_split=missing, duplicates=duplicates, images=images, verdict={},
        labels=labels or {}, found=found, passed_over=passed_over(spec.root) if spec.root is not None else [],
    )
    report.verdict = _verdict(report)
    return report


# -- verdict --------------------------------------------------------------------------------------

def suggest_tolerance(unknown: Sequence[UnknownColorInfo], at_least: int = 0) -> tuple[int, list[UnknownColorInfo]]:
    """The largest safe --color-tolerance (<= max(SNAP_LIMIT, at_least)) that snaps near colours
    without making any colour ambiguous, and the colours still unknown at it."""
    limit = max(SNAP_LIMIT, at_least)
    candidates = sorted({at_least} | {u.distance for u in unknown if u.distance <= limit}, reverse=True)
    for t in candidates:
        if all(u.second_distance > t for u in unknown):
            return t, [u for u in unknown if u.distance > t]
    return 0, list(unknown)


def _label_problems(r: ScanReport, problems: list[str], flags: list[str], unknown_files: set[str]) -> list[str]:
    """Problems of index/binary masks (added to `problems`, `flags`, `unknown_files`); the label flags."""
    labels = r.labels or {}
    label_flags = list(labels.get("flags", []))
    problems += reading_problems(labels)
    if label_flags:
        problems.append("convert needs " + " ".join(label_flags) + " to read these masks as they are meant ("
                        + "; ".join(labels.get("notes", []) or ["see the mask values above"]) + ")")
    unknown_values = labels.get("unknown_values") or []
    if unknown_values:
        n_files = sum(1 for s in r.summaries if s.unknown_values)
        problems.append(f"{len(unknown_values)} mask value(s) have no class (in {n_files} file(s)): "
                        + ", ".join(str(u["value"]) for u in unknown_values[:10]))
        unknown_files |= {k for u in unknown_values for k in u["examples"]}
        if "--unknown-color" not in flags:
            flags += ["--unknown-color", "ignore"]
    return label_flags


def _evidence(r: ScanReport, total: int) -> dict[str, Any]:
    """What the verdict rests on: the layout and why, the pairs per split, the bad inputs by kind."""
    found = r.found
    return {"layout": getattr(found, "layout", None), "why": getattr(found, "why", None), "pairs": total,
            "splits": dict(r.splits), "bad_counts": dict(sorted(Counter(b.kind for b in r.bad).items())),
            "unpaired_images": getattr(found, "unpaired_images", 0)}


def exif_decision(r: ScanReport, problems: list[str], flags: list[str]) -> bool:
    """`--exif` in the command when given; True (a problem added) where `--exif auto` met pairs whose
    sizes cannot decide the orientation: only the user knows how their masks were drawn."""
    if r.options.exif is not ExifMode.AUTO:
        flags += ["--exif", r.options.exif.value]
        return False
    undecided = [b for b in r.bad if b.kind == "exif_ambiguous"]
    if undecided:
        problems.insert(0, f"{len(undecided)} pair(s) whose EXIF orientation the sizes cannot decide (a square image, "
                           "or a flip/180-degree tag), e.g. " + ", ".join(b.path for b in undecided[:EXAMPLES])
                        + ": scan again with --exif apply (the masks were drawn on the pictures as viewers show them) "
                          "or --exif ignore (drawn on the stored pixels); it prints the command then")
    return bool(undecided)


def _verdict(r: ScanReport) -> dict[str, Any]:
    problems: list[str] = []
    warnings: list[str] = []
    total = sum(r.splits.values())
    flags: list[str] = []
    no_good = total > 0 and all(s.errors for s in r.summaries)
    if total == 0:
        problems.append("no image/mask pairs found")
    elif no_good:
        problems.append("every pair is bad: convert would have no sample to publish, whatever --max-bad says")
    tol, still_unknown = suggest_tolerance(r.unknown_colors, r.options.color_tolerance)
    unknown_files = {k for u in r.unknown_colors for k in u.examples}
    unmatched = [u for u in r.unknown_colors if u.status != "snapped"]
    if unmatched or r.unknown_unlisted["pixels"]:
        colours = {u.color for u in unmatched}
        n_files = sum(1 for s in r.summaries if s.unknown_other_pixels or any(c in colours for c in s.unknown))
        problems.append(f"{len(unmatched)} mask colour(s) match no class (in {n_files} file(s) at "
                        f"--color-tolerance {r.options.color_tolerance})")
    label_flags = _label_problems(r, problems, flags, unknown_files)
    source, image_flags, image_notes, image_bad = image_verdict(r, problems, warnings)
    given = r.options.labels or LabelOptions()
    if tol > 0:
        flags += ["--color-tolerance", str(tol)]
    if still_unknown or r.unknown_unlisted["pixels"]:
        flags += ["--unknown-color", "ignore"]
    other_bad = [b for b in r.bad if b.kind not in ("unknown_color", "ambiguous_color", "exif_ambiguous")]
    undecided = exif_decision(r, problems, flags)
    if other_bad:
        kinds = Counter(b.kind for b in other_bad)
        problems.append(f"{len(other_bad)} bad input(s): " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
        flags += ["--max-bad", str(len(other_bad))]
    if r.never_present:
        names = ", ".join(r.never_present[:EXAMPLES * 4]) + (
            f" and {len(r.never_present) - EXAMPLES * 4} more" if len(r.never_present) > EXAMPLES * 4 else "")
        warnings.append(f"class(es) never present in any mask: {names}")
    for sp, names in r.missing_per_split.items():
        warnings.append(f"class(es) absent from split {sp!r}: {', '.join(names)}")
    d = r.duplicates
    if d["cross_split_pairs"]:
        pairs = ", ".join(f"{k}: {v}" for k, v in d["pairs_per_split_pair"].items() if k.split("/")[0] != k.split("/")[1])
        warnings.append(f"{d['cross_split_pairs']} duplicate image pair(s) across splits (leakage; {pairs})")
    if d["within_split_pairs"]:
        warnings.append(f"{d['within_split_pairs']} duplicate image pair(s) within a split")
    sizes = r.images["sizes_wxh"]
    size_flag, size_hint = suggest_size(sizes)
    src = source_positional(r.spec) + source_args(r.spec, r.found)
    command = ["imgshard", "convert", *source, "OUT", "--size", size_flag, *source_args(r.spec, r.found), *given_label_args(given), *label_flags,
               *flags, *image_flags]
    needs = bool(r.bad) or bool(label_flags) or bool(reading_problems(r.labels or {})) or image_bad
    status = "no_data" if total == 0 or no_good else ("needs_decision" if undecided else (
        "needs_flags" if needs else ("warnings" if warnings else "ok")))
    hints = ([size_hint] if size_hint else []) + image_notes
    if "--color-tolerance" in flags:
        hints.append(f"--color-tolerance {tol} snaps the colours within {tol} per channel of exactly one class")
    if "--unknown-color" in flags:
        far = [u for u in still_unknown]
        hints.append(f"--unknown-color ignore maps {len(far)} colour(s) too far from any class (or ambiguous) to "
                     "the ignore index; add them to class_dict.csv instead if they are real classes")
    if "--max-bad" in flags:
        hints.append("--max-bad converts the good samples and skips the bad ones; better: fix or remove them")
        if any(b.kind == "too_large" for b in other_bad):
            hints.append(f"images over --max-pixels: --max-pixels {r.images['largest_pixels']} accepts them "
                         "if they are genuine")
    if unknown_files:
        keys = sorted(unknown_files)[:4]
        hints.append("see where: imgshard preview " + " ".join(shlex.quote(a) for a in src + given_label_args(given)
                                                                + label_flags)
                     + " -o preview.png " + " ".join(f"--key {shlex.quote(k)}" for k in keys))
    return {
        "status": status,
        "convert_ok_without_flags": status in ("ok", "warnings"),
        "flags": label_flags + flags,
        # nothing would convert, or only a choice of the user's makes it: no command to follow
        "command": None if status in ("no_data", "needs_decision") else " ".join(shlex.quote(a) for a in command),
        "reason": problems[0] if problems else ("warnings" if warnings else "ok"),
        "evidence": _evidence(r, total),
        "problems": problems,
        "warnings": warnings,
        "hints": hints,
    }


# -- text report ------------------------------------------------------------------------------------

def format_report(r: ScanReport | ClassScanReport, *, limit: int = 20) -> str:
    """The human-readable report (what `imgshard scan` prints)."""
    if hasattr(r, "overlap_rule"):  # annotation files
        from converter.inspect.scan_annotations import format_annotation_report

        return format_annotation_report(r, limit=limit)  # type: ignore[arg-type]
    if not isinstance(r, ScanReport):  # classification
        from converter.inspect.scan_classification import format_classification_report

        return format_classification_report(r, limit=limit)
    out: list[str] = []
    total = sum(r.splits.values())
    out.append(f"Source: {r.source}")
    if r.labels:
        out += format_labels(r.labels, limit) if "values" in r.labels else [
            f"Layout: {r.labels['layout']} ({r.labels['why']})", f"Mask semantics: {r.labels['semantics']}"]
        out += format_readings(r.labels)
    out.append("Pairs: " + (", ".join(f"{k} {v}" for k, v in r.splits.items()) or "none") + f" (total {total})")
    im = r.images
    out.append("Image sizes (WxH): " + ", ".join(f"{k} x{v}" for k, v in list(im["sizes_wxh"].items())[:8])
               + (f" ... ({len(im['sizes_wxh'])} sizes)" if len(im["sizes_wxh"]) > 8 else ""))
    out.append("Image modes: " + ", ".join(f"{k} {v}" for k, v in im["image_modes"].items())
               + "; formats: " + ", ".join(f"{k} {v}" for k, v in im["image_formats"].items()))
    out += format_images(im.get("kinds", {}))
    out.append("Mask modes: " + ", ".join(f"{k} {v}" for k, v in im["mask_modes"].items()))
    out.append("")
    out.append(f"Mask colours by class ({len(r.classes)} classes; share of all mask pixels):")
    width = max((len(c["name"]) for c in r.classes_table), default=4)
    shown = r.classes_table if len(r.classes_table) <= 3 * limit else [c for c in r.classes_table if c["pixels"]]
    for c in shown[: 3 * limit]:
        snapped = f"  (+{c['snapped_pixels']} px snapped)" if c["snapped_pixels"] else ""
        never = "  NEVER PRESENT" if c["name"] in r.never_present else ""
        out.append(f"  {c['index']:>3} {c['name']:<{width}} {c['hex']}  {c['share']:7.3f}%  {c['pixels']:>12} px "
                   f" in {c['files']:>6} file(s){snapped}{never}")
    if r.unknown_colors:
        out.append(f"Unknown colours ({len(r.unknown_colors)}; --color-tolerance {r.options.color_tolerance}):")
        for u in r.unknown_colors[:limit]:
            amb = " (ambiguous: another class is as near)" if u.ambiguous_at_snap else ""
            out.append(f"  {u.color} {_hex(u.color)}  {u.share:7.3f}%  {u.pixels:>10} px in {u.files} file(s); "
                       f"nearest {u.nearest!r} at distance {u.distance}: --color-tolerance {u.distance} would snap "
                       f"it{amb}; now {u.status}. e.g. {u.examples[0]}")
        if len(r.unknown_colors) > limit:
            out.append(f"  ... and {len(r.unknown_colors) - limit} more (see --json)")
    if r.unknown_unlisted["pixels"]:
        out.append(f"  plus {r.unknown_unlisted['colors']} rarer colours in {r.unknown_unlisted['pixels']} px, "
                   "not listed")
    if len(shown) < len(r.classes_table):
        out.append(f"  ... {len(r.classes_table) - min(len(shown), 3 * limit)} more class(es) not listed (see --json)")
    if r.never_present:
        out.append("Classes never present: " + ", ".join(r.never_present[:limit])
                   + (f" and {len(r.never_present) - limit} more" if len(r.never_present) > limit else ""))
    for sp, names in r.missing_per_split.items():
        out.append(f"Classes absent from {sp}: " + ", ".join(names))
    out.append("")
    d = r.duplicates
    if d["groups"]:
        out.append(f"Duplicate images (same decoded pixels): {len(d['groups'])} group(s), "
                   f"{d['within_split_pairs']} pair(s) within a split, {d['cross_split_pairs']} across splits")
        out.append("  pairs per split pair: " + ", ".join(f"{k} {v}" for k, v in d["pairs_per_split_pair"].items()))
        for g in d["groups"][:limit]:
            out.append("  " + " = ".join(g["keys"][:EXAMPLES]) + (" ..." if len(g["keys"]) > EXAMPLES else ""))
    else:
        out.append("Duplicate images: none")
    out += format_bad_inputs(r.bad, limit)
    out += [f"Passed over: {p}" for p in r.passed_over[:limit]]
    out.append("")
    out += format_verdict(r)
    return "\n".join(out)


__all__ = ["FileSummary", "ScanOptions", "ScanReport", "UnknownColorInfo", "build_report", "format_report",
           "format_verdict", "pixel_hash", "scan", "scan_sample", "suggest_tolerance"]
