"""Names files found beside a dataset (issue 24): which file is found, and the names it gives.

Each case writes the file as the tool that makes it writes it (labelme's labels.txt with
``__ignore__``, labelme2voc's class_names.txt, darknet ``*.names``, YOLO ``data.yaml`` as a
list and as a mapping) and states the expected names literally.
"""

from __future__ import annotations

import pytest

from converter.discover.names_files import NamesFileError, find_names_file, read_names


def test_labelme_labels_txt_drops_ignore_and_marks_background(tmp_path):
    p = tmp_path / "labels.txt"
    p.write_text("__ignore__\n_background_\nwater\nboat\n")
    nf = read_names(p)
    assert nf.names == ("_background_", "water", "boat")
    assert nf.ignore_names == ("__ignore__",) and nf.background == "_background_" and nf.kind == "labelme"


def test_plain_names_file_with_bom_crlf_comments_and_trailing_blank_lines(tmp_path):
    p = tmp_path / "classes.txt"
    p.write_bytes("\ufeff# my classes\r\n\r\nsky\r\nroad\r\ncar\r\n\r\n".encode())
    nf = read_names(p)
    assert nf.names == ("sky", "road", "car") and nf.background is None and nf.kind == "lines"


@pytest.mark.parametrize("sep", [" ", ",", ": ", "\t"])
def test_numbered_lines_give_ids_and_gaps_become_class_n(tmp_path, sep):
    p = tmp_path / "labels.txt"
    p.write_text(f"3{sep}crack\n0{sep}background\n1{sep}spall\n")
    assert read_names(p).names == ("background", "spall", "class_2", "crack")


def test_yaml_names_list_and_mapping(tmp_path):
    a = tmp_path / "a" / "data.yaml"
    a.parent.mkdir()
    a.write_text("path: .\ntrain: images/train\nnc: 3\nnames: ['person', 'car', 'dog']\n")
    assert read_names(a).names == ("person", "car", "dog") and read_names(a).kind == "yaml"
    b = tmp_path / "b" / "data.yaml"
    b.parent.mkdir()
    b.write_text("train: x\nnames:\n  2: dog\n  0: person\n  1: car\n")
    assert read_names(b).names == ("person", "car", "dog")
    c = tmp_path / "c" / "data.yml"
    c.parent.mkdir()
    c.write_text("names:\n  - cell\n  - nucleus\nnc: 2\n")
    assert read_names(c).names == ("cell", "nucleus")


def test_simple_yaml_fallback_reads_the_common_forms_without_pyyaml():
    from converter.discover.names_files import _simple_yaml_names

    assert _simple_yaml_names("nc: 2\nnames: [a, 'b c']\n") == ["a", "b c"]
    assert _simple_yaml_names("names:\n  - x\n  - y\nval: v\n") == ["x", "y"]
    assert _simple_yaml_names("names:\n  0: x\n  1: y\n") == {"0": "x", "1": "y"}


def test_find_prefers_class_names_then_classes_then_labels_then_yaml_then_names(tmp_path):
    assert find_names_file(str(tmp_path)) is None
    (tmp_path / "obj.names").write_text("a\nb\n")
    assert find_names_file(str(tmp_path)) == str(tmp_path / "obj.names")
    (tmp_path / "data.yaml").write_text("train: images\n")  # no names: not a names file
    assert find_names_file(str(tmp_path)) == str(tmp_path / "obj.names")
    (tmp_path / "data.yaml").write_text("names: [a, b]\n")
    assert find_names_file(str(tmp_path)) == str(tmp_path / "data.yaml")
    for name in ("labels.txt", "classes.txt", "class_names.txt"):
        (tmp_path / name).write_text("a\nb\n")
        assert find_names_file(str(tmp_path)) == str(tmp_path / name)


def test_two_darknet_names_files_are_not_guessed_between(tmp_path):
    (tmp_path / "a.names").write_text("a\n")
    (tmp_path / "b.names").write_text("b\n")
    assert find_names_file(str(tmp_path)) is None


@pytest.mark.parametrize("name, text, words", [
    ("classes.txt", "a\nb\na\n", "listed twice"),
    ("classes.txt", "\n# only a comment\n", "names no class"),
    ("classes.txt", "sky\nroad\n\ncar\n", "line 3: empty line between class names"),
    ("labels.txt", "0 a\n0 b\n", "id 0 is listed twice"),
    ("data.yaml", "names: 3\n", "expected 'names:'"),
    ("data.yaml", "names: {a: x}\n", "class ids"),
    ("data.yaml", "names: [a\n", "not valid YAML"),
])
def test_malformed_names_files_are_named_errors(tmp_path, name, text, words):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(NamesFileError, match=words) as e:
        read_names(p)
    assert str(p) in str(e.value)


def test_binary_file_is_a_named_error(tmp_path):
    p = tmp_path / "classes.txt"
    p.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(NamesFileError, match="not UTF-8"):
        read_names(p)
