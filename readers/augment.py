"""Training-time augmentation of image and mask together, exact by construction.

`Augment` is the recipe (a frozen dataclass); `Dataset.tf_dataset(..., augment=aug,
seed=s)` and `Dataset.keras_dataset(..., augment=aug, seed=s)` apply it to whole
batches, after the records are read (uint8 images, class maps) and before the float /
one-hot expansion. Example (convert at 640x640, train on random 512x512 crops)::

    import readers
    from readers.augment import Augment

    ds = readers.open("OUT")
    aug = Augment(hflip=0.5, scale=(0.5, 2.0), crop=(512, 512), brightness=0.2)
    model.fit(ds.tf_dataset("train", 8, augment=aug, seed=0), epochs=50)

How it works:

* **Random parameters** are drawn in NumPy from a counter-based hash of (seed, epoch,
  sample key) (`uniforms`): no random state is carried from batch to batch, so the
  draws do not depend on the batch a sample lands in, the shuffle, the number of
  parallel calls or PyDataset workers. `seed=None` draws a random base seed once per
  pipeline. The draws become a small float32 row per sample (`draw_params`) that
  travels with the batch (and to the accelerator in `readers.device.augment_batch`).
* **Geometry** is one affine map per sample: scale, rotation, 90-degree turns, flips
  and the crop offset composed into a single output -> source transform. The image is
  sampled bilinearly, the mask with nearest neighbour from the *same* coordinates, so
  they stay aligned to the pixel; output pixels whose source lies outside the stored
  image get `fill` (image) and the ignore index (mask; all-zero planes for one-hot
  stored masks). Without rotation (the usual scale/crop/flip recipe) it is one
  separable resampling (two row and two column gathers per batch, XLA-compiled with the
  expansion); with `rotate` or
  `rot90` one `ImageProjectiveTransformV3` per batch.
* **Photometric** jitter (brightness, contrast, saturation, hue) touches the image
  only, after the geometry, as one 3x3 colour matrix plus offset per sample (like
  DALI's ColorTwist): brightness adds a delta, contrast scales around the per-channel
  mean, saturation blends with the luma (ITU-R 601), hue rotates the chroma plane of
  YIQ. Values are clipped to [0, 255] once, at the end; padding keeps `fill`.

Two implementations: on the host a fused C kernel (`readers.augment_host`,
`readers/_warp.c`: one pass per sample, straight into the batch), and the TensorFlow
functions below (`augment_tf`), which run on the accelerator (`readers.device`) and as
the fallback where the extension is not built or ``IMGSHARD_FAST_AUGMENT=0``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

#: Columns of one sample's parameter row (`draw_params`): the output -> source
#: projective transform (8, as `ImageProjectiveTransformV3` takes it), the colour matrix
#: (9), the brightness delta and the contrast factor.
TRANSFORM, MATRIX, DELTA, CONTRAST = slice(0, 8), slice(8, 17), 17, 18
PARAMS = 19
#: Uniform draws per sample, one per random choice (see `draw_params`).
DRAWS = 11

_LUMA = np.array([0.299, 0.587, 0.114])
_RGB_TO_YIQ = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
_YIQ_TO_RGB = np.linalg.inv(_RGB_TO_YIQ)


#: Bounds of `Augment.scale`: finite reciprocals in float32, and no zoom beyond any use.
SCALE_LIMITS = (1e-3, 1e3)
#: Bounds of `Augment.crop`: a side, and the pixels of one crop (2**28: 3 GiB as float32 RGB).
MAX_CROP_SIDE = 1 << 15
MAX_CROP_PIXELS = 1 << 28


def _fail(field: str, expected: str, value: Any) -> None:
    raise ValueError(f"Augment.{field} must be {expected}. Received: {field}={value!r}")


def _number(x: Any) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float, np.integer, np.floating)) and math.isfinite(x)


def _integer(x: Any) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, np.integer))


@dataclass(frozen=True)
class Augment:
    """A random augmentation recipe applied per sample (see the module docstring).

    Args:
        hflip: probability of a left-right flip, in [0, 1].
        vflip: probability of an up-down flip, in [0, 1].
        rot90: also turn by a random multiple of 90 degrees (uniform over 0/90/180/270).
        rotate: maximum rotation in degrees, in [0, 180]: uniform in [-rotate, rotate].
        scale: (min, max) zoom factor, 0.001 <= min <= max <= 1000 (`SCALE_LIMITS`):
            uniform in [min, max]; 2.0 shows the content twice as large (a smaller part
            of the image fills the crop).
        crop: (height, width) of the output, each side at most 32768 and at most 2**28
            pixels (`MAX_CROP_SIDE`, `MAX_CROP_PIXELS`); None: the stored size. The crop window is
            placed uniformly at random in the transformed image; where that image is
            smaller than the crop, the rest is padding (`fill` / ignore index).
        brightness: maximum delta, a fraction of the full range, in [0, 1].
        contrast: maximum factor change, in [0, 1): factor uniform in [1 - c, 1 + c].
        saturation: maximum factor change, in [0, 1]: factor uniform in [1 - s, 1 + s].
        hue: maximum hue rotation, a fraction of the colour wheel, in [0, 0.5].
        fill: image padding value: an int 0-255 or an (r, g, b) triple of them.
    """

    hflip: float = 0.0
    vflip: float = 0.0
    rot90: bool = False
    rotate: float = 0.0
    scale: tuple[float, float] = (1.0, 1.0)
    crop: tuple[int, int] | None = None
    brightness: float = 0.0
    contrast: float = 0.0
    saturation: float = 0.0
    hue: float = 0.0
    fill: int | tuple[int, int, int] = 0

    def __post_init__(self) -> None:
        for name in ("hflip", "vflip"):
            value = getattr(self, name)
            if not _number(value) or not 0 <= value <= 1:
                _fail(name, "a probability in [0, 1]", value)
        if not isinstance(self.rot90, (bool, np.bool_)):
            _fail("rot90", "True or False", self.rot90)
        if not _number(self.rotate) or not 0 <= self.rotate <= 180:
            _fail("rotate", "a maximum angle in degrees in [0, 180]", self.rotate)
        s = self.scale
        lo, hi = SCALE_LIMITS
        if (not isinstance(s, (tuple, list)) or len(s) != 2 or not all(_number(v) for v in s)
                or not lo <= s[0] <= s[1] <= hi):
            _fail("scale", f"a (min, max) pair of factors with {lo} <= min <= max <= {hi:g} (the sampler divides "
                  "by them in float32)", s)
        object.__setattr__(self, "scale", (float(s[0]), float(s[1])))
        c = self.crop
        if c is not None:
            if (not isinstance(c, (tuple, list)) or len(c) != 2
                    or not all(_integer(v) and 1 <= v <= MAX_CROP_SIDE for v in c) or c[0] * c[1] > MAX_CROP_PIXELS):
                _fail("crop", f"None or a (height, width) pair of ints in [1, {MAX_CROP_SIDE}], at most "
                      f"{MAX_CROP_PIXELS} pixels (each batch holds crop-sized images)", c)
            object.__setattr__(self, "crop", (int(c[0]), int(c[1])))
        for name, top in (("brightness", 1.0), ("saturation", 1.0), ("hue", 0.5)):
            value = getattr(self, name)
            if not _number(value) or not 0 <= value <= top:
                _fail(name, f"a maximum jitter in [0, {top}]", value)
        if not _number(self.contrast) or not 0 <= self.contrast < 1:
            _fail("contrast", "a maximum jitter in [0, 1)", self.contrast)
        f = self.fill
        triple = isinstance(f, (tuple, list)) and len(f) == 3
        if not (_integer(f) and 0 <= f <= 255) and not (triple and all(_integer(v) and 0 <= v <= 255 for v in f)):
            _fail("fill", "an int in [0, 255] or an (r, g, b) triple of them", f)
        if triple:
            object.__setattr__(self, "fill", tuple(int(v) for v in f))

    @property
    def rotates(self) -> bool:
        """Whether the geometry needs a general affine sampler (rotation)."""
        return bool(self.rot90) or self.rotate > 0

    @property
    def photometric(self) -> bool:
        return any((self.brightness, self.contrast, self.saturation, self.hue))

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) of the augmented images for stored images of height x width."""
        return self.crop if self.crop is not None else (int(height), int(width))

    def fill_rgb(self) -> tuple[int, int, int]:
        return self.fill if isinstance(self.fill, tuple) else (int(self.fill),) * 3

    def fill_values(self, channels: int, top: int = 255) -> tuple[float, ...]:
        """The image padding per channel, in the stored range (`fill` is in 8-bit levels:
        a uint16 image pads with fill x 257)."""
        values = self.fill_rgb() if channels == 3 else (int(self.fill),) * channels  # type: ignore[arg-type]
        return tuple(float(v) * (top // 255) for v in values)

    def check_images(self, channels: int, dtype: str = "uint8") -> None:
        """Refuse, by name, what this recipe cannot do to images of `channels` x `dtype`:
        colour jitter needs RGB, an (r, g, b) fill needs 3 channels."""
        if channels != 3 and self.photometric:
            raise ValueError("Augment colour jitter (brightness, contrast, saturation, hue) applies to RGB images; "
                             f"these images have {channels} channel(s) ({dtype}). Use the geometric fields only "
                             f"(flips, rotation, scale, crop). Received: {self!r}")
        if channels != 3 and isinstance(self.fill, tuple):
            raise ValueError(f"Augment.fill must be one int for {channels}-channel images (an (r, g, b) fill needs "
                             f"RGB). Received: fill={self.fill!r}")


def parse_augment(text: str) -> Augment:
    """An `Augment` from "field=value,..." (the CLI's --augment), e.g.
    "hflip=0.5,scale=0.75:1.5,crop=512x512,brightness=0.2,rot90=true,fill=0:0:0".
    Pairs are written min:max, sizes HxW, booleans true/false. Unknown fields and
    malformed values raise ValueError naming them."""
    names = [f for f in Augment.__dataclass_fields__]
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in str(text).split(","))):
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or name not in names:
            raise ValueError(f"--augment: expected field=value with a field among {names}. Received: {item!r}")
        raw = raw.strip()
        try:
            if name == "rot90":
                if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError("not a boolean")
                values[name] = raw.lower() in ("true", "1", "yes")
            elif name == "crop":
                values[name] = tuple(int(v) for v in raw.lower().split("x"))
            elif name == "scale":
                values[name] = tuple(float(v) for v in raw.split(":"))
            elif name == "fill":
                parts = [int(v) for v in raw.split(":")]
                values[name] = parts[0] if len(parts) == 1 else tuple(parts)
            else:
                values[name] = float(raw)
        except ValueError as e:
            raise ValueError(f"--augment: cannot read {name}={raw!r} ({e}); write scale as min:max, crop as HxW, "
                             f"fill as v or r:g:b, rot90 as true/false. Received: {text!r}") from e
    return Augment(**values)


