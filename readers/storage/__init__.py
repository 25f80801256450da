"""Locations: local folders and object stores (S3, GCS) behind one small API.

`readers.storage.url` parses locations (standard library only); `readers.storage.store`
is the object store (fsspec, imported only when an ``s3://``/``gs://`` URL is opened).
The converter and the readers both use it; it imports nothing else from imgshard.
"""

from readers.storage.url import (StorageURLError, freeze_storage_options, is_remote, local_path,
                                 parse_storage_options, scheme_of, split_url, storage_option_flags,
                                 thaw_storage_options)
from readers.storage.store import ObjectInfo, ObjectStore, PreconditionFailed, StorageError, open_store

__all__ = ["ObjectInfo", "ObjectStore", "PreconditionFailed", "StorageError", "StorageURLError",
           "freeze_storage_options", "is_remote", "local_path", "open_store", "parse_storage_options", "scheme_of",
           "split_url", "storage_option_flags", "thaw_storage_options"]
