"""Colour -> class table: exact colours, tolerance boxes, ambiguity, and its inverted storage."""

from __future__ import annotations

import numpy as np

from converter.transform.colormap import AMBIGUOUS, UNKNOWN, ColorMap
from readers.manifest import ClassInfo


def _pack(*colors: tuple[int, int, int]) -> np.ndarray:
    c = np.array(colors, np.uint32).reshape(-1, 3)
    return (c[:, 0] << 16) | (c[:, 1] << 8) | c[:, 2]


CLASSES = (ClassInfo("sky", (128, 128, 128)), ClassInfo("road", (128, 64, 128)), ClassInfo("car", (64, 0, 128)))


def test_exact_colours_map_to_their_class_and_everything_else_is_unknown() -> None:
    cmap = ColorMap(CLASSES)
    got = cmap.lookup_colors(_pack((128, 128, 128), (128, 64, 128), (64, 0, 128), (0, 0, 0), (255, 255, 255),
                                   (128, 128, 129)))
    assert got.tolist() == [0, 1, 2, UNKNOWN, UNKNOWN, UNKNOWN]
    # stored inverted: only the class colours' entries were ever written
    assert np.count_nonzero(cmap.inverted_lut) == len(CLASSES)


def test_tolerance_snaps_near_colours_marks_ties_ambiguous_and_exact_colours_win() -> None:
    classes = CLASSES + (ClassInfo("sign", (128, 128, 136)),)  # 8 away from sky in blue
    cmap = ColorMap(classes, tolerance=5)
    got = cmap.lookup_colors(_pack(
        (130, 126, 128),   # within 5 of sky only
        (128, 128, 132),   # within 5 of sky (4) and of sign (4): ambiguous
        (128, 128, 136),   # sign exactly, inside nothing else's box
        (133, 128, 128),   # sky +5: still sky
        (134, 128, 128),   # sky +6: unknown
        (64, 5, 128),      # car +5 in green
    ))
    assert got.tolist() == [0, AMBIGUOUS, 3, 0, UNKNOWN, 2]
    tied = ColorMap((ClassInfo("a", (10, 10, 10)), ClassInfo("b", (14, 10, 10))), tolerance=4)
    assert tied.lookup_colors(_pack((10, 10, 10), (14, 10, 10), (12, 10, 10))).tolist() == [0, 1, AMBIGUOUS]


def test_lookup_without_stats_skips_unknown_colours_but_still_reports_ambiguous_ones() -> None:
    """`--unknown-color ignore` needs no stats for unknown colours; an ambiguous one is still an error."""
    import io

    from PIL import Image

    from converter.transform import png
    from converter.transform.decode import SourceFile, decode_mask

    classes = CLASSES + (ClassInfo("sign", (128, 128, 136)),)
    cmap = ColorMap(classes, tolerance=5)
    rng = np.random.default_rng(3)
    rgb = np.array([c.color for c in classes], np.uint8)[rng.integers(0, len(classes), (40, 60))]
    rgb[5:9, 7:12] = (0, 255, 0)  # unknown

    def mask_of(pixels: np.ndarray):
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="PNG")
        return decode_mask(SourceFile("m.png", buf.getvalue(), None), 1 << 30)  # type: ignore[arg-type]

    full, unknown = cmap.lookup(mask_of(rgb))
    assert unknown.counts == {(0, 255, 0): 20} and not unknown.ambiguous
    quick, none = cmap.lookup(mask_of(rgb), stats=False)
    np.testing.assert_array_equal(quick, full)
    assert not none.counts and not none.ambiguous
    if png.available():
        assert mask_of(rgb).rows is not None  # the fast path's colour layout is what `stats` spares

    rgb[0, 0] = (128, 128, 132)  # within 5 of sky and of sign
    _, both = cmap.lookup(mask_of(rgb), stats=False)
    assert both.ambiguous == {(128, 128, 132): 1} and both.counts == {(0, 255, 0): 20}