def augment_sample(augment: Augment, image: np.ndarray, target: Any, *, key: str, seed: int, epoch: int = 0,
                   ignore_index: int | None = 255) -> tuple[np.ndarray, Any]:
    """One stored sample as `tf_dataset(..., augment=augment, seed=seed)` gives it in
    `epoch` (uint8 image; class map, one-hot planes, or the label unchanged); for
    previews and checks. The host implementation (C, `readers.augment_host`) when built,
    else TensorFlow."""
    from readers.augment_host import warp_batch

    image = np.asarray(image)
    params = draw_params(augment, image.shape[0], image.shape[1], seed, epoch, key_ids([key]))
    segmentation = target is not None and np.ndim(target) >= 2
    if host_kernel_takes(image.shape[-1] if image.ndim == 3 else 1, image.dtype.name):
        planes = segmentation and np.ndim(target) == 3
        fill = 0 if planes else (255 if ignore_index is None else ignore_index)
        x, y = warp_batch(augment, image[None], np.asarray(target)[None] if segmentation else None, params,
                          normalize=False, mask_fill=fill)
        return x[0], (y[0] if segmentation else target)
    import tensorflow as tf

    targets = tf.constant(np.asarray(target)[None]) if segmentation else tf.constant([0], tf.int64)
    x, y = augment_tf(augment, tf.constant(image[None]), targets, tf.constant(params),
                      ignore_index=ignore_index, segmentation=segmentation, normalize=False)
    return x.numpy()[0], (y.numpy()[0] if segmentation else target)


