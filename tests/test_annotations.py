"""Annotation files that are not mask images (issue 27): each export converts bit-exact
against its reference implementation (`tests/_annotations.py`), cron re-converts only what
changed, hostile files get named errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

import readers
from converter.convert import convert
from converter.discover.annotations.base import AnnotationFileError
from converter.discover.layouts import detect_layout
from converter.options import AnnotationOptions, OnChange, OutputOptions, RunOptions, SourceSpec
from tests import _annotations as A

SIZE = (20, 26)  # (h, w): never a source size


def assert_converts(exp: A.Export, out, spec: SourceSpec | None = None, size=SIZE) -> readers.Dataset:
    convert(spec or SourceSpec(root=str(exp.root)), str(out), OutputOptions(size=size), RunOptions(workers=2))
    data = readers.open(out)
    assert [n for n, _ in data.classes] == exp.names
    assert data.splits == exp.splits()
    records = {r.key: r for split in data.splits for r in data.records(split)}
    assert set(records) == set(exp.images)
    for key, image in exp.images.items():
        ref_image, ref_mask = A.reference(image, exp.expected[key], size)
        np.testing.assert_array_equal(records[key].image, ref_image, err_msg=key)
        np.testing.assert_array_equal(records[key].mask.astype(np.int64), ref_mask, err_msg=key)
    return data


def test_coco_roboflow_export_bit_exact_with_placeholder_crowd_and_sparse_ids(tmp_path):
    exp = A.make_coco(tmp_path / "src")
    assert detect_layout(str(exp.root)).layout.name == "coco"
    assert_converts(exp, tmp_path / "out")
    assert any((m == A.IGNORE).any() for m in exp.expected.values())  # crowd regions really are there
    assert len({int(v) for m in exp.expected.values() for v in np.unique(m)}) == 5
