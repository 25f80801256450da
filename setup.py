"""Build the four C extensions: PNG row unfiltering (`converter/transform/_pngrows.c`), the JPEG
scan-length check (`converter/transform/_jpegscan.c`),
Pillow-exact image resampling (`converter/transform/_resample.c`) and the readers' fused
batch augmentation (`readers/_warp.c`).

Everything else lives in pyproject.toml. All four are optional: without a C
compiler the install still succeeds, every PNG is decoded by Pillow, JPEG scans are not checked for an early end, and every image
is resized by Pillow (slower, same pixels), augmentation runs as TensorFlow ops; `imgshard bench` says which decoder ran.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "converter.transform._pngrows",
            sources=["converter/transform/_pngrows.c"],
            optional=True,
        ),
        Extension(
            "converter.transform._jpegscan",
            sources=["converter/transform/_jpegscan.c"],
            optional=True,
        ),
        Extension(
            "converter.transform._resample",
            sources=["converter/transform/_resample.c"],
            optional=True,
        ),
        Extension(
            "readers._warp",
            sources=["readers/_warp.c"],
            optional=True,
        ),
    ]
)