def host_kernel_takes(channels: int, dtype: str = "uint8") -> bool:
    """Whether the C kernel (`readers.augment_host`) augments images of `channels` x `dtype`
    here; else the TensorFlow functions below do (any channel count, uint8 or uint16)."""
    from readers import augment_host

    if not augment_host.fast_augment_available():
        return False
    supports = getattr(augment_host, "fast_augment_supports", None)
    if supports is None:  # a kernel that predates image kinds: 8-bit RGB only
        return dtype == "uint8" and channels == 3
    return bool(supports(np.dtype(dtype), int(channels)))


def check_augment(augment: Any) -> "Augment | None":
    """`augment` as given, or a TypeError naming the argument."""
    if augment is not None and not isinstance(augment, Augment):
        raise TypeError("augment must be a readers.augment.Augment or None. "
                        f"Received: augment={type(augment).__name__}")
    return augment


def check_start_step(start_step: int, batches: int) -> None:
    if start_step > batches:
        raise ValueError(f"start_step must be at most the {batches} batches of an epoch. "
                         f"Received: start_step={start_step}")


def resume_point(backup_dir: "str | os.PathLike") -> tuple[int, int]:
    """(epoch, start_step) at which to rebuild the input after a restart, read from the
    `training_metadata.json` that `keras.callbacks.BackupAndRestore(backup_dir)` writes:
    with ``save_freq="epoch"`` the epoch after the last completed one, step 0 (Keras
    then starts that epoch too, so weights and batches agree). (0, 0) when there is no
    backup yet. See docs/AUGMENT.md.
    """
    path = os.path.join(os.fspath(backup_dir), "training_metadata.json")
    if not os.path.exists(path):
        return 0, 0
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
        epoch, batch = int(meta["epoch"]), int(meta.get("batch", 0))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: expected Keras BackupAndRestore metadata {{'epoch': int, 'batch': int}}. "
                         f"Received an unreadable file ({e}). Delete it to start from scratch.") from e
    return epoch, batch + 1 if batch > 0 else 0


