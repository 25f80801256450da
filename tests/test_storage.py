"""The object-store core (`readers.storage`) against real servers on 127.0.0.1: moto's S3
server and the GCS emulator. URL parsing, listing, ranged reads, and the conditional
writes the cron guarantees rest on (create once, compare-and-swap, conditional delete)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from readers.storage import (PreconditionFailed, StorageError, StorageURLError, is_remote, local_path, open_store,
                             parse_storage_options, split_url)


@pytest.mark.parametrize("loc,remote", [("data/out", False), ("/abs/out", False), ("file:///abs/out", False),
                                        ("s3://b/p", True), ("gs://b/p", True), ("gcs://b/p", True)])
def test_is_remote_tells_object_stores_from_local_paths(loc, remote):
    assert is_remote(loc) is remote


def test_unknown_scheme_is_a_named_error():
    with pytest.raises(StorageURLError, match="unknown URL scheme 'ftp'"):
        is_remote("ftp://host/x")


def test_file_url_is_the_local_path():
    assert local_path("file:///data/my%20set") == "/data/my set"
    assert local_path("rel/x") == "rel/x"
    with pytest.raises(StorageURLError, match="names a host"):
        local_path("file://otherhost/x")


@pytest.mark.parametrize("url,expected", [("s3://bkt", ("s3", "bkt", "")), ("s3://bkt/a/b/", ("s3", "bkt", "a/b")),
                                          ("gs://bkt/x", ("gs", "bkt", "x"))])
def test_split_url(url, expected):
    assert split_url(url) == expected


@pytest.mark.parametrize("url", ["s3://", "s3:///x", "s3://b/a/../c", "s3://b/a//c"])
def test_bad_bucket_urls_are_refused(url):
    with pytest.raises(StorageURLError):
        split_url(url)


def test_storage_options_nest_and_convert():
    assert parse_storage_options(["anon=true", "client_kwargs.region_name=eu-west-1", "retries=3",
                                  "endpoint_url=http://h:9000"]) == {
        "anon": True, "client_kwargs": {"region_name": "eu-west-1"}, "retries": 3, "endpoint_url": "http://h:9000"}
    with pytest.raises(StorageURLError, match="KEY=VALUE"):
        parse_storage_options(["novalue"])


def _roundtrip(url: str) -> None:
    store = open_store(url + "/ds")
    rng = np.random.default_rng(len(url))
    blob = rng.integers(0, 256, 100_003, dtype=np.uint8).tobytes()
    store.put("a/shard-00000.bin", blob)
    store.put("b.txt", b"hello")
    names = [i.name for i in store.list()]
    assert names == ["a/shard-00000.bin", "b.txt"]
    info = store.info("a/shard-00000.bin")
    assert info.size == len(blob) and info.version
    assert store.read("a/shard-00000.bin") == blob
    for start, end in [(0, 1), (4095, 70_001), (100_000, 100_003)]:
        assert store.read_range("a/shard-00000.bin", start, end) == blob[start:end]
    assert b"".join(store.iter_chunks("a/shard-00000.bin", chunk=7777)) == blob
    with pytest.raises(FileNotFoundError):
        store.info("missing")
    store.delete("b.txt")
    assert not store.exists("b.txt")


def test_s3_roundtrip_list_and_ranged_reads(s3_bucket):
    _roundtrip(s3_bucket)


def test_gcs_roundtrip_list_and_ranged_reads(gcs_bucket):
    _roundtrip(gcs_bucket)


def test_s3_conditional_create_replace_delete(s3_bucket):
    store = open_store(s3_bucket + "/out")
    v1 = store.create("lock", b"one")
    with pytest.raises(PreconditionFailed, match="already exists"):
        store.create("lock", b"two")
    assert store.read("lock") == b"one"
    v2 = store.replace("lock", b"three", v1)
    assert v2 != v1
    with pytest.raises(PreconditionFailed, match="no longer at version"):
        store.replace("lock", b"four", v1)  # a stale compare-and-swap loses
    with pytest.raises(PreconditionFailed):
        store.delete("lock", if_version=v1)
    assert store.read("lock") == b"three"
    store.delete("lock", if_version=v2)
    assert not store.exists("lock")


def test_store_pickles_by_url_and_options(s3_bucket):
    import pickle

    store = open_store(s3_bucket + "/p", {"requester_pays": False})
    again = pickle.loads(pickle.dumps(store))
    assert again.url == store.url and again.storage_options == {"requester_pays": False}
    store.put("x", b"1")
    assert again.read("x") == b"1"


def test_unreachable_endpoint_is_a_named_error(s3_server, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    store = open_store("s3://nobucket/x", {"config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 1}}})
    with pytest.raises(StorageError, match=r"s3://nobucket/x/f: reading failed.*endpoint"):
        store.read("f")


def test_missing_extra_names_the_pip_command(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_s3fs(name, *a, **k):
        if name == "s3fs":
            raise ImportError("No module named 's3fs'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_s3fs)
    with pytest.raises(StorageError, match=r"pip install 'imgshard\[s3\]'"):
        open_store("s3://b/x")
