"""Source layouts, detected in one place: each layout is a small object with a name.

A layout says whether a folder looks like it (`detect(root)` -> the evidence, or None),
lists its image/mask pairs per split (`pairs(root, spec)`), and gives the mask semantics
its files mean (`defaults(root)`). `detect_layout` asks every layout; when two match it
stops and names the choices (`--layout NAME` forces one). Known layouts:

* ``camvid``: ``SRC/{split}/`` + ``SRC/{split}_labels/``, ``class_dict.csv`` (colour masks);
* ``voc``: ``JPEGImages/`` + ``SegmentationClass*/`` (palette index masks, 255 = void),
  split lists ``ImageSets/Segmentation/*.txt``; labelme2voc output (``class_names.txt``);
* ``cityscapes``: ``leftImg8bit/<split>/<city>/*_leftImg8bit.png`` +
  ``gtFine/<split>/<city>/*_gtFine_labelIds.png`` (label ids -> 19 train ids);
* ``ade``: ``images/<split>/`` + ``annotations/<split>/`` (ADE20K: 0 = other, reduced);
* ``mmseg``: ``img_dir/<split>/`` + ``ann_dir/<split>/`` (index masks);
* ``unet``: an image folder + a mask folder (``image``/``label``, ``images``/``masks``, ...),
  at the top or in each split folder (``train/image`` + ``train/label``);
* ``explicit``: ``--images DIR --masks DIR``;
* ``classfolders``: class folders (classification), only when no folder looks like masks.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from dataclasses import dataclass, field

from converter.discover.annotations.ambiguity import ReadingsDisagree, compare_readings
from converter.discover.annotations.layouts import ANNOTATION_LAYOUTS, follow_spec
from converter.discover.bands import attach_bands, band_tokens
from converter.discover.content import ContentTie, find_by_content
from converter.discover.evidence import folder_pair_defaults, names_defaults, voc_defaults
from converter.discover.files import absolute, file_names, is_dir, is_file, relative, source_scope, subfolders
from converter.discover.names_files import find_names_file
from converter.discover.layout import (
    IMAGE_EXTENSIONS,
    LABELS_SUFFIX,
    WELL_KNOWN_SPLITS,
    BadInput,
    Discovery,
    LayoutDefaults,
    SourceLayoutError,
    list_images,
)
from converter.discover.pairing import (Pairing, check_masks_folder, infer_suffixes, name_stem, pair_by_name,
                                        read_split_list)
from converter.discover.samplelist import SampleBlock, SampleList
from converter.options import MaskSemantics, SourceSpec, SplitSource

#: Folder names that hold masks, at any depth ("never guess classification next to these").
MASK_DIR_NAMES = frozenset({"label", "labels", "mask", "masks", "ann_dir", "annotations", "annotation", "gt", "gts",
                            "gtfine", "gtcoarse", "groundtruth", "ground_truth", "1st_manual", "segmentations"})
IMAGE_DIR_NAMES = ("image", "images", "img", "imgs", "input", "inputs", "jpegimages", "img_dir", "leftimg8bit")
#: Folders looked into per level when searching for mask folders (class-folder datasets have thousands).
MASK_SEARCH_FOLDERS = 200
VOC_MASK_DIRS = ("SegmentationClass", "SegmentationClassPNG", "SegmentationClassAug", "SegmentationClassRaw")


class LayoutError(ValueError):
    """The source folder matches more than one layout, or not the one --layout names."""


class LayoutNotFound(FileNotFoundError):
    """The source folder matches no layout."""


class SeveralMaskFolders(LayoutError):
    """An image folder beside several mask folders by name: pairing by content may settle which
    (DRIVE's ``1st_manual/`` and ``mask/``); this error stands when it cannot."""


def is_mask_dir_name(name: str) -> bool:
    low = name.lower()
    return (low in MASK_DIR_NAMES or low.endswith(LABELS_SUFFIX) or low.startswith("segmentationclass")
            or "groundtruth" in low or low.endswith("_masks") or low.endswith("_gt"))


def _is_image_dir_name(name: str) -> bool:
    low = name.lower()
    return low in IMAGE_DIR_NAMES or low.endswith("_images") or "input" in low


def subdirs(folder: str) -> list[str]:
    """Sub-folders of `folder` (hidden ones skipped), sorted; directory entries' types, no stat per
    file (an object-store prefix: from its one listing, `converter.discover.files`)."""
    return subfolders(folder)


def mask_dirs_below(root: str, depth: int = 3) -> list[str]:
    """Mask-looking folders below `root` (relative paths), up to `depth` levels down."""
    found = []
    level = [""]
    for _ in range(depth):
        nxt = []
        for rel in level:
            for d in subdirs(os.path.join(root, rel)):
                path = os.path.join(rel, d) if rel else d
                if is_mask_dir_name(d):
                    found.append(path)
                nxt.append(path)
        level = nxt[:MASK_SEARCH_FOLDERS]
    return found


@dataclass
class Listing:
    """What a layout found: splits in order, samples, problems, and how it paired them."""

    splits: list[str]
    samples: list[SampleBlock] = field(default_factory=list)  # one per folder pair paired
    bad: list[BadInput] = field(default_factory=list)
    suffixes: tuple[str, str] | None = None  # (image, mask) suffixes inferred from the names
    unpaired_images: int = 0
    found_suffixes: set = field(default_factory=set)  # suffixes found per folder pair (DRIVE: per split)
    sources: list[SplitSource] = field(default_factory=list)  # each folder pair as a spec names it

    def add(self, p: Pairing) -> None:
        self.samples.append(p.samples)
        self.bad += p.bad
        self.unpaired_images += p.unpaired_images


def _suffixes(spec: SourceSpec, images_dir: str, masks_dir: str,
              listed: tuple[list[str], list[str]] | None = None
              ) -> tuple[str | None, str | None, bool, tuple[list[str], list[str]] | None]:
    """(image suffix, mask suffix, inferred?, the folders' listings when taken) for a folder
    pair: given ones, else found from names (each folder listed once, for this and the pairing)."""
    if spec.image_suffix is not None or spec.mask_suffix is not None:
        return spec.image_suffix or "", spec.mask_suffix if spec.mask_suffix is not None else "", False, listed
    if listed is None:
        listed = list_images(images_dir), list_images(masks_dir) if is_dir(masks_dir) else []
    found = infer_suffixes([name_stem(r) for r in listed[0][:200]],
                           [name_stem(r) for r in listed[1]])
    if found is None:
        return None, None, False, listed
    return found[0], found[1], True, listed


def _pair_split(listing: Listing, spec: SourceSpec, images_dir: str, masks_dir: str, split: str,
                key_prefix: str, **kw) -> set[str]:
    """Pair one folder pair into `listing`; the bases that had an image."""
    isuf, msuf, inferred, listed = _suffixes(spec, images_dir, masks_dir)
    if spec.image_suffix is None and spec.mask_suffix is None:  # found from the names, per folder pair
        found = (isuf or "", msuf or "") if inferred else ("", "")
        listing.found_suffixes.add(found)
        one = len(listing.found_suffixes) == 1 and found != ("", "")
        listing.suffixes = found if one else None  # differing per folder pair: no one flag says it
    p = pair_by_name(images_dir, masks_dir, split, key_prefix, image_suffix=isuf, mask_suffix=msuf, listed=listed, **kw)
    del listed
    listing.add(p)
    listing.sources.append(SplitSource(split, images_dir, masks_dir, image_suffix=isuf, mask_suffix=msuf,
                                       split_list=kw.get("list_file"), skip_unpaired=bool(kw.get("masks_drive"))))
    return p.images_found


def _with_split_lists(listing_splits: dict[str, tuple[str, str]], spec: SourceSpec, lists: dict[str, str],
                      masks_drive: bool = False) -> Listing:
    """Pairs of (split -> (images_dir, masks_dir)) folders; split lists restrict and name splits."""
    if lists:  # a listed name is looked up in every folder pair (flat img_dir/, or train/ and val/)
        out = Listing(list(lists))
        for name, path in lists.items():
            only = set(read_split_list(path))
            found: set[str] = set()
            for images_dir, masks_dir in listing_splits.values():
                found |= _pair_split(out, spec, images_dir, masks_dir, name, f"{name}/", only=only,
                                     list_file=path, report_missing=False)
            first = next(iter(listing_splits.values()), ("", ""))[0]
            out.bad += [BadInput(path, f"lists {b!r}, but no image/mask pair of that name was found",
                                 f"add the pair (e.g. below {first}) or remove the line", f"{name}/{b}",
                                 "missing_image") for b in sorted(only - found)]
        return out
    out = Listing(list(listing_splits))
    for split, (images_dir, masks_dir) in listing_splits.items():
        _pair_split(out, spec, images_dir, masks_dir, split, f"{split}/", masks_drive=masks_drive)
    return out


class Layout:
    """Base: a name, detection, pairing, defaults."""

    name = ""

    def detect(self, root: str) -> str | None:
        raise NotImplementedError

    def pairs(self, root: str, spec: SourceSpec) -> Listing:
        raise NotImplementedError

    def defaults(self, root: str) -> LayoutDefaults:
        return LayoutDefaults()


class CamVid(Layout):
    name = "camvid"

    def detect(self, root: str) -> str | None:
        dirs = subdirs(root)
        pairs = [d for d in dirs if d + LABELS_SUFFIX in dirs]
        return f"folder pairs {', '.join(f'{d}/ + {d}{LABELS_SUFFIX}/' for d in pairs)}" if pairs else None

    def pairs(self, root: str, spec: SourceSpec) -> Listing:
        dirs = subdirs(root)
        splits = [d for d in dirs if not d.endswith(LABELS_SUFFIX) and (d + LABELS_SUFFIX in dirs or d in WELL_KNOWN_SPLITS)]
        return _with_split_lists({s: (os.path.join(root, s), os.path.join(root, s + LABELS_SUFFIX)) for s in splits},
                                 spec, dict(spec.split_lists))


def voc_base(root: str) -> tuple[str, str] | None:
    """(folder holding JPEGImages, its mask folder name) for VOC / labelme2voc layouts."""
    for base in (root, os.path.join(root, "VOC2012"), os.path.join(root, "VOCdevkit", "VOC2012")):
        if is_dir(os.path.join(base, "JPEGImages")):
            for m in VOC_MASK_DIRS:
                if is_dir(os.path.join(base, m)):
                    return base, m
    return None


class Voc(Layout):
    name = "voc"

    def detect(self, root: str) -> str | None:
        found = voc_base(root)
        if found is None:
            return None
        base, m = found
        rel = os.path.relpath(base, root)
        where = "" if rel == "." else rel + "/"
        lists = self._lists(base)
        return (f"{where}JPEGImages/ + {where}{m}/" + (f", split lists {where}ImageSets/Segmentation/"
                                                        f"{{{','.join(lists)}}}.txt" if lists else ""))

    @staticmethod
    def _lists(base: str) -> dict[str, str]:
        folder = os.path.join(base, "ImageSets", "Segmentation")
        names = [n for n in file_names(folder) if n.endswith(".txt")]
        lists = {os.path.splitext(n)[0]: os.path.join(folder, n) for n in names}
        if "trainval" in lists and "train" in lists and "val" in lists:
            del lists["trainval"]  # train + val again: every sample once
        return lists

    def pairs(self, root: str, spec: SourceSpec) -> Listing:
        base, m = voc_base(root)  # type: ignore[misc]
        lists = dict(spec.split_lists) or self._lists(base)
        folders = {"train": (os.path.join(base, "JPEGImages"), os.path.join(base, m))}
        return _with_split_lists(folders, spec, lists, masks_drive=True)

    def defaults(self, root: str) -> LayoutDefaults:
        base, m = voc_base(root)  # type: ignore[misc]
        return voc_defaults(root, base, m)  # the VOC classes only for Pascal VOC itself (issue 24)


class Cityscapes(Layout):
    name = "cityscapes"

    @staticmethod
    def _gt(root: str) -> str | None:
        for gt in ("gtFine", "gtCoarse"):
            if is_dir(os.path.join(root, gt)):
                return gt
        return None

    def detect(self, root: str) -> str | None:
        gt = self._gt(root)
        if is_dir(os.path.join(root, "leftImg8bit")) and gt:
            return f"leftImg8bit/ + {gt}/ (cities below each split)"
        return None

    def pairs(self, root: str, spec: SourceSpec) -> Listing:
        gt = self._gt(root) or "gtFine"
        spec_suffix = SourceSpec(root=root, image_suffix=spec.image_suffix or "_leftImg8bit",
                                 mask_suffix=spec.mask_suffix or f"_{gt}_labelIds")
        images = os.path.join(root, "leftImg8bit")
        splits = [s for s in subdirs(images) if is_dir(os.path.join(root, gt, s))]
        return _with_split_lists({s: (os.path.join(images, s), os.path.join(root, gt, s)) for s in splits},
                                 spec_suffix, dict(spec.split_lists))

    def defaults(self, root: str) -> LayoutDefaults:
        return LayoutDefaults(MaskSemantics.INDEX, label_map="cityscapes",
                              classes_from="the Cityscapes label ids (built-in table: 34 label ids -> 19 train ids)")


class FolderPair(Layout):
    """``<images>/<split>/`` + ``<masks>/<split>/`` (ADE20K, mmsegmentation)."""

    images_name = ""
    masks_name = ""
    reduce_zero_label = False

    def detect(self, root: str) -> str | None:
        if is_dir(os.path.join(root, self.images_name)) and is_dir(os.path.join(root, self.masks_name)):
            splits = subdirs(os.path.join(root, self.images_name))
            return f"{self.images_name}/ + {self.masks_name}/" + (f" with splits {', '.join(splits)}" if splits else "")
        return None

    def pairs(self, root: str, spec: SourceSpec) -> Listing:
        images, masks = os.path.join(root, self.images_name), os.path.join(root, self.masks_name)
        splits = [s for s in subdirs(images) if is_dir(os.path.join(masks, s))]
        folders = {s: (os.path.join(images, s), os.path.join(masks, s)) for s in splits} or {"train": (images, masks)}
        return _with_split_lists(folders, spec, dict(spec.split_lists))

    def defaults(self, root: str) -> LayoutDefaults:
        return folder_pair_defaults(root, self.masks_name, self.reduce_zero_label)


class Ade(FolderPair):
    name = "ade"
    images_name, masks_name, reduce_zero_label = "images", "annotations", True


class Mmseg(FolderPair):
    name = "mmseg"
    images_name, masks_name = "img_dir", "ann_dir"


def _unet_pair(folder: str) -> tuple[str, str] | None:
    dirs = subdirs(folder)
    imgs = [d for d in dirs if _is_image_dir_name(d)]
    masks = [d for d in dirs if is_mask_dir_name(d)]
    if len(imgs) == 1 and len(masks) == 1:
        return imgs[0], masks[0]
    if len(imgs) == 1 and len(masks) > 1:
        raise SeveralMaskFolders(f"{folder} holds the image folder {imgs[0]}/ and several mask folders {masks}. "
                          f"Pick one: --images {os.path.join(folder, imgs[0])} --masks {os.path.join(folder, masks[0])}")
    return None


class Unet(Layout):
    name = "unet"

    def _folders(self, root: str) -> dict[str, tuple[str, str]]:
        top = _unet_pair(root)
        if top is not None:
            return {"train": (os.path.join(root, top[0]), os.path.join(root, top[1]))}
        out = {}
        for split in subdirs(root):
            pair = _unet_pair(os.path.join(root, split))
            if pair is not None:
                out[split] = (os.path.join(root, split, pair[0]), os.path.join(root, split, pair[1]))
        return out

    def detect(self, root: str) -> str | None:
        folders = self._folders(root)
        if not folders:
            return None
        return "image + mask folders: " + ", ".join(
            f"{os.path.relpath(i, root)}/ + {os.path.relpath(m, root)}/" for i, m in folders.values())

    def pairs(self, root: str, spec: SourceSpec) -> Listing:
        return _with_split_lists(self._folders(root), spec, dict(spec.split_lists))


class Explicit(Layout):
    name = "explicit"

    def detect(self, root: str) -> str | None:
        return None  # only with --images/--masks (`discover`)

    def pairs(self, root: str, spec: SourceSpec) -> Listing:
        images, masks = absolute(spec.images), absolute(spec.masks)  # type: ignore[arg-type]
        return _with_split_lists({spec.split: (images, masks)}, spec, dict(spec.split_lists))


def _direct_images(folder: str) -> list[str]:
    return [n for n in file_names(folder) if os.path.splitext(n)[1].lower() in IMAGE_EXTENSIONS]


def sources_listing(sources: tuple[SplitSource, ...], base: str) -> Listing:
    """The pairs of explicit folder pairs (a spec, repeated --images/--masks/--split, pairing by
    content): keys ``<split>/<name>``, or ``<split>/<images folder>/<name>`` when a split has several."""
    per_split = Counter(s.split for s in sources)
    out = Listing(list(dict.fromkeys(s.split for s in sources)))
    for s in sources:
        images, masks = absolute(s.images), absolute(s.masks or s.images)
        key_prefix = f"{s.split}/" if per_split[s.split] == 1 else f"{s.split}/{relative(images, base)}/"
        if not is_dir(images):
            raise FileNotFoundError(f"images folder of split {s.split!r} not found: {images}")
        if s.masks is None or not is_dir(masks):
            raise FileNotFoundError(f"masks folder of split {s.split!r} not found: {s.masks}")
        listed = (_direct_images(images), _direct_images(masks)) if not s.recursive else None
        isuf, msuf = s.image_suffix, s.mask_suffix
        if isuf is None and msuf is None and not (s.image_prefix or s.mask_prefix):
            isuf, msuf, _, listed = _suffixes(SourceSpec(root=base), images, masks, listed)
        only = set(read_split_list(s.split_list)) if s.split_list else None
        prefixes = (s.image_prefix, s.mask_prefix)
        if s.bands and isuf is None and msuf is None and not any(prefixes):
            isuf, msuf, *prefixes = band_tokens(images, masks)
        p = pair_by_name(images, masks, s.split, key_prefix, image_suffix=isuf, mask_suffix=msuf, listed=listed,
                         image_prefix=prefixes[0], mask_prefix=prefixes[1], only=only, list_file=s.split_list,
                         masks_drive=s.skip_unpaired)
        if s.bands:
            attach_bands(p, s.bands)
        out.add(p)
        out.sources.append(s)
    return out


class Sources(Layout):
    """Folder pairs named one by one: ``--spec FILE`` or repeated ``--images/--masks/--split``."""

    name = "spec"

    def detect(self, root: str) -> str | None:
        return None

    def pairs(self, root: str, spec: SourceSpec) -> Listing:
        return sources_listing(spec.sources, spec.base)


class Content(Layout):
    """Image and mask folders found by what pairs (`converter.discover.content`)."""

    name = "content"

    def detect(self, root: str) -> str | None:
        found = find_by_content(root)
        return found.why if found is not None else None

    def pairs(self, root: str, spec: SourceSpec) -> Listing:
        found = find_by_content(root)
        return sources_listing(found.sources if found is not None else (), root)


LAYOUTS: dict[str, Layout] = {lay.name: lay for lay in (CamVid(), Voc(), Cityscapes(), Ade(), Mmseg(), Unet(), Explicit(),
                                                        Content(), Sources())}
LAYOUTS.update(ANNOTATION_LAYOUTS)  # type: ignore[arg-type]  # annotation files: asked first, by content
#: Asked first; `unet` (any image folder + mask folder) only when none of these matches.
_SPECIFIC = ("camvid", "voc", "cityscapes", "ade", "mmseg")


@dataclass(frozen=True)
class Detected:
    layout: Layout
    why: str
    forced: bool = False


def _check_labels_folders(root: str) -> None:
    """A `SPLIT_labels` that is a file (beside its SPLIT/ folder) is named as such, not as "no layout"."""
    for d in subdirs(root):
        images = os.path.join(root, d)
        check_masks_folder(images + LABELS_SUFFIX, images, len(list_images(images)))


def detect_layout(root: str, forced: str | None = None) -> Detected:
    """The segmentation layout of `root` (see the module docstring); `forced`: --layout NAME."""
    if not is_dir(root):
        raise FileNotFoundError(f"Source folder not found: {root}. Pass the folder that holds the images and masks "
                                "(e.g. train/ and train_labels/).")
    if forced is not None:
        if forced not in LAYOUTS:
            raise LayoutError(f"--layout {forced} is not a segmentation layout; choose one of {sorted(LAYOUTS)}")
        why = LAYOUTS[forced].detect(root)
        if why is None:
            raise LayoutError(f"--layout {forced}: {root} does not have its folders. {_expected(forced)}")
        return Detected(LAYOUTS[forced], why, True)
    hits = [(lay, why) for lay in ANNOTATION_LAYOUTS.values() for why in [lay.detect(root)] if why is not None]
    hits = hits or [(LAYOUTS[n], why) for n in _SPECIFIC for why in [LAYOUTS[n].detect(root)] if why is not None]
    if not hits:
        why = LAYOUTS["unet"].detect(root)
        hits = [(LAYOUTS["unet"], why)] if why is not None else []
    if len(hits) == 1:
        return Detected(*hits[0])
    if len(hits) > 1:
        choices = "\n".join(f"  --layout {lay.name}: {why}" for lay, why in hits)
        raise LayoutError(f"{root} looks like more than one layout; choose one:\n{choices}\n"
                          "(or name the folders: --images DIR --masks DIR)")
    _check_labels_folders(root)
    raise LayoutNotFound(
        f"No split folders found in {root}: it matches no known layout. Expected the CamVid layout ({root}/train/ "
        f"with images, {root}/train_labels/ with masks and {root}/class_dict.csv), or one of: Pascal VOC (JPEGImages/ + "
        "SegmentationClass/), Cityscapes (leftImg8bit/ + gtFine/), ADE20K (images/ + annotations/), mmseg "
        "(img_dir/ + ann_dir/), image/ + label/ (or images/ + masks/). Found folders: "
        f"{subdirs(root)}. For other layouts pass --images DIR --masks DIR.")


def discover(spec: SourceSpec) -> Discovery:
    """List samples and source problems for a `SourceSpec` (the layout detected or forced);
    an object-store source is listed once (`converter.discover.files`)."""
    spec.use_storage()
    with source_scope():
        return _discover(spec)


def _weak(listing: Listing) -> bool:
    """A name-detected layout whose pairing content detection may beat: no pair, or images or masks left alone."""
    return not any(len(b) for b in listing.samples) or any(b.reason in ("image without mask", "mask without image")
                                                           for b in listing.bad)


def _paired(listing: Listing | None) -> int:
    return 0 if listing is None else sum(len(b) for b in listing.samples)


def detect_and_pair(root: str, spec: SourceSpec) -> tuple[Detected, Listing]:
    """The layout and its pairs: a name-detected layout is a strong hint, kept unless it pairs
    nothing or leaves files alone and pairing by content pairs more (`converter.discover.content`)."""
    named = spec.image_suffix is not None or spec.mask_suffix is not None or spec.split_lists
    if spec.layout is not None or named:  # forced, or names given: no second guess
        det = detect_layout(root, spec.layout)
        return det, det.layout.pairs(root, spec)
    error: Exception | None = None
    det, listing = None, None
    try:
        det = detect_layout(root)  # several layouts by name: that error stands (--layout picks one)
        listing = det.layout.pairs(root, spec)
    except (LayoutNotFound, SourceLayoutError, SeveralMaskFolders) as e:
        error = e
    annotations = det is not None and det.layout.name in ANNOTATION_LAYOUTS  # annotation files: their own content
    if annotations and listing is not None and det.layout.name != "instances":  # mask images too? (issue 27)
        other = _mask_reading(root, spec)
        if other is not None:
            return _one_reading(root, det, listing, *other)  # type: ignore[arg-type]
    if not annotations and (listing is None or _weak(listing)):
        try:
            found = find_by_content(root)
        except ContentTie:
            if listing is not None and _paired(listing):
                return det, listing  # type: ignore[return-value]
            raise
        if found is not None and (found.paired > _paired(listing) or found.paired == _paired(listing)):
            by_content = sources_listing(found.sources, root)
            if listing is None or (_paired(by_content), -len(by_content.bad)) > (_paired(listing), -len(listing.bad)):
                return Detected(LAYOUTS["content"], found.why), by_content
    if error is not None:
        raise error
    return det, listing  # type: ignore[return-value]


def _mask_reading(root: str, spec: SourceSpec) -> tuple[Detected, Listing] | None:
    """The mask-image reading of a folder that has an annotation file (COCO-Stuff's stuffthingmaps/ next to
    COCO's instances JSON, TGS's train/masks/ next to train.csv): a mask layout by name, else by content;
    None when no mask folder pairs (`ContentTie` stands: the mask folders themselves are ambiguous)."""
    for name in _SPECIFIC + ("unet",):
        why = LAYOUTS[name].detect(root)
        if why is None:
            continue
        try:
            listing = LAYOUTS[name].pairs(root, spec)
        except (LayoutNotFound, SourceLayoutError, LayoutError):
            continue
        if _paired(listing):
            return Detected(LAYOUTS[name], why), listing
    found = find_by_content(root)
    if found is not None and found.paired:
        return Detected(LAYOUTS["content"], found.why), sources_listing(found.sources, root)
    return None


def _one_reading(root: str, det: Detected, listing, masks: Detected, by_masks: Listing) -> tuple[Detected, Listing]:
    """Both readings of the images they share compared (`annotations.ambiguity`): agreeing, the mask
    images are read and the evidence says so; disagreeing, `ReadingsDisagree` names the flag for each."""
    annotated = [s for block in listing.samples for s in block]
    found = compare_readings(det.layout.name, annotated, [s for block in by_masks.samples for s in block])
    if found is None:
        return det, listing
    result, count = found
    if count * 2 < len(annotated):  # mask images of a few of the photos, paired by chance: no second reading
        return det, listing
    rows = " read along the rows (--rle-order rows)" if result.rle_order == "rows" else ""
    if result.agree:
        return Detected(masks.layout, f"{masks.why}; {det.why}{rows} agrees ({result.evidence()}): "
                        "reading the mask images"), by_masks
    pick = f"--layout {masks.layout.name}" + "".join(f" (or --images {s.images} --masks {s.masks})"
                                                      for s in by_masks.sources[:1])
    raise ReadingsDisagree(
        f"{root}: an annotation file and mask images describe the same {count} images and disagree "
        f"({result.evidence()}):\n  annotations: {det.why} -> --layout {det.layout.name}\n"
        f"  mask images: {masks.why} -> {pick}\nChoose the reading with its flag (or `imgshard scan SRC "
        f"--write-spec FILE` after choosing). Received: both readings, no flag")


def _discover(spec: SourceSpec) -> Discovery:
    if any(s.annotations is not None for s in spec.sources):  # a spec's annotation files (issue 27)
        layout, why, listing, defaults = follow_spec(spec)
        det = Detected(layout, why, True)  # type: ignore[arg-type]
        csv_path = spec.classes
    elif spec.sources:
        det = Detected(LAYOUTS["spec"], "folder pairs: " + ", ".join(
            f"{s.split}: {s.images} + {s.masks}" for s in spec.sources), True)
        listing = det.layout.pairs(spec.base, spec)
        meaning = spec.layout if spec.layout in _SPECIFIC + ("unet",) else None  # a spec's "layout": its mask meaning
        defaults = LAYOUTS[meaning].defaults(absolute(spec.root)) if meaning and spec.root else LayoutDefaults()
        csv_path = spec.classes
    elif spec.root is not None:
        root = absolute(spec.root)
        det, listing = detect_and_pair(root, spec)
        defaults = det.layout.defaults(root)
        if spec.classes is None and not is_file(os.path.join(root, "class_dict.csv")):  # no table given or found
            defaults = _with_names_file(defaults, root)
        csv_path = spec.classes or (os.path.join(root, "class_dict.csv")
                                    if is_file(os.path.join(root, "class_dict.csv")) or det.layout.name == "camvid"
                                    else None)
    else:
        images = absolute(spec.images)  # type: ignore[arg-type]
        if not is_dir(images):
            raise FileNotFoundError(f"--images folder not found: {images}")
        if spec.masks is None:
            raise ValueError("--images needs --masks DIR for segmentation.")
        if not is_dir(absolute(spec.masks)):
            raise FileNotFoundError(f"--masks folder not found: {absolute(spec.masks)}")
        det = Detected(LAYOUTS["explicit"], f"--images {spec.images} --masks {spec.masks}", True)
        listing = det.layout.pairs(images, spec)
        defaults = LayoutDefaults()
        csv_path = spec.classes
    bad = list(listing.bad)
    for block in listing.samples:  # one stat per file, kept for the planner
        block.check(bad)
    return Discovery(SampleList(listing.samples), tuple(bad), tuple(listing.splits), csv_path, layout=det.layout.name,
                     why=det.why, defaults=defaults, suffixes=listing.suffixes, unpaired_images=listing.unpaired_images,
                     scope=_scope(listing), sources=tuple(getattr(listing, "sources", ())))


def _scope(listing) -> tuple[tuple[str, str, str], ...]:
    """(split, images folder, masks folder) per folder pair; annotation files: their splits (`converter.plan.scope`)."""
    out = []
    for b in listing.samples:
        if isinstance(b, SampleBlock):
            out.append((b.split, b.image_base, b.mask_base))
        else:
            out += [(split, "", "") for split in sorted({s.split for s in b})]
    return tuple(out)


def _with_names_file(defaults: LayoutDefaults, root: str) -> LayoutDefaults:
    """A layout's defaults, with the classes of a names file beside the data when the layout
    brings none of its own (issue 24)."""
    if defaults.names_file or defaults.class_names or defaults.label_map:
        return defaults
    path = find_names_file(root)
    if path is None:
        return defaults
    found = names_defaults(path, None)
    if defaults.two_level:  # binary masks take the names of a two-name file
        return dataclasses.replace(defaults, names_file=path)
    return dataclasses.replace(defaults, names_file=path, classes_from=found.classes_from)


def _expected(name: str) -> str:
    return {"camvid": "Expected SRC/train/ + SRC/train_labels/.", "voc": "Expected JPEGImages/ + SegmentationClass/.",
            "cityscapes": "Expected leftImg8bit/ + gtFine/.", "ade": "Expected images/ + annotations/.",
            "mmseg": "Expected img_dir/ + ann_dir/.", "unet": "Expected image/ + label/ or images/ + masks/.",
            "content": "Expected a folder of images and a folder of masks whose names pair.",
            "spec": "Give the folder pairs with --spec FILE or repeated --images/--masks/--split.",
            }.get(name, "")
