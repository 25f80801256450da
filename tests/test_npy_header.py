"""The NPZ reader parses .npy headers without `ast` in the common case (thread-safe on 3.11)."""

from __future__ import annotations

import ast
import io
import threading

import numpy as np
import pytest

from readers.formats.npz.reader import _npy_header


def _header_text(arr: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, arr)
    raw = buf.getvalue()
    n = int.from_bytes(raw[8:10], "little")
    return raw[10:10 + n].decode("latin1")


@pytest.mark.parametrize("arr", [
    np.arange(2 * 5 * 4 * 3, dtype=np.uint8).reshape(2, 5, 4, 3),
    np.arange(7, dtype="<u2"),
    np.float32(3.5).reshape(()),
    np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    np.array(["train/a.png", "val/b.png"]),
], ids=["images", "uint16", "scalar", "fortran", "keys"])
def test_numpy_written_headers_parse_like_literal_eval(arr: np.ndarray) -> None:
    text = _header_text(arr)
    expect = ast.literal_eval(text)
    assert _npy_header(text) == (expect["descr"], expect["fortran_order"], tuple(expect["shape"]))


def test_other_writers_headers_fall_back_to_literal_eval_and_bad_ones_raise() -> None:
    reordered = "{'shape': (3, 2), 'fortran_order': False, 'descr': '<i4'}   \n"
    assert _npy_header(reordered) == ("<i4", False, (3, 2))
    with pytest.raises((ValueError, SyntaxError)):
        _npy_header("{'descr': '<i4', 'shape': (3, 2),")
    with pytest.raises(KeyError):
        _npy_header("{'descr': '<i4'}")


def test_headers_parse_from_many_threads_at_once() -> None:
    texts = [_header_text(np.zeros((i + 1, 3), np.uint8)) for i in range(50)]
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(40):
                for i, t in enumerate(texts):
                    assert _npy_header(t)[2] == (i + 1, 3)
        except BaseException as e:  # noqa: BLE001 - collected and re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:1]
