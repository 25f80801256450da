"""JPEG checks made before Pillow decodes: a scan whose data ends early, and image bombs.

Pillow (libjpeg) decodes a JPEG whose scan data ends before the last row (a file cut and
closed with an end-of-image marker, or a header that claims more rows than the data
holds) without an error: the missing rows come out flat grey, with a warning on stderr
nobody sees. It is the JPEG twin of the short PNG stream. `check_jpeg` walks the Huffman
codes of each sequential scan (`_jpegscan.count_mcus`, C: no pixel is decoded) and
raises `JpegDataError` when the data ends before the frame's last block.

Before that, a cheap bound refuses a header claiming far more pixels than the file could
hold: every 8x8 block of a Huffman-coded JPEG costs at least one bit, so a 1 KB file
claiming 9000x9000 (1.27 million blocks) is cut short, not a picture, and is refused
before libjpeg allocates 240 MB for it.

With restart markers (most cameras write them), only the last interval is walked when the
scan holds every marker it needs: a scan that ends early lacks the markers after the cut.

Checked: baseline and extended sequential Huffman JPEGs (SOF0, SOF1), the kind cameras and
phones write, interleaved or not, with or without restart markers. Without the C extension
(no compiler at install) the scan walk is skipped.

Progressive JPEGs (SOF2, SOF10) get the size bound and a check of their scan script, not a
walk of their codes: each scan's header says which coefficients (Ss..Se) of which
components it carries and at which precision (Al), so a file whose data stops (an
end-of-image marker, or the end of the file) before every coefficient of every component
has had a scan at full precision (Al 0) is `truncated` (`_ScanScript`). A decoder would
show it blurred, or grey where no scan reached. Not detected: a cut inside the last scan
(libjpeg's default script ends with the luma AC refinement, so such a picture loses only its
finest luma detail in the rows after the cut) or inside an earlier scan whose later scans
survive (not possible for a plain cut). Lossless and hierarchical files get the size bound
only.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

try:
    from converter.transform import _jpegscan
except ImportError:  # pragma: no cover - built at install when a C compiler is present
    _jpegscan = None

_SOF_HUFFMAN = (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7)
_SOF_SEQUENTIAL = (0xC0, 0xC1)
_SOF_PROGRESSIVE = (0xC2, 0xCA)
_SOF_ALL = _SOF_HUFFMAN + (0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF)
_DHT, _DRI, _SOS, _EOI, _SOI = 0xC4, 0xDD, 0xDA, 0xD9, 0xD8
_STANDALONE = set(range(0xD0, 0xD8)) | {0x01, _SOI}


def scan_check_available() -> bool:
    """Whether the scan walk runs (the `_jpegscan` extension is built)."""
    return _jpegscan is not None


class JpegDataError(ValueError):
    """The JPEG's data cannot hold what its header promises. `kind`: 'truncated' or 'corrupt'."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


@dataclass(frozen=True)
class _Frame:
    sof: int
    height: int
    width: int
    components: dict[int, tuple[int, int]]  # id -> (h, v) sampling factors

    @property
    def hmax(self) -> int:
        return max(h for h, _ in self.components.values())

    @property
    def vmax(self) -> int:
        return max(v for _, v in self.components.values())

    def mcu_grid(self) -> tuple[int, int]:
        """(MCU columns, MCU rows) of an interleaved scan."""
        return _ceil(self.width, 8 * self.hmax), _ceil(self.height, 8 * self.vmax)

    def blocks(self, cid: int) -> tuple[int, int]:
        """(block columns, block rows) of component `cid` alone (a non-interleaved scan)."""
        h, v = self.components[cid]
        return _ceil(_ceil(self.width * h, self.hmax), 8), _ceil(_ceil(self.height * v, self.vmax), 8)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def check_jpeg(data: bytes) -> None:
    """Raise `JpegDataError` when the JPEG `data`'s header claims more blocks than its bytes can
    hold, or when a sequential scan's data ends before its last block. Files this cannot parse
    are left to Pillow (which names their damage)."""
    frame, tables, restart, pos, script = None, [None] * 8, 0, 2, None
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return  # not where a marker belongs: Pillow names the damage
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == _EOI:
            break
        if marker in _STANDALONE:
            pos += 2
            continue
        (length,) = struct.unpack_from(">H", data, pos + 2)
        segment = data[pos + 4:pos + 2 + length]
        pos += 2 + length
        if marker in _SOF_ALL:
            frame = _frame(marker, segment)
            if frame is None:
                return
            _check_size(frame, len(data))
            if marker in _SOF_PROGRESSIVE:
                script = _ScanScript(frame)
            elif marker not in _SOF_SEQUENTIAL or _jpegscan is None:
                return  # lossless, hierarchical, arithmetic sequential: the bound only
        elif marker == _DHT:
            _tables(segment, tables)
        elif marker == _DRI and len(segment) >= 2:
            (restart,) = struct.unpack_from(">H", segment)
        elif marker == _SOS and script is not None:
            if not script.add(segment):
                return  # a scan header this does not understand: Pillow names the damage
            end = _SCAN_END.search(data, pos)
            pos = end.start() if end else len(data)
        elif marker == _SOS:
            if frame is None or frame.height == 0:
                return  # a height given later (DNL): not checked
            pos = _walk_scan(data, pos, segment, frame, tables, restart)
    if script is not None:
        script.check_complete()


