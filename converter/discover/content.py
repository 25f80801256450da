"""Pairing by content: image and mask folders found from what pairs, not from folder names.

Every folder under SRC that holds image files directly is a candidate, on either side.
For each (image folder, mask folder) candidate the name tokens that make stems match are
inferred (`infer_tokens`: a suffix, e.g. ``21_training`` / ``21_manual1``, or a prefix,
e.g. ``red_patch_7`` / ``gt_patch_7``; a token never cuts a run of digits or letters, so
``3`` never pairs with ``13``; both at once, ``img_0007_rgb`` / ``lbl_0007_mask``, from each
folder's shared prefix and suffix; images and masks in one folder, ``000_img`` / ``000_masks``, by their
last words: `within_folder`), and the pair scores the number of images it pairs. The
assignment takes the best pairs first, one mask folder per image folder, a folder on one
side only. Never chosen as mask folders: JPEG overlays (``*Visualization/``, ``*overlay*``),
per-class sub-folders of a mask folder that pairs as well. Which side holds the masks:
folder names, name tokens (``mask``, ``gt``, ``label``...), then the files (JPEG or RGB
is the image side). Splits come from folder names at any depth (``train``, ``training``,
``train_images``, ``images_train``, ``images_x_train``; none: ``train``; or, for one folder pair,
the split lists beside it: `split_lists_beside`). Two choices that
pair equally well stop with `ContentTie`, listing the flags that pick one.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import re
import shlex
from collections import Counter
from dataclasses import dataclass

from converter.discover.files import file_names, join, subfolders
from converter.discover.layout import IMAGE_EXTENSIONS
from converter.options import SplitSource

SEPARATORS = "_-. "
_FIRST_WORD = re.compile(r"[^_\-. ]+[_\-. ]+")
SPLIT_WORDS = frozenset({"train", "training", "val", "valid", "validation", "test", "testing", "trainval", "dev"})
OVERLAY_WORDS = ("visualization", "visualisation", "overlay")
MASK_WORDS = ("mask", "label", "gt", "manual", "seg", "annot", "trimap", "groundtruth", "ground_truth", "ann")
IMAGE_WORDS = ("image", "img", "jpegimages", "input", "rgb", "photo", "leftimg8bit")
JPEG = frozenset({".jpg", ".jpeg", ".jfif"})
#: Folders looked at, and how deep (a class-folder tree has thousands).
MAX_FOLDERS = 300
MAX_DEPTH = 5
#: Image names per folder whose neighbours vote for the tokens.
VOTERS = 60


class ContentTie(ValueError):
    """Two assignments pair equally well: the message lists the flags that pick one (exit 65)."""

    exit_code = 65


@dataclass(frozen=True)
class Folder:
    rel: str  # relative to SRC, '/'-separated ('' for SRC itself)
    path: str
    stems: tuple[str, ...]  # image file names without extension, sorted
    jpeg_share: float  # share of JPEG files
    split: str | None  # the split its path names


@dataclass(frozen=True)
class Tokens:
    image_prefix: str = ""
    image_suffix: str = ""
    mask_prefix: str = ""
    mask_suffix: str = ""

    def describe(self) -> str:
        return (f"{self.image_prefix or ''}<name>{self.image_suffix or ''} ~ "
                f"{self.mask_prefix or ''}<name>{self.mask_suffix or ''}")


@dataclass(frozen=True)
class Candidate:
    images: Folder
    masks: Folder
    tokens: Tokens
    paired: int


@dataclass(frozen=True)
class ContentResult:
    sources: tuple[SplitSource, ...]
    chosen: tuple[Candidate, ...]
    paired: int
    why: str
    set_aside: tuple[Candidate, ...] = ()  # mask folders that paired as well, set aside by a tie rule


def split_of(rel: str) -> str | None:
    """The split a folder path names (any depth; ``train_images``, ``images_x_train`` too; a year or
    version glued on, COCO's ``train2017``/``val2017``, names ``train``/``val``). The folder nearest the
    files wins: COCO-Stuff's ``stuffthingmaps_trainval2017/val2017/`` is ``val``."""
    for part in reversed(rel.split("/")):
        words = [w for w in re.split(r"[_\-. ]+", part.lower()) if w]
        for w in words:
            w = re.sub(r"(?<=[a-z])\d+$", "", w)
            if w in SPLIT_WORDS:
                return w
    return None


def image_folders(root: str) -> list[Folder]:
    """Folders under `root` (itself included) that hold image files directly, breadth first."""
    out: list[Folder] = []
    level, seen = [""], 0
    for _ in range(MAX_DEPTH + 1):
        nxt = []
        for rel in level:
            path = join(root, rel) if rel else root
            names = [n for n in file_names(path) if os.path.splitext(n)[1].lower() in IMAGE_EXTENSIONS]
            if names:
                jpeg = sum(os.path.splitext(n)[1].lower() in JPEG for n in names) / len(names)
                stems = tuple(sorted({os.path.splitext(n)[0] for n in names}))
                out.append(Folder(rel, path, stems, jpeg, split_of(rel)))
            seen += 1
            if seen >= MAX_FOLDERS:
                return out
            nxt += [f"{rel}/{d}" if rel else d for d in subfolders(path)]
        level = nxt
        if not level:
            break
    return out


def _cut_ok(x: str, k: int) -> bool:
    """Whether cutting `x` at `k` keeps runs of digits and of letters whole."""
    if k <= 0 or k >= len(x):
        return True
    a, b = x[k - 1], x[k]
    return not (a.isalnum() and b.isalnum()) or a.isdigit() != b.isdigit()


def _suffix_tokens(s: str, m: str) -> Tokens | None:
    k = len(os.path.commonprefix([s, m]))
    while k > 0 and not (_cut_ok(s, k) and _cut_ok(m, k)):
        k -= 1
    while k > 0 and s[k - 1] in SEPARATORS:
        k -= 1
    return Tokens(image_suffix=s[k:], mask_suffix=m[k:]) if k > 0 else None


def _prefix_tokens(s: str, m: str) -> Tokens | None:
    c = len(os.path.commonprefix([s[::-1], m[::-1]]))
    while c > 0 and not (_cut_ok(s, len(s) - c) and _cut_ok(m, len(m) - c)):
        c -= 1
    while c > 0 and s[len(s) - c] in SEPARATORS:
        c -= 1
    return Tokens(image_prefix=s[:len(s) - c], mask_prefix=m[:len(m) - c]) if c > 0 else None


def bases(stems: tuple[str, ...] | list[str], prefix: str, suffix: str) -> set[str]:
    """The names left once `prefix` and `suffix` are cut (names lacking them, or with nothing left, dropped)."""
    out = set()
    for s in stems:
        if s.startswith(prefix) and s.endswith(suffix) and len(s) > len(prefix) + len(suffix):
            out.add(s[len(prefix):len(s) - len(suffix)])
    return out


def _end_token(stems: tuple[str, ...] | list[str], at_start: bool) -> str:
    """The token most stems start (or end) with: the stems whose first word (up to a separator) is
    the most common one, if more than half, else all; their shared start, cut where no run of digits
    or letters is split and kept short of the whole name ('' when they share none). A few strays
    (``Thumbs``, ``notes_1``) do not hide it."""
    if len(stems) < 2:
        return ""
    names = list(stems) if at_start else [x[::-1] for x in stems]
    words = Counter(m.group(0) for x in names for m in [_FIRST_WORD.match(x)] if m)
    if words:
        word, n = words.most_common(1)[0]
        if n * 2 > len(names) and n >= 2:
            names = [x for x in names if x.startswith(word)]
    k = min(len(os.path.commonprefix(names)), min(len(x) for x in names) - 1)
    while k > 0 and not all(_cut_ok(x if at_start else x[::-1], k if at_start else len(x) - k) for x in names):
        k -= 1
    token = names[0][:k]
    return token if at_start else token[::-1]


def _both_ends(image_stems: tuple[str, ...], mask_stems: tuple[str, ...]) -> Tokens:
    """Tokens at both ends at once (``img_0007_rgb`` ~ ``lbl_0007_mask``): each folder's shared
    prefix and suffix, which neighbour votes cannot see (sorted names of the two sides do not meet)."""
    return Tokens(_end_token(image_stems, True), _end_token(image_stems, False),
                  _end_token(mask_stems, True), _end_token(mask_stems, False))


def infer_tokens(image_stems: tuple[str, ...], mask_stems: tuple[str, ...]) -> tuple[Tokens, int]:
    """The tokens that pair the most image names with mask names, and how many they pair."""
    if not image_stems or not mask_stems:
        return Tokens(), 0
    masks = sorted(mask_stems)
    reversed_masks = sorted(m[::-1] for m in mask_stems)
    step = max(1, len(image_stems) // VOTERS)
    votes: dict[Tokens, int] = {Tokens(): 0}
    for s in image_stems[::step]:
        i = bisect.bisect_left(masks, s)
        near = masks[max(0, i - 2):i + 3]
        j = bisect.bisect_left(reversed_masks, s[::-1])
        near_rev = [r[::-1] for r in reversed_masks[max(0, j - 2):j + 3]]
        found = [_suffix_tokens(s, m) for m in near] + [_prefix_tokens(s, m) for m in near_rev]
        for t in {t for t in found if t is not None}:
            votes[t] = votes.get(t, 0) + 1
    best, best_n = Tokens(), -1
    ranked = sorted(votes, key=lambda t: (-votes[t], t.image_prefix, t.image_suffix, t.mask_prefix, t.mask_suffix))
    for t in ranked[:8] + [_both_ends(image_stems, mask_stems)]:
        n = len(bases(image_stems, t.image_prefix, t.image_suffix) & bases(mask_stems, t.mask_prefix, t.mask_suffix))
        if n > best_n:
            best, best_n = t, n
    return best, max(best_n, 0)


def _mask_likeness(folder: Folder, prefix: str, suffix: str) -> int:
    """How much a folder looks like the mask side: its path's names, its name tokens, its files."""
    score = 0
    parts = [p.lower() for p in folder.rel.split("/") if p]
    last = parts[-1] if parts else ""
    if any(w in last for w in MASK_WORDS):
        score += 3
    elif any(any(w in p for w in MASK_WORDS) for p in parts[:-1]):
        score += 1
    if any(w in last for w in IMAGE_WORDS):
        score -= 3
    token = (prefix + suffix).lower()
    if any(w in token for w in MASK_WORDS):
        score += 2
    if any(w in token for w in IMAGE_WORDS):
        score -= 2
    if folder.jpeg_share > 0.5:
        score -= 1
    return score


def _peek_mask_like(folder: Folder) -> int:
    """1 when the folder's first image decodes as one channel (or a palette), -1 as colour, 0 unknown."""
    import io

    from PIL import Image

    from converter.discover.files import read_head

    for name in file_names(folder.path):
        if os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS:
            try:  # the header only (a local file or an object: one ranged GET)
                with Image.open(io.BytesIO(read_head(join(folder.path, name), 1 << 16))) as im:
                    return 1 if im.mode in ("1", "L", "P", "I", "I;16", "I;16B", "I;16L") else -1
            except (OSError, ValueError):
                return 0
    return 0


def _never_masks(folder: Folder) -> bool:
    """JPEG overlays; folders whose name says nothing of masks and whose files are JPEG or colour
    (class folders, photos: a mask folder by content holds one-channel or palette images)."""
    name = folder.rel.lower()
    if any(w in name for w in OVERLAY_WORDS):
        return True
    if any(w in name.rsplit("/", 1)[-1] for w in MASK_WORDS):
        return False
    return folder.jpeg_share > 0.5 or _peek_mask_like(folder) <= 0


def _class_named(folder: Folder, prefix: str) -> bool:
    """Names that start with their folder's name (``bird/bird_0001``): class folders, not images and masks."""
    last = folder.rel.rsplit("/", 1)[-1].lower()
    return bool(prefix) and bool(last) and prefix.lower().strip(SEPARATORS) == last


def _named_masks(folder: Folder) -> bool:
    """A folder whose name, or a parent's, says masks (``1st_manual``, ``gt``, ``masks/FV``) and whose own
    name says nothing of images: never the image side."""
    parts = [p.lower() for p in folder.rel.split("/") if p]
    if not parts or any(w in parts[-1] for w in IMAGE_WORDS):
        return False
    return any(any(w in p for w in MASK_WORDS) for p in parts)


def candidates(folders: list[Folder]) -> list[Candidate]:
    """Every (image folder, mask folder) that pairs at least one image, oriented by `_mask_likeness`.
    Which folders may hold masks is asked once per folder (one file's header at most), and a pair
    where neither side may is not looked at (class folders: no name is compared)."""
    can_mask = [not _never_masks(f) for f in folders]
    out = []
    for i, a in enumerate(folders):
        for j in range(i + 1, len(folders)):
            b = folders[j]
            if not (can_mask[i] or can_mask[j]) or (a.split is not None and b.split is not None and a.split != b.split):
                continue
            tokens, n = infer_tokens(a.stems, b.stems)
            if n == 0 or (_class_named(a, tokens.image_prefix) and _class_named(b, tokens.mask_prefix)):
                continue
            like_b = _mask_likeness(b, tokens.mask_prefix, tokens.mask_suffix)
            like_a = _mask_likeness(a, tokens.image_prefix, tokens.image_suffix)
            if like_a == like_b:
                like_a, like_b = _peek_mask_like(a), _peek_mask_like(b)
            flipped = Tokens(tokens.mask_prefix, tokens.mask_suffix, tokens.image_prefix, tokens.image_suffix)
            if like_b >= like_a and can_mask[j] and not _named_masks(a):
                out.append(Candidate(a, b, tokens, n))
            if like_a >= like_b and can_mask[i] and not _named_masks(b):
                out.append(Candidate(b, a, flipped, n))
    return out


def within_folder(folder: Folder) -> Candidate | None:
    """Images and masks in one folder, told apart by a last word (Cellpose's ``000_img`` + ``000_masks``):
    two words that end 90% of the names, one of them a mask word and the other not, pairing 2 names or more."""
    words = Counter(s.rpartition("_")[2] for s in folder.stems if "_" in s)
    top = words.most_common(2)
    if len(top) < 2 or (top[0][1] + top[1][1]) * 10 < len(folder.stems) * 9:
        return None
    masky = [w for w, _ in top if any(m in w.lower() for m in MASK_WORDS)]
    if len(masky) != 1:
        return None
    mask_word = masky[0]
    image_word = next(w for w, _ in top if w != mask_word)
    images = dataclasses.replace(folder, stems=tuple(s for s in folder.stems if s.endswith("_" + image_word)))
    masks = dataclasses.replace(folder, stems=tuple(s for s in folder.stems if s.endswith("_" + mask_word)))
    tokens = Tokens(image_suffix="_" + image_word, mask_suffix="_" + mask_word)
    n = len(bases(images.stems, "", tokens.image_suffix) & bases(masks.stems, "", tokens.mask_suffix))
    return Candidate(images, masks, tokens, n) if n >= 2 else None


def _class_subfolder(c: Candidate, cands: list[Candidate]) -> bool:
    """A mask folder below another mask folder of the same image folder that pairs at least as well."""
    return any(o.images == c.images and o.masks != c.masks and c.masks.rel.startswith(o.masks.rel + "/")
               and o.paired >= c.paired for o in cands)


def _rank(c: Candidate) -> tuple:
    return (-c.paired, c.masks.jpeg_share, -_mask_likeness(c.masks, c.tokens.mask_prefix, c.tokens.mask_suffix),
            c.images.rel, c.masks.rel)


def choose(cands: list[Candidate], root: str, set_aside: list[Candidate] | None = None,
           whole: bool = True) -> list[Candidate]:
    """The assignment: best pairs first, one mask folder per image folder, each folder on one side.
    Mask folders a tie rule set aside (`_labels_over_regions`) are added to `set_aside`. A tie stops
    (`ContentTie`), listing whole alternatives when `whole` (`alternatives`)."""
    set_aside = [] if set_aside is None else set_aside
    cands = [c for c in cands if not _class_subfolder(c, cands)]
    every = list(cands)
    cands.sort(key=_rank)
    chosen: list[Candidate] = []
    used_images: set[str] = set()
    used_masks: set[str] = set()
    for c in cands:
        if c.images.rel in used_images or c.images.rel in used_masks or c.masks.rel in used_images:
            continue
        if c.masks.rel in used_masks:
            continue
        rivals = [o for o in cands if o is not c and _rank(o)[:3] == _rank(c)[:3]
                  and (o.images == c.images or o.masks == c.masks)
                  and o.images.rel not in used_masks | used_images and o.masks.rel not in used_images | used_masks]
        if rivals:
            c, rivals = _labels_over_regions([c, *rivals])
            if rivals:
                alts = alternatives(every, [c, *rivals], root) if whole else []
                raise ContentTie(_alternatives_message(root, alts) if alts else _tie_message(root, [c, *rivals]))
            set_aside.extend(o for o in cands if o.images == c.images and o.masks != c.masks
                             and _rank(o)[:3] == _rank(c)[:3])
        chosen.append(c)
        used_images.add(c.images.rel)
        used_masks.add(c.masks.rel)
    return chosen


#: Two masks equal on this share of the pixels where either is not background are the same mask.
SAME_MASK_SHARE = 0.95
#: Masks of a tied candidate compared to tell labels from a region mask.
REGION_PEEKS = 3


def _mask_paths(c: Candidate, n: int) -> list[str]:
    """Up to `n` mask files of `c` that pair, spread over the folder (sorted names)."""
    paired = bases(c.images.stems, c.tokens.image_prefix, c.tokens.image_suffix)
    names = [f for f in file_names(c.masks.path) if os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS
             and bases([os.path.splitext(f)[0]], c.tokens.mask_prefix, c.tokens.mask_suffix) & paired]
    picked = sorted({round(i * (len(names) - 1) / max(1, n - 1)) for i in range(min(n, len(names)))})
    return [join(c.masks.path, names[i]) for i in picked]


def same_everywhere(c: Candidate) -> bool:
    """Whether `c`'s masks are one mask repeated (DRIVE's ``mask/``: the camera's field of view,
    the same disk for every image): a region of interest, not labels of each image."""
    import io

    import numpy as np
    from PIL import Image

    from converter.discover.files import files_for

    arrays = []
    for path in _mask_paths(c, REGION_PEEKS):
        try:
            with Image.open(io.BytesIO(files_for(path).read(path)[0])) as im:
                arrays.append(np.asarray(im.convert("L")))
        except (OSError, ValueError):
            return False
    if len(arrays) < 2 or any(a.shape != arrays[0].shape for a in arrays):
        return False
    first = arrays[0]
    background = np.bincount(first.ravel(), minlength=256).argmax()
    for a in arrays[1:]:  # compared where either is not background: sparse labels never look alike
        either = (first != background) | (a != background)
        if not either.any() or np.count_nonzero((a == first) & either) < SAME_MASK_SHARE * np.count_nonzero(either):
            return False
    return True


def _labels_over_regions(tied: list[Candidate]) -> tuple[Candidate, list[Candidate]]:
    """(the choice, the rivals left): mask folders that pair one image folder equally well, where
    exactly one holds masks that differ from image to image and the others one mask repeated
    (a field of view): the labels win. Otherwise the first and every rival (a tie)."""
    if len({t.images for t in tied}) == 1:
        varying = [t for t in tied if not same_everywhere(t)]
        if len(varying) == 1:
            return varying[0], []
    return tied[0], tied[1:]


def _tie_message(root: str, tied: list[Candidate]) -> str:
    lines = [f"{root}: {len(tied)} folder pairings pair equally well ({tied[0].paired} image(s) each); "
             "choose one with its flags (repeat --images/--masks/--split for several splits), or edit the spec "
             "that `imgshard scan SRC --write-spec FILE` writes:"]
    for c in tied:
        lines.append(f"  --images {c.images.path} --masks {c.masks.path} --split {c.images.split or 'train'}"
                     f"   ({c.tokens.describe()})")
    return "\n".join(lines)


def _anchor(c: Candidate) -> str:
    """The folder holding both sides of a pair ('' for SRC): ``tiff`` for ``tiff/train`` + ``tiff/train_labels``."""
    common = []
    for x, y in zip(c.images.rel.split("/"), c.masks.rel.split("/")):
        if x != y:
            break
        common.append(x)
    return "/".join(common)


def _under(rel: str, folder: str) -> bool:
    return folder == "" or rel == folder or rel.startswith(folder + "/")


def alternatives(cands: list[Candidate], tied: list[Candidate], root: str) -> list[tuple[str, list[Candidate]]]:
    """Whole choices behind a tie of two copies of one dataset (Massachusetts Roads: ``tiff/`` and ``png/``,
    each with every split): for each tree holding both sides of a tied pair (none holding another), the
    assignment of the folders outside the other trees, (tree, pairs). [] when the tie is not between
    trees, or a tree's own assignment still ties (then the tied pairs are listed as they are)."""
    group = list(tied)  # with every pair as good that shares a folder with one of them (tiff/train + tiff/...)
    for c in cands:
        if c not in group and any(_rank(c)[:3] == _rank(t)[:3] and (c.images == t.images or c.masks == t.masks)
                                  for t in group):
            group.append(c)
    anchors = sorted({_anchor(t) for t in group})
    trees = [a for a in anchors if not any(b != a and _under(b, a) for b in anchors)]
    if len(trees) < 2:
        return []
    out = []
    for tree in trees:
        others = [t for t in trees if t != tree]
        sub = [c for c in cands if not any(_under(c.images.rel, o) or _under(c.masks.rel, o) for o in others)]
        try:
            chosen = choose(sub, root, whole=False)
        except ContentTie:
            return []
        out.append((tree, sorted(chosen, key=lambda c: (c.images.split or "train", c.images.rel))))
    return sorted(out, key=lambda a: (-sum(c.paired for c in a[1]), a[0]))


def _alternatives_message(root: str, alts: list[tuple[str, list[Candidate]]]) -> str:
    lines = [f"{root}: {len(alts)} folder trees pair equally well (the same samples twice?); pick one. Each line "
             "below is a whole choice, every split of one tree; `imgshard scan` with its flags prints the convert "
             "command (and `--write-spec FILE` writes its spec):"]
    for tree, chosen in alts:
        flags = " ".join(f"--images {shlex.quote(c.images.path)} --masks {shlex.quote(c.masks.path)} "
                         f"--split {c.images.split or 'train'}" for c in chosen)
        lines.append(f"  {tree}/ ({sum(c.paired for c in chosen)} image(s)): imgshard scan {flags}")
    return "\n".join(lines)


def to_sources(chosen: list[Candidate]) -> tuple[SplitSource, ...]:
    """The chosen pairs as `SplitSource`s (exact tokens, no recursion), sorted by split then folder."""
    out = []
    for c in sorted(chosen, key=lambda c: (c.images.split or "train", c.images.rel)):
        t = c.tokens
        out.append(SplitSource(c.images.split or "train", c.images.path, c.masks.path, t.image_prefix, t.image_suffix,
                               t.mask_prefix, t.mask_suffix, recursive=False, skip_unpaired=bool(companions(c))))
    return tuple(out)


def companions(c: Candidate) -> tuple[str, ...]:
    """Stems of the image folder that are not images of their own but files beside a paired image,
    ``<name>_<word>`` (ISIC 2017's ``ISIC_0000000_superpixels.png`` beside ``ISIC_0000000.jpg``),
    when every image left without a mask is one of them, one word for all; () otherwise."""
    t = c.tokens
    paired = bases(c.images.stems, t.image_prefix, t.image_suffix) & bases(c.masks.stems, t.mask_prefix, t.mask_suffix)
    paired_stems = {s for s in c.images.stems if bases([s], t.image_prefix, t.image_suffix) & paired}
    left = [s for s in c.images.stems if s not in paired_stems]
    words = set()
    for s in left:
        head, sep, word = s.rpartition("_")
        if not sep or not word.isalpha() or head not in paired_stems:
            return ()
        words.add(word)
    return tuple(left) if len(words) == 1 else ()


def find_by_content(root: str) -> ContentResult | None:
    """The folder pairs of `root` found by content (see the module docstring); None: nothing pairs."""
    set_aside: list[Candidate] = []
    folders = image_folders(root)
    cands = candidates(folders)
    cands += [c for c in map(within_folder, folders) if c is not None
              and not any(o.paired >= c.paired and c.images.rel in (o.images.rel, o.masks.rel) for o in cands)]
    chosen = choose(cands, root, set_aside)
    if not chosen:
        return None
    why = "pairing by content: " + ", ".join(
        f"{c.images.rel or '.'}/ + {c.masks.rel or '.'}/ ({c.paired} pairs, {c.tokens.describe()})"
        for c in sorted(chosen, key=lambda c: c.images.rel))
    sources = to_sources(chosen)
    for c in chosen:
        beside = companions(c)
        if beside:
            why += (f"; {len(beside)} file(s) beside the images in {c.images.rel or '.'}/ are not images "
                    f"({beside[0]}, ...): left out")
    lists = split_lists_beside(root, chosen[0]) if len(chosen) == 1 and chosen[0].images.split is None else ()
    if lists:
        sources = tuple(dataclasses.replace(sources[0], split=split, split_list=path) for split, path in lists)
        why += "; splits from the lists " + ", ".join(os.path.relpath(p, root) for _, p in lists)
    return ContentResult(sources, tuple(chosen), sum(c.paired for c in chosen),
                         why + _set_aside_note(chosen, set_aside), tuple(set_aside))


def split_lists_beside(root: str, c: Candidate) -> tuple[tuple[str, str], ...]:
    """(split, file) of the split lists that divide one folder pair's images, when no folder names a
    split (Oxford-IIIT Pet: annotations/trainval.txt + annotations/test.txt): ``<split word>.txt`` at
    SRC or one folder down; at least two, disjoint, each naming images of the pair (90% of its
    names), together 90% of the images; ``trainval`` left out when ``train`` and ``val`` are there."""
    from converter.discover.pairing import read_split_list

    names = bases(c.images.stems, c.tokens.image_prefix, c.tokens.image_suffix)
    found: dict[str, list[str]] = {}
    for folder in [root] + [join(root, d) for d in subfolders(root)]:
        for n in file_names(folder):
            word, ext = os.path.splitext(n)
            if ext.lower() == ".txt" and word.lower() in SPLIT_WORDS:
                found.setdefault(word.lower(), []).append(join(folder, n))
    if "train" in found and "val" in found:
        found.pop("trainval", None)
    if len(found) < 2 or any(len(paths) > 1 for paths in found.values()):
        return ()
    listed: dict[str, set[str]] = {}
    for word, [path] in found.items():
        try:
            listed[word] = set(read_split_list(path))
        except (ValueError, FileNotFoundError):
            return ()
        if not listed[word] or len(listed[word] & names) * 10 < len(listed[word]) * 9:
            return ()
    union = set().union(*listed.values())
    if sum(len(v) for v in listed.values()) != len(union) or len(union & names) * 10 < len(names) * 9:
        return ()
    return tuple((word, found[word][0]) for word in sorted(found, key=_split_order))


def _split_order(word: str) -> tuple[int, str]:
    order = ("train", "training", "trainval", "val", "valid", "validation", "dev", "test", "testing")
    return (order.index(word) if word in order else len(order), word)


def _set_aside_note(chosen: list[Candidate], set_aside: list[Candidate]) -> str:
    """The second candidates, and the flags that convert with them instead (every pair repeated)."""
    if not set_aside:
        return ""
    instead = {c.images.rel: c for c in set_aside}
    in_order = sorted(chosen, key=lambda c: (c.images.split or "train", c.images.rel))
    pairs = [instead.get(c.images.rel, c) for c in in_order]
    flags = " ".join(f"--images {shlex.quote(c.images.path)} --masks {shlex.quote(c.masks.path)} "
                     f"--split {c.images.split or 'train'}" for c in pairs)
    folders = ", ".join(f"{c.masks.rel}/" for c in set_aside)
    return (f"; set aside: {folders} (pairs as fully, but holds one mask repeated, a field of view, not labels; "
            f"to convert with it instead: {flags})")


__all__ = ["ContentResult", "ContentTie", "Tokens", "find_by_content", "infer_tokens", "split_of"]