def sample_ids(shards: Sequence[Any]) -> np.ndarray:
    """uint64 id of every record of `shards` (`ShardRef`s) in order: the hash of its key
    (from the shard's index file in manifest version 3, read here: only augmenting
    pipelines need keys; inline in versions 1 and 2), or of "file#record" where none is listed."""
    from readers.index import ref_keys

    keys: list[str] = []
    for shard in shards:
        listed = ref_keys(shard)
        keys.extend(listed if len(listed) == shard.records
                    else [f"{shard.entry.file}#{i}" for i in range(shard.records)])
    return key_ids(keys)


# -- random parameters: a pure function of (seed, epoch, sample key) -----------------------------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def key_ids(keys: Sequence[str]) -> np.ndarray:
    """A stable 64-bit id per sample key (BLAKE2b, 8 bytes), as uint64."""
    return np.array([int.from_bytes(hashlib.blake2b(k.encode("utf-8"), digest_size=8).digest(), "little")
                     for k in keys], np.uint64)


def repeat_ids(ids: np.ndarray, occurrence: np.ndarray | None) -> np.ndarray:
    """The draw ids of samples that may be repeated copies (`readers.order.occurrences`): a first
    copy keeps its id, copy k > 0 gets its own (so its augmentation is drawn afresh)."""
    if occurrence is None:
        return ids
    ids = np.asarray(ids, np.uint64)
    occurrence = np.asarray(occurrence, np.uint64)
    with np.errstate(over="ignore"):
        again = _mix(ids ^ (occurrence * _GOLDEN))
    return np.where(occurrence == 0, ids, again)


_DATASET = np.uint64(0xD1B54A32D192ED03)  # another odd constant than _GOLDEN: dataset salts differ from repeats


