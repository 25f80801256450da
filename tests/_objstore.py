"""Real object-store servers on 127.0.0.1 for the tests: moto's S3 server and a GCS emulator.

Each server is a child process started once per test session (`s3_server`, `gcs_server`
fixtures, registered in conftest.py); `s3_bucket`/`gcs_bucket` give each test a fresh,
empty bucket URL. The environment variables the SDKs read (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``STORAGE_EMULATOR_HOST``, ...) are set for the session, so
subprocesses (the CLI, worker processes) reach the same server.

A test that needs a server is skipped only when the server's package is missing; CI
installs them through the ``test`` extra, where nothing is skipped (`IMGSHARD_REQUIRE_OBJSTORE=1`
turns a missing package into a failure).
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Iterator

import pytest

_COUNTER = itertools.count()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _need(module: str) -> None:
    try:
        __import__(module)
    except ImportError:
        if os.environ.get("IMGSHARD_REQUIRE_OBJSTORE") == "1":
            raise
        pytest.skip(f"{module} is not installed (pip install -e '.[test]')")


def _start(argv: list[str], url: str, name: str) -> subprocess.Popen:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the {name} server exited at start (code {proc.returncode}): {argv}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return proc
        except urllib.error.HTTPError:
            return proc  # it answers
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the {name} server did not answer on {url} within 60 s")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class _Env:
    def __init__(self, values: dict[str, str]) -> None:
        self.saved = {k: os.environ.get(k) for k in values}
        os.environ.update(values)

    def restore(self) -> None:
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """The endpoint URL of a moto S3 server on 127.0.0.1 (the environment points at it)."""
    _need("moto")
    _need("s3fs")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], url, "moto S3")
    env = _Env({"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "imgshard-test", "AWS_SECRET_ACCESS_KEY": "imgshard-test",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"})
    try:
        yield url
    finally:
        env.restore()
        _stop(proc)


def new_bucket(scheme: str) -> str:
    """A fresh empty bucket on the running test server; returns ``scheme://name``."""
    import fsspec

    name = f"imgshard-{os.getpid()}-{next(_COUNTER)}"
    fs = fsspec.filesystem("s3" if scheme == "s3" else "gcs", skip_instance_cache=True)
    fs.mkdir(name)
    return f"{scheme}://{name}"


@pytest.fixture
def s3_bucket(s3_server: str) -> str:
    """``s3://<fresh bucket>`` on the moto server."""
    return new_bucket("s3")


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[str]:
    """The URL of a gcp-storage-emulator on 127.0.0.1 (``STORAGE_EMULATOR_HOST`` points at it)."""
    _need("gcp_storage_emulator")
    _need("gcsfs")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start([sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port", str(port),
                   "--in-memory"], url, "GCS emulator")
    env = _Env({"STORAGE_EMULATOR_HOST": url, "GOOGLE_CLOUD_PROJECT": "imgshard-test"})
    try:
        yield url
    finally:
        env.restore()
        _stop(proc)


@pytest.fixture
def gcs_bucket(gcs_server: str) -> str:
    """``gs://<fresh bucket>`` on the GCS emulator."""
    return new_bucket("gs")
