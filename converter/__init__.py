"""imgshard converter: raw image/mask folders -> sharded TFRecord or NPZ + manifest."""

__version__ = "0.1.0"