def dataset_ids(ids: np.ndarray, index: int) -> np.ndarray:
    """The draw ids of the samples of dataset `index` of a mix (`readers.mix`): dataset 0 keeps
    its key ids (so it augments as when read alone); dataset d > 0 mixes d into them, so two
    datasets sharing a key (``train/0001.png`` in both) draw independent augmentations."""
    ids = np.asarray(ids, np.uint64)
    if index == 0:
        return ids
    with np.errstate(over="ignore"):
        salt = _mix(np.uint64(int(index)) * _DATASET)
        return _mix(ids ^ salt)


def uniforms(seed: int, epoch: int, ids: np.ndarray, count: int = DRAWS) -> np.ndarray:
    """(len(ids), count) float64 uniforms in [0, 1): a hash of (seed, epoch, id, column)."""
    ids = np.asarray(ids, np.uint64).reshape(-1, 1)
    with np.errstate(over="ignore"):
        base = _mix(np.array([int(seed) % (1 << 64)], np.uint64) + _GOLDEN)
        base = _mix(base ^ (np.array([int(epoch) % (1 << 64)], np.uint64) * _GOLDEN))
        h = _mix(base ^ ids)
        cols = np.arange(1, count + 1, dtype=np.uint64) * _GOLDEN
        bits = _mix(h + cols)
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def draw_params(augment: Augment, height: int, width: int, seed: int, epoch: int, ids: np.ndarray) -> np.ndarray:
    """(B, PARAMS) float32: each sample's geometry and colour parameters (see module doc)."""
    u = uniforms(seed, epoch, ids)
    n = len(u)
    out = np.zeros((n, PARAMS), np.float64)
    lo, hi = augment.scale
    s = lo + u[:, 4] * (hi - lo)
    fx = np.where(u[:, 0] < augment.hflip, -1.0, 1.0)
    fy = np.where(u[:, 1] < augment.vflip, -1.0, 1.0)
    k = np.floor(u[:, 2] * 4).astype(np.int64) % 4 if augment.rot90 else np.zeros(n, np.int64)
    theta = np.deg2rad((2 * u[:, 3] - 1) * augment.rotate)
    hc, wc = augment.output_size(height, width)
    hv = np.where(k % 2 == 1, width * s, height * s)  # the transformed image's size
    wv = np.where(k % 2 == 1, height * s, width * s)
    off_x, off_y = u[:, 6] * (wv - wc), u[:, 5] * (hv - hc)
    # Output (x, y) -> source (x, y): src = A (out + 0.5 + off - centre_v) + centre_src - 0.5,
    # A = (1/s) R90(k)^-1 R(theta)^-1 F, in pixel-index coordinates (centres at integers).
    c90, s90 = np.cos(k * np.pi / 2).round(), np.sin(k * np.pi / 2).round()
    r90_inv = np.stack([np.stack([c90, s90], -1), np.stack([-s90, c90], -1)], -2)
    ct, st = np.cos(theta), np.sin(theta)
    rot_inv = np.stack([np.stack([ct, st], -1), np.stack([-st, ct], -1)], -2)
    r = r90_inv @ rot_inv  # (n, 2, 2)
    a = r * np.stack([fx, fy], -1)[:, None, :] / s[:, None, None]
    d = np.stack([0.5 + off_x - wv / 2, 0.5 + off_y - hv / 2], -1)
    t = np.einsum("nij,nj->ni", a, d) + np.array([width / 2 - 0.5, height / 2 - 0.5])
    out[:, TRANSFORM] = np.stack([a[:, 0, 0], a[:, 0, 1], t[:, 0], a[:, 1, 0], a[:, 1, 1], t[:, 1],
                                  np.zeros(n), np.zeros(n)], -1)
    out[:, MATRIX] = _colour_matrices(augment, u).reshape(n, 9)
    out[:, DELTA] = (2 * u[:, 7] - 1) * augment.brightness * 255.0
    out[:, CONTRAST] = 1 + (2 * u[:, 8] - 1) * augment.contrast
    return out.astype(np.float32)