class _ScanScript:
    """Which coefficients of which components a progressive JPEG's scans have carried at full
    precision (a scan with Al 0: a first scan without successive approximation, or the last
    refinement)."""

    def __init__(self, frame: _Frame) -> None:
        self.missing = {cid: set(range(64)) for cid in frame.components}
        self.scans = 0

    def add(self, segment: bytes) -> bool:
        """Count one scan header (SOS segment); False when it is not a valid progressive one."""
        n = segment[0] if segment else 0
        if n == 0 or len(segment) < 1 + 2 * n + 3:
            return False
        ss, se, ahal = segment[1 + 2 * n:4 + 2 * n]
        ids = [segment[1 + 2 * i] for i in range(n)]
        if any(c not in self.missing for c in ids) or not ss <= se <= 63:
            return False
        self.scans += 1
        if ahal & 15 == 0:
            for c in ids:
                self.missing[c].difference_update(range(ss, se + 1))
        return True

    def check_complete(self) -> None:
        short = sum(len(m) for m in self.missing.values())
        if short:
            total = 64 * len(self.missing)
            raise JpegDataError(
                "truncated",
                f"the progressive JPEG's data ends after {self.scans} scan(s), before {short} of the {total} "
                "coefficients of its components reach full precision (cut short: a decoder would show it blurred, "
                "or flat grey where no scan reached)",
            )


def _frame(sof: int, segment: bytes) -> _Frame | None:
    if len(segment) < 6:
        return None
    _, height, width, n = struct.unpack_from(">BHHB", segment)
    if len(segment) < 6 + 3 * n or n == 0 or width == 0:
        return None
    components = {}
    for i in range(n):
        cid, hv, _ = struct.unpack_from(">BBB", segment, 6 + 3 * i)
        if not (1 <= hv >> 4 <= 4 and 1 <= hv & 15 <= 4):
            return None
        components[cid] = (hv >> 4, hv & 15)
    return _Frame(sof, height, width, components)


def _check_size(frame: _Frame, size: int) -> None:
    blocks = _ceil(frame.width, 8) * _ceil(frame.height, 8)
    if frame.sof in _SOF_HUFFMAN and blocks > 8 * size:
        raise JpegDataError(
            "truncated",
            f"the JPEG header says {frame.width}x{frame.height} ({blocks} blocks of 8x8 pixels, each at least "
            f"one bit of data) but the file's {size} bytes hold at most {8 * size} (cut short, or an image bomb)",
        )


def _tables(segment: bytes, tables: list) -> None:
    """Store the Huffman tables of a DHT segment (slots 0-3 DC, 4-7 AC)."""
    at = 0
    while at + 17 <= len(segment):
        tc_th = segment[at]
        total = sum(segment[at + 1:at + 17])
        if tc_th >> 4 > 1 or tc_th & 15 > 3:
            return
        tables[(tc_th >> 4) * 4 + (tc_th & 15)] = bytes(segment[at + 1:at + 17 + total])
        at += 17 + total


_RESTART = re.compile(rb"\xff[\xd0-\xd7]")
_SCAN_END = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


def _last_interval(data: bytes, pos: int, mcus: int, restart: int) -> tuple[int, int]:
    """(offset, MCUs before it) of where to walk a scan with restart markers: from its last restart
    marker when the scan holds every one it needs (the intervals before it are then whole, and only
    the last can end early); from `pos` otherwise (the walk finds where the data ends)."""
    end = _SCAN_END.search(data, pos)
    markers = [m.start() for m in _RESTART.finditer(data, pos, end.start() if end else len(data))]
    intervals = -(-mcus // restart)
    if not markers or len(markers) != intervals - 1:
        return pos, 0
    return markers[-1] + 2, (intervals - 1) * restart


def _walk_scan(data: bytes, pos: int, segment: bytes, frame: _Frame, tables: list, restart: int) -> int:
    """Walk one scan's codes; returns the offset of the marker after it."""
    n = segment[0] if segment else 0
    if n == 0 or len(segment) < 1 + 2 * n + 3:
        return len(data)
    ids = [segment[1 + 2 * i] for i in range(n)]
    if any(c not in frame.components for c in ids):
        return len(data)
    selectors = {segment[1 + 2 * i]: segment[2 + 2 * i] for i in range(n)}
    if n == 1:  # non-interleaved: one block per MCU
        cols, rows = frame.blocks(ids[0])
        per_row, mcu_rows, blocks, mcu_height = cols, rows, [ids[0]], 8
    else:
        per_row, mcu_rows = frame.mcu_grid()
        blocks = [c for c in ids for _ in range(frame.components[c][0] * frame.components[c][1])]
        mcu_height = 8 * frame.vmax
    layout = bytes(b for c in blocks for b in (selectors[c] >> 4, selectors[c] & 15))
    if any(b > 3 for b in layout):
        return len(data)
    mcus = per_row * mcu_rows
    start, skipped = pos, 0
    if restart:  # restart markers: every interval before the last is whole if its marker follows it
        start, skipped = _last_interval(data, pos, mcus, restart)
    done, end, status = _jpegscan.count_mcus(data, start, mcus - skipped, restart, layout, tuple(tables))
    done += skipped
    if status == 2:
        raise JpegDataError("corrupt", f"the JPEG scan data is damaged (an invalid Huffman code or a missing "
                                       f"restart marker after about {done // per_row * mcu_height} rows)")
    if status == 1 or done < mcus:
        rows = min(frame.height, done // per_row * mcu_height)
        raise JpegDataError("truncated", f"the JPEG scan data ends after about {rows} of its {frame.height} rows "
                                         "(a decoder would fill the rest with flat grey)")
    return end
