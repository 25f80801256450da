"""``--storage-option KEY=VALUE`` (repeatable), shared by the commands that take bucket URLs.

One set of options applies to every URL of the command; the values are fsspec keyword
arguments (`readers.storage.parse_storage_options`: ``endpoint_url=http://127.0.0.1:9000``,
``anon=true``, ``client_kwargs.region_name=eu-west-1``). Credentials come from the usual
settings (``AWS_PROFILE``, ``AWS_ENDPOINT_URL``, ``GOOGLE_APPLICATION_CREDENTIALS``, ...).
"""

from __future__ import annotations

import argparse
from typing import Any


def add_storage_option_argument(p: argparse.ArgumentParser) -> None:
    """Add ``--storage-option`` unless another shared group (the source arguments) already did."""
    if "--storage-option" in p._option_string_actions:
        return
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="option for s3:// / gs:// access (fsspec keyword; repeatable), e.g. "
                        "endpoint_url=http://127.0.0.1:9000 or anon=true (docs/STORAGE.md)",
                   dest="storage_option")


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    from readers.storage.url import parse_storage_options

    return parse_storage_options(getattr(args, "storage_option", None))


__all__ = ["add_storage_option_argument", "storage_options"]
