"""Build the one C extension (PNG row unfiltering, `converter/transform/_pngrows.c`).

Everything else lives in pyproject.toml. The extension is optional: without a C
compiler the install still succeeds and every PNG is decoded by Pillow
(slower, same pixels); `imgshard bench` says which decoder ran.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "converter.transform._pngrows",
            sources=["converter/transform/_pngrows.c"],
            optional=True,
        )
    ]
)
