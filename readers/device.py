"""The device-side half of compact mode: expand uint8 batches on the accelerator.

Compact mode ships uint8 images and uint8 class maps through the input pipeline
(`tf_dataset(..., normalize=False, one_hot=False)`): 1 + 1/3 bytes per pixel instead of
4 * (3 + C). The cast to float32/255 and the one-hot encoding then run on the GPU/TPU,
either in the model (`ExpandOnDevice` as its first layer, for x) or in a custom
`train_step` (`expand_batch`, for x and y). Written with `keras.ops`, so it runs on
every Keras backend. Keras is imported lazily: `ExpandOnDevice` is built on first
access of this module attribute.

Example (runnable)::

    >>> import numpy as np
    >>> from readers.device import ExpandOnDevice
    >>> layer = ExpandOnDevice(num_classes=3)
    >>> x = np.full((1, 2, 2, 3), 255, np.uint8)
    >>> y = np.array([[[0, 1], [2, 255]]], np.uint8)    # 255: the ignore index
    >>> fx, fy = layer(x, y)
    >>> float(np.asarray(fx).max()), tuple(fy.shape)
    (1.0, (1, 2, 2, 3))
    >>> np.asarray(fy)[0, 1, 1].tolist()                 # ignored pixel: all-zero row
    [0.0, 0.0, 0.0]

In a model (x only; y must then already be one-hot, or use `expand_batch` in `train_step`)::

    inputs = keras.Input((512, 512, 3), dtype="uint8")
    x = ExpandOnDevice(num_classes)(inputs)
"""

from __future__ import annotations

from typing import Any

from readers._lazy import LazyClass
from readers.formats.expand import KERAS, expand


def expand_batch(x: Any, y: Any = None, num_classes: int | None = None, *, normalize: bool = True,
                 one_hot: bool = True, ignore_index: int | None = 255) -> tuple[Any, Any]:
    """Cast `x` (uint8) to float32/255 and one-hot encode the class map / labels `y`.

    Args:
        x: uint8 images (B, H, W, 3) (any tensor of the current backend, or NumPy).
        y: uint8/uint16/int class maps (B, H, W) or labels (B,); None to leave it out.
        num_classes: depth of the one-hot encoding (needed when y is given and one_hot).
        normalize: cast x to float32 in [0, 1]; False leaves x unchanged.
        one_hot: one-hot encode y as float32 (..., num_classes); False leaves y unchanged.
        ignore_index: pixels with this value become an all-zero row (any value outside
            [0, num_classes) does too).

    Returns:
        (x, y) expanded.
    """
    if y is not None and one_hot and (isinstance(num_classes, bool) or not isinstance(num_classes, int)
                                      or num_classes < 1):
        raise ValueError(f"num_classes must be a positive int to one-hot encode y. Received: {num_classes!r}")
    return expand(x, y, KERAS, num_classes=num_classes or 0, stored_onehot=False, ignore_index=ignore_index,
                  one_hot=one_hot, normalize=normalize)


def augment_batch(x: Any, y: Any, params: Any, augment: Any, num_classes: int | None = None, *,
                  ignore_index: int | None = 255, normalize: bool = True, one_hot: bool = True) -> tuple[Any, Any]:
    """Augment and expand a compact batch on the accelerator (TensorFlow backend).

    Pairs with `Dataset.tf_dataset(..., normalize=False, one_hot=False, augment=aug,
    augment_on="device")`, whose batches are ((uint8 images, params), class maps): only
    uint8 and 19 floats per sample cross to the device, where the same batch function
    as the host path (`readers.augment.augment_tf`) resamples image and mask and jitters
    the colours, then `expand_batch` casts and one-hot encodes. Call it in a custom
    `train_step` (see docs/AUGMENT.md); it gives the same (x, y) as host-side
    augmentation with the same seed. `y` may be labels (classification: left as is).
    """
    import tensorflow as tf

    from readers.augment import augment_tf

    segmentation = y is not None and len(y.shape) >= 3
    x, y = augment_tf(augment, tf.convert_to_tensor(x), tf.convert_to_tensor(y) if y is not None else y,
                      tf.convert_to_tensor(params, tf.float32), ignore_index=ignore_index,
                      segmentation=segmentation, normalize=normalize)
    return expand_batch(x, y, num_classes, normalize=False, one_hot=one_hot, ignore_index=ignore_index)


def _build_class() -> type:
    import keras

    @keras.saving.register_keras_serializable(package="imgshard")
    class ExpandOnDevice(keras.layers.Layer):
        """Keras layer: uint8 images -> float32/255, uint8 class maps -> one-hot float32.

        Call it on x alone (first layer of a model) or on (x, y) (in a `train_step`).
        The ignore index becomes an all-zero row. See `readers.device` for an example.
        """

        def __init__(self, num_classes: int, normalize: bool = True, one_hot: bool = True,
                     ignore_index: int | None = 255, **kwargs: Any):
            super().__init__(**kwargs)
            if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
                raise ValueError(f"num_classes must be a positive int. Received: num_classes={num_classes!r}")
            self.num_classes = num_classes
            self.normalize = bool(normalize)
            self.one_hot = bool(one_hot)
            self.ignore_index = ignore_index

        def call(self, x: Any, y: Any = None) -> Any:
            ex, ey = expand_batch(x, y, self.num_classes, normalize=self.normalize, one_hot=self.one_hot,
                                  ignore_index=self.ignore_index)
            return ex if y is None else (ex, ey)

        def compute_output_shape(self, x_shape: Any, y_shape: Any = None) -> Any:
            if y_shape is None:
                return x_shape
            return x_shape, (tuple(y_shape) + (self.num_classes,) if self.one_hot else y_shape)

        def get_config(self) -> dict:
            return {**super().get_config(), "num_classes": self.num_classes, "normalize": self.normalize,
                    "one_hot": self.one_hot, "ignore_index": self.ignore_index}

    return ExpandOnDevice


_LAZY = LazyClass(__name__, "ExpandOnDevice", _build_class)
__getattr__ = _LAZY.module_getattr()


__all__ = ["ExpandOnDevice", "augment_batch", "expand_batch"]