def _colour_matrices(augment: Augment, u: np.ndarray) -> np.ndarray:
    """(n, 3, 3): hue rotation (YIQ) @ saturation (blend with luma)."""
    n = len(u)
    sat = 1 + (2 * u[:, 9] - 1) * augment.saturation
    m = sat[:, None, None] * np.eye(3) + (1 - sat)[:, None, None] * np.outer(np.ones(3), _LUMA)
    angle = (2 * u[:, 10] - 1) * augment.hue * 2 * np.pi
    rot = np.zeros((n, 3, 3))
    rot[:, 0, 0] = 1
    rot[:, 1, 1] = rot[:, 2, 2] = np.cos(angle)
    rot[:, 1, 2], rot[:, 2, 1] = -np.sin(angle), np.sin(angle)
    hue = _YIQ_TO_RGB @ rot @ _RGB_TO_YIQ
    return hue @ m


# -- applying parameters to a batch (TensorFlow) -------------------------------------------------

def augment_tf(augment: Augment, images: "tf.Tensor", targets: "tf.Tensor", params: "tf.Tensor", *,
               ignore_index: int | None, segmentation: bool, normalize: bool) -> tuple["tf.Tensor", "tf.Tensor"]:
    """Augment a batch: uint8 images (B, H, W, 3), class maps (B, H, W) / one-hot planes
    (B, H, W, C) / labels (B,), parameter rows (B, PARAMS) from `draw_params`.

    Returns the images as float32 in [0, 1] (`normalize`) or uint8, and the targets in
    their stored dtype (masks transformed with nearest sampling, padding = ignore index,
    or all-zero planes for one-hot masks; labels unchanged). Runs on any TensorFlow
    device (`readers.device.augment_batch` calls it on the accelerator).
    """
    augment.check_images(int(images.shape[-1]), images.dtype.name)
    x, valid, y = geometry_stage(augment, images, targets, params, ignore_index=ignore_index,
                                 segmentation=segmentation)
    return colour_stage(augment, x, valid, y, params, normalize=normalize, top=_top(images.dtype.name))


def _top(dtype: str) -> int:
    """The largest value of an image dtype (uint8 or uint16)."""
    return 65535 if dtype == "uint16" else 255


def geometry_stage(augment: Augment, images: "tf.Tensor", targets: "tf.Tensor", params: "tf.Tensor", *,
                   ignore_index: int | None, segmentation: bool) -> tuple["tf.Tensor", "tf.Tensor", "tf.Tensor"]:
    """(image float32 0-255, where it came from inside the source, transformed targets)."""
    h, w = int(images.shape[1]), int(images.shape[2])
    size = list(augment.output_size(h, w))
    if augment.rotates:
        x, valid = _projective(images, params, size)
    else:
        x, valid = _separable(images, params, size, (h, w))
    if not segmentation:
        return x, valid, targets
    fill = 0 if len(targets.shape) == 4 else (255 if ignore_index is None else ignore_index)
    if augment.rotates:
        return x, valid, _projective_mask(targets, params, size, fill)
    return x, valid, _separable_mask(targets, params, size, (h, w), fill)


def colour_stage(augment: Augment, x: "tf.Tensor", valid: "tf.Tensor", targets: "tf.Tensor", params: "tf.Tensor", *,
                 normalize: bool, top: int = 255) -> tuple["tf.Tensor", "tf.Tensor"]:
    """Colour jitter, padding, and float [0, 1] or stored-dtype output (`top`: 255 for
    uint8 images, 65535 for uint16)."""
    import tensorflow as tf

    if augment.photometric:
        x = _colour(x, valid, params, augment, top)
    x = tf.where(valid, x, tf.constant(augment.fill_values(int(x.shape[-1]), top), tf.float32))
    if normalize:
        return x * (1.0 / top), targets
    return tf.cast(tf.clip_by_value(tf.round(x), 0.0, float(top)), tf.uint16 if top > 255 else tf.uint8), targets


def _axis(params: "tf.Tensor", scale: int, offset: int, n: int, limit: int) -> tuple["tf.Tensor", "tf.Tensor"]:
    """Source coordinates (B, n) of one output axis (axis-aligned map) and their validity:
    inside when the nearest source pixel exists (-0.5 < c < limit - 0.5)."""
    import tensorflow as tf

    coords = params[:, offset, None] + params[:, scale, None] * tf.range(n, dtype=tf.float32)[None]
    return coords, (coords > -0.5) & (coords < limit - 0.5)


