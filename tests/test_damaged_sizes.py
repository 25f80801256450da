"""Issue 25, item 9: every size read from a manifest or an index header is bounded by the
file's real size before anything is allocated.

A real conversion (several small shards), then one index file damaged four ways, with the
manifest's size and digest of the index made right again where the damage is inside the
file (so only the structure check can see it): the manifest's ``"bytes"`` of the index
set to 1 TiB; an ``.npy`` header claiming shape (4e9,); the index replaced by a zip; a
key that is not UTF-8. `verify` (plain and --deep), `convert` (the next nightly run),
`compact` and the readers must each end in a named error (the index file and the
reason), with no traceback and no MemoryError, in a child process with a 2 GiB address
space limit (`tests/_hostile.py`); plain `verify` never says OK.
"""

from __future__ import annotations

import io
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import xxhash

from _hostile import assert_named_error, run_hostile
from converter.testing import synth
from readers.manifest import MANIFEST_NAME
from tests._cron import convert_args, run_cli

DAMAGES = ("bytes_1tib", "header_4e9_rows", "zip", "non_utf8_key")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sizes")
    src = synth.make_camvid(root / "src", splits={"train": 8, "val": 2}, size=[(40, 56)], seed=5)
    out = root / "out"
    assert run_cli(convert_args(src.root, out, "--shard-size", "8KB")) == 0
    return Path(src.root), out


def _first_index(out: Path) -> tuple[dict, dict]:
    doc = json.loads((out / MANIFEST_NAME).read_text())
    return doc, doc["splits"]["train"]["shards"][0]["index"]


def _write_index(out: Path, doc: dict, ref: dict, data: bytes) -> None:
    """Replace the index file's bytes and make the manifest's size and digest agree."""
    (out / ref["file"]).write_bytes(data)
    ref["bytes"] = len(data)
    ref["digest"] = "xxh3_128:" + xxhash.xxh3_128_hexdigest(data)
    (out / MANIFEST_NAME).write_text(json.dumps(doc))


def damage(out: Path, kind: str) -> str:
    """Damage the first train shard's index file; returns its name."""
    doc, ref = _first_index(out)
    path = out / ref["file"]
    data = path.read_bytes()
    if kind == "bytes_1tib":
        ref["bytes"] = 1 << 40
        (out / MANIFEST_NAME).write_text(json.dumps(doc))
    elif kind == "header_4e9_rows":
        table = np.load(io.BytesIO(data), allow_pickle=False)
        header = repr({"descr": np.lib.format.dtype_to_descr(table.dtype), "fortran_order": False,
                       "shape": (len(table),)})
        start = data.index(header[:10].encode("latin1"))  # where NumPy's header dict begins
        end = data.index(b"\n", start)
        claimed = header.replace(f"({len(table)},)", "(4000000000,)")
        new_header = claimed.encode("latin1").ljust(end - start)
        assert len(new_header) == end - start
        _write_index(out, doc, ref, data[:start] + new_header + data[end:])
    elif kind == "zip":
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr("arr_0.npy", data)
        _write_index(out, doc, ref, buf.getvalue())
    else:
        table = np.load(io.BytesIO(data), allow_pickle=False)
        key = table["key"][1]
        table["key"][1] = b"train/caf\xe9" + key[len(b"train/caf\xe9"):]  # latin-1, same length
        buf = io.BytesIO()
        np.save(buf, table, allow_pickle=False)
        _write_index(out, doc, ref, buf.getvalue())
    return ref["file"]


REASONS = {"bytes_1tib": "size", "header_4e9_rows": "4000000000", "zip": "zip archive", "non_utf8_key": "not UTF-8"}


@pytest.fixture
def damaged(pristine, tmp_path, request) -> tuple[Path, Path, str, str]:
    src, out = pristine
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    kind = request.param
    return src, copy, damage(copy, kind), kind


def _reader_code(out: Path) -> str:
    return (
        "import sys, readers\n"
        "try:\n"
        f"    ds = readers.open({str(out)!r})\n"
        "    keys = ds.keys('train')\n"
        "except (readers.ManifestError, readers.ShardError) as e:\n"
        "    print(type(e).__name__ + ': ' + str(e)); sys.exit(3)\n"
        "print('read', len(keys), 'keys')\n"
    )


@pytest.mark.parametrize("damaged", DAMAGES, indirect=True)
def test_damaged_index_is_a_named_error_in_verify_convert_compact_and_readers(damaged):
    src, out, name, kind = damaged
    for args in (["verify", str(out)], ["verify", "--deep", str(out)]):
        text = assert_named_error(run_hostile(args), name, REASONS[kind])
        assert "OK" not in text.split()
    assert_named_error(run_hostile(code=_reader_code(out)), name, REASONS[kind])
    before = (out / MANIFEST_NAME).read_bytes()
    assert_named_error(run_hostile(["compact", str(out), "--target-shard-size", "1MB", "-q"]), name)
    new_src = out.parent / "src2"
    shutil.copytree(src, new_src)
    synth.make_camvid(new_src / "more", splits={"train": 1}, size=[(40, 56)], seed=9)  # a new sample to convert
    assert_named_error(run_hostile(convert_args(new_src, out, "--shard-size", "8KB")), name)
    assert (out / MANIFEST_NAME).read_bytes() == before  # nothing published over the damage


def test_index_reading_is_bounded_by_the_file_not_the_manifest(pristine, tmp_path):
    """The 1 TiB claim reads the file's own bytes (+1), never allocates the claim."""
    from readers.index import IndexFileError, read_bounded, read_index
    from readers.manifest import Manifest

    copy = tmp_path / "out"
    shutil.copytree(pristine[1], copy)
    real = (copy / _first_index(copy)[1]["file"]).stat().st_size
    name = damage(copy, "bytes_1tib")
    data = read_bounded(str(copy), str(copy / name), 1 << 40, "shard")
    assert len(data) == real
    entry = Manifest.load(copy).shards("train")[0]
    with pytest.raises(IndexFileError, match="size or digest differs"):
        read_index(str(copy), entry)