def _separable(images: "tf.Tensor", params: "tf.Tensor", size: list[int],
               hw: tuple[int, int]) -> tuple["tf.Tensor", "tf.Tensor"]:
    """Bilinear resampling for maps without rotation (scale, flips, crop): rows, then
    columns, each two gathers and a blend (XLA-friendly; neighbours clamped at the edge)."""
    import tensorflow as tf

    ys, vy = _axis(params, 4, 5, size[0], hw[0])
    xs, vx = _axis(params, 0, 2, size[1], hw[1])

    def taps(c: "tf.Tensor", limit: int) -> tuple["tf.Tensor", "tf.Tensor", "tf.Tensor"]:
        lo = tf.floor(c)
        return (tf.cast(tf.clip_by_value(lo, 0, limit - 1), tf.int32),
                tf.cast(tf.clip_by_value(lo + 1, 0, limit - 1), tf.int32), c - lo)

    y0, y1, wy = taps(ys, hw[0])
    x0, x1, wx = taps(xs, hw[1])
    wy, wx = wy[:, :, None, None], wx[:, None, :, None]
    r0 = tf.cast(tf.gather(images, y0, axis=1, batch_dims=1), tf.float32)
    r1 = tf.cast(tf.gather(images, y1, axis=1, batch_dims=1), tf.float32)
    rows = r0 + (r1 - r0) * wy
    c0 = tf.gather(rows, x0, axis=2, batch_dims=1)
    c1 = tf.gather(rows, x1, axis=2, batch_dims=1)
    return c0 + (c1 - c0) * wx, (vy[:, :, None] & vx[:, None, :])[..., None]


def _separable_mask(targets: "tf.Tensor", params: "tf.Tensor", size: list[int], hw: tuple[int, int],
                    fill: int) -> "tf.Tensor":
    """Nearest neighbour from the same coordinates as `_separable`; outside: `fill`."""
    import tensorflow as tf

    ys, vy = _axis(params, 4, 5, size[0], hw[0])
    xs, vx = _axis(params, 0, 2, size[1], hw[1])
    ny = tf.cast(tf.clip_by_value(tf.floor(ys + 0.5), 0, hw[0] - 1), tf.int32)
    nx = tf.cast(tf.clip_by_value(tf.floor(xs + 0.5), 0, hw[1] - 1), tf.int32)
    out = tf.gather(tf.gather(targets, ny, axis=1, batch_dims=1), nx, axis=2, batch_dims=1)
    valid = vy[:, :, None] & vx[:, None, :]
    if len(targets.shape) == 4:
        valid = valid[..., None]
    return tf.where(valid, out, tf.constant(fill, targets.dtype))


def _transform(data: "tf.Tensor", params: "tf.Tensor", size: list[int], method: str, fill: float,
               fill_mode: str = "CONSTANT") -> "tf.Tensor":
    import tensorflow as tf

    return tf.raw_ops.ImageProjectiveTransformV3(
        images=data, transforms=params[:, TRANSFORM], output_shape=tf.constant(size, tf.int32),
        fill_value=fill, interpolation=method, fill_mode=fill_mode)


def _projective(images: "tf.Tensor", params: "tf.Tensor", size: list[int]) -> tuple["tf.Tensor", "tf.Tensor"]:
    """Bilinear image (float32, 0-255) under a general affine map, and where the nearest
    source pixel exists (the mask's rule)."""
    import tensorflow as tf

    # "NEAREST" fill: taps outside the image repeat the edge (as the separable path and the
    # C kernel clamp them) instead of blending with 0 within half a pixel of the border.
    x = _transform(tf.cast(images, tf.float32), params, size, "BILINEAR", 0.0, "NEAREST")
    valid = _transform(tf.ones_like(images[..., :1], tf.uint8), params, size, "NEAREST", 0.0) > 0
    return x, valid


def _projective_mask(targets: "tf.Tensor", params: "tf.Tensor", size: list[int], fill: int) -> "tf.Tensor":
    import tensorflow as tf

    planes = len(targets.shape) == 4
    data = targets if planes else targets[..., None]
    work = data if data.dtype == tf.uint8 else tf.cast(data, tf.int32)
    out = tf.cast(_transform(work, params, size, "NEAREST", float(fill)), targets.dtype)
    return out if planes else out[..., 0]


def _colour(x: "tf.Tensor", valid: "tf.Tensor", params: "tf.Tensor", augment: Augment,
            top: int = 255) -> "tf.Tensor":
    """out = M (c x + (1 - c) mean + delta), clipped to [0, top]; mean over valid pixels
    (the brightness delta is drawn in 8-bit levels: x 257 for uint16)."""
    import tensorflow as tf

    m = tf.reshape(params[:, MATRIX], (-1, 3, 3))
    c = params[:, CONTRAST][:, None]
    delta = params[:, DELTA] if top == 255 else params[:, DELTA] * float(top // 255)
    offset = delta[:, None] * tf.ones((1, 3), tf.float32)
    if augment.contrast:
        total = tf.reduce_sum(tf.where(valid, x, 0.0), axis=(1, 2))
        count = tf.maximum(tf.reduce_sum(tf.cast(valid, tf.float32), axis=(1, 2)), 1.0)
        offset = offset + (1 - c) * (total / count)
    v = tf.reduce_sum(m * offset[:, None, :], axis=-1)  # (B, 3)
    m = m * c[:, :, None]
    # Three multiply-adds per output channel: elementwise, so XLA fuses them into one pass
    # (a batched matmul with a contraction of 3 is several times slower on CPUs).
    chans = [x[..., k] for k in range(3)]
    out = [chans[0] * m[:, d, 0, None, None] + chans[1] * m[:, d, 1, None, None]
           + chans[2] * m[:, d, 2, None, None] + v[:, d, None, None] for d in range(3)]
    return tf.clip_by_value(tf.stack(out, axis=-1), 0.0, float(top))


#: Compile the separable path (no rotation) with XLA, with the expansion fused in.
AUGMENT_JIT = True


def make_augment_tf(augment: Augment, *, ignore_index: int | None, segmentation: bool, normalize: bool,
                    expand: Any = None, channels: int = 3, image_dtype: str = "uint8"):
    """`augment_tf` bound to a dataset, as one `tf.function` over (images, targets, params),
    followed by `expand(x, y)` when given; both stages XLA-compiled (`AUGMENT_JIT`), the
    geometry only without rotation (`ImageProjectiveTransformV3` has no XLA kernel)."""
    import tensorflow as tf

    augment.check_images(channels, image_dtype)
    jit = AUGMENT_JIT and not augment.rotates

    # Two compiled stages: XLA would otherwise fuse the resampling into every use of its
    # output (the colour matrix reads each channel three times, contrast its mean) and
    # recompute the gathers for each, several times slower than materialising it once.
    @tf.function(jit_compile=jit, reduce_retracing=True)
    def geometry(images: "tf.Tensor", targets: "tf.Tensor", params: "tf.Tensor") -> Any:
        return geometry_stage(augment, images, targets, params, ignore_index=ignore_index,
                              segmentation=segmentation)

    @tf.function(jit_compile=AUGMENT_JIT, reduce_retracing=True)
    def finish(x: "tf.Tensor", valid: "tf.Tensor", targets: "tf.Tensor", params: "tf.Tensor") -> Any:
        x, y = colour_stage(augment, x, valid, targets, params, normalize=normalize, top=_top(image_dtype))
        return (x, y) if expand is None else expand(x, y)

    @tf.function(reduce_retracing=True)
    def run(images: "tf.Tensor", targets: "tf.Tensor", params: "tf.Tensor") -> tuple["tf.Tensor", "tf.Tensor"]:
        x, valid, y = geometry(images, targets, params)
        return finish(x, valid, y, params)

    return run


__all__ = ["Augment", "PARAMS", "augment_tf", "host_kernel_takes", "colour_stage", "geometry_stage", "check_augment", "check_start_step", "dataset_ids", "draw_params", "key_ids", "repeat_ids",
           "make_augment_tf", "augment_sample", "parse_augment", "resume_point", "sample_ids", "uniforms"]
