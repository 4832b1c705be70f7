"""TensorBoard event files, read without TensorBoard: the scalars in them.

An event file (``events.out.tfevents.*``) is a TFRecord file: each record is its length (u64, little
endian), the masked CRC32C of those 8 bytes, the data, and the data's masked CRC32C. The data is an
``Event`` protocol buffer (tensorflow/core/util/event.proto): ``wall_time`` (1, double), ``step`` (2,
int64) and, among others, a ``Summary`` (5), whose repeated ``Value`` (1) carries a ``tag`` (1) and
either a ``simple_value`` (2, float: PyTorch's ``SummaryWriter.add_scalar``, TF1) or a ``tensor`` (8,
TensorProto: TF2's ``tf.summary.scalar``, ``add_scalar(new_style=True)``), whose ``metadata`` (9) names
its plugin (``scalars``) on the first value of a tag only. The protocol buffer wire format is decoded
here by hand (varints, fixed 32/64-bit, length-delimited fields): it is small, and the agent has no
dependencies. Standard library only, Python 3.8+.

What is not a scalar (images, histograms, text, graphs, hparams) is skipped: a record whose event has no
summary is not even checked; a summary's record is checked against its CRC before its summary is read.
Every parse is lazy and bounded: the Event's fields are read up to its summary only, a tensor's values up
to the second, and a record's messages together yield at most FIELDS_MAX fields (a record of 8 MiB of
2-byte fields is refused after FIELDS_MAX of them, not listed whole).
"""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

from gpu_train.checksum import masked_crc32c

if TYPE_CHECKING:
    Point = tuple[float, float, float | None]  # (step, wall time, value or None): a list in JSON

EVENT_FILE = "events.out.tfevents."  # the name's prefix, as every writer names them
RECORD_MAX = 64 << 20  # a length beyond this is a corrupt header, not a record
FIELDS_MAX = 1 << 16  # fields one record may hold, all its messages together (a scalar's is about 6)
SCALARS_PLUGIN = "scalars"
DATA_CLASS_SCALAR = 1

# TensorProto's dtype (tensorflow/core/framework/types.proto) -> struct format of one element.
DTYPES = {1: "<f", 2: "<d", 3: "<i", 4: "<B", 5: "<h", 6: "<b", 9: "<q", 10: "<?", 17: "<H", 19: "<e", 22: "<I", 23: "<Q"}
DT_BFLOAT16 = 14
# TensorProto's repeated value fields: struct format of a fixed element, or varint:
# float_val, double_val, int_val, int64_val, bool_val, half_val (half and bfloat16 bits), uint32_val, uint64_val.
VALUE_FIELDS = {5: "<f", 6: "<d", 7: "varint", 10: "varint", 11: "varint", 13: "varint", 16: "varint", 17: "varint"}


class Corrupt(ValueError):
    """A record that is not what its framing or its protocol buffer says."""


class Budget:
    """The fields a record's parse may still read, its messages together: what bounds a hostile record."""

    __slots__ = ("left",)

    def __init__(self, left: int = FIELDS_MAX) -> None:
        self.left = left


def varint(buf: bytes, i: int) -> tuple[int, int]:
    """The varint at ``buf[i]``: (value, the index after it)."""
    shift = result = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise Corrupt("a varint runs past its message")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def fields(buf: bytes, budget: Budget | None = None) -> Iterator[tuple[int, int, int | bytes]]:
    """The fields of one message, one at a time: (number, wire type, value): an int for a varint, bytes for
    a length-delimited field or a fixed 32/64-bit one (decoded by who knows its type). Each field is taken
    from ``budget`` (the record's): past it, Corrupt."""
    left = budget if budget is not None else Budget()
    i, n = 0, len(buf)
    while i < n:
        if left.left <= 0:
            raise Corrupt(f"more than {FIELDS_MAX} fields")
        left.left -= 1
        key = buf[i]
        if key < 0x80:  # a field number below 16: one byte (every field these messages use)
            i += 1
        else:
            key, i = varint(buf, i)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, i = varint(buf, i)
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        elif wire == 2:
            size = buf[i] if i < n else 0x80
            if size < 0x80:
                i += 1
            else:
                size, i = varint(buf, i)
            value, i = buf[i : i + size], i + size
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        else:  # 3 and 4 (groups) are not in these messages; 6 and 7 do not exist
            raise Corrupt(f"wire type {wire} in field {number}")
        if i > n:
            raise Corrupt(f"field {number} runs past its message")
        yield number, wire, value


def signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _packed(number: int, wire: int, value: int | bytes) -> Iterator[int | float]:
    """A repeated numeric field's elements, one at a time (packed in one length-delimited field, or one
    element), varints as their raw integers (their type is the field's: ``_element``)."""
    fixed = VALUE_FIELDS[number]
    if wire == 2:
        data = value if isinstance(value, bytes) else b""
        if fixed != "varint":
            size = struct.calcsize(fixed)
            for k in range(0, len(data) - size + 1, size):
                yield struct.unpack_from(fixed, data, k)[0]
            return
        i = 0
        while i < len(data):
            v, i = varint(data, i)
            yield v
    elif isinstance(value, bytes):
        if fixed != "varint" and len(value) == struct.calcsize(fixed):
            yield struct.unpack(fixed, value)[0]
    else:
        yield value


def _element(number: int, dtype: int, v: int | float) -> float:
    """One element of a repeated field as a number: int32/int64 are two's complement in 64 bits, half_val
    holds a half's or a bfloat16's 16 bits (by the dtype)."""
    if number == 13:
        bits = int(v) & 0xFFFF
        if dtype == DT_BFLOAT16:
            return float(struct.unpack("<f", struct.pack("<I", bits << 16))[0])
        return float(struct.unpack("<e", struct.pack("<H", bits))[0])
    return float(signed64(int(v)) if number in (7, 10) else v)


def tensor_scalar(buf: bytes, budget: Budget | None = None) -> tuple[float | None, int]:
    """A TensorProto's one element: (its value, the tensor's rank); (None, rank) when it holds none or
    more than one number, or a type that is not a number (strings). Its values are read to the second."""
    dtype, rank, content = 0, 0, None
    values: list[tuple[int, int | float]] = []
    for number, wire, value in fields(buf, budget):
        if number == 1 and isinstance(value, int):  # (a varint: wire type 0)
            dtype = value
        elif number == 2 and isinstance(value, bytes):  # TensorShapeProto: dim (2) per dimension
            rank = sum(1 for n, _, _ in fields(value, budget) if n == 2)
        elif number == 4 and isinstance(value, bytes):
            content = value
        elif number in VALUE_FIELDS and len(values) < 2:  # a second is enough to say it is not one element
            values += [(number, v) for v in itertools.islice(_packed(number, wire, value), 2 - len(values))]
    if content is not None:
        if dtype == DT_BFLOAT16 and len(content) == 2:
            return float(struct.unpack("<f", b"\0\0" + content)[0]), rank
        fmt = DTYPES.get(dtype)
        if fmt is None or len(content) != struct.calcsize(fmt):
            return None, rank
        return float(struct.unpack(fmt, content)[0]), rank
    if dtype == 7 or len(values) != 1:  # DT_STRING, or not one element
        return None, rank
    return _element(values[0][0], dtype, values[0][1]), rank


def _plugin(buf: bytes, budget: Budget | None = None) -> tuple[str | None, int]:
    """SummaryMetadata: (plugin_data.plugin_name, data_class)."""
    name, data_class = None, 0
    for number, _, value in fields(buf, budget):
        if number == 1 and isinstance(value, bytes):
            for n, _, v in fields(value, budget):
                if n == 1 and isinstance(v, bytes):
                    name = v.decode("utf-8", "replace")
        elif number == 4 and isinstance(value, int):  # (a varint: wire type 0)
            data_class = value
    return name, data_class


def summary_scalars(buf: bytes, plugins: dict[str, str | None], budget: Budget | None = None) -> list[tuple[str, float]]:
    """(tag, value) of each scalar in a Summary. ``plugins`` remembers each tag's plugin across the
    file: a writer names it on a tag's first value only."""
    left = budget if budget is not None else Budget()
    out = []
    for number, _, value in fields(buf, left):
        if number != 1 or not isinstance(value, bytes):
            continue
        tag, simple, tensor, meta = None, None, None, None
        for n, w, v in fields(value, left):
            if n == 1 and isinstance(v, bytes):
                tag = v.decode("utf-8", "replace")
            elif n == 2 and w == 5 and isinstance(v, bytes) and len(v) == 4:
                simple = struct.unpack("<f", v)[0]
            elif n == 8 and isinstance(v, bytes):
                tensor = v
            elif n == 9 and isinstance(v, bytes):
                meta = v
        if tag is None:
            continue
        if meta is not None:
            name, data_class = _plugin(meta, left)
            plugins[tag] = SCALARS_PLUGIN if data_class == DATA_CLASS_SCALAR else name
        if simple is not None:
            out.append((tag, float(simple)))
        elif tensor is not None:
            plugin = plugins.get(tag)
            if plugin not in (None, SCALARS_PLUGIN):
                continue  # a histogram, an image, text, hparams ...
            scalar, rank = tensor_scalar(tensor, left)
            if scalar is not None and (plugin == SCALARS_PLUGIN or rank == 0):
                out.append((tag, scalar))
    return out


def event_parts(data: bytes, budget: Budget | None = None) -> tuple[int, float, bytes | None]:
    """An Event's (step, wall time, its Summary's bytes or None), read up to its summary: writers put its
    fields in their numbers' order, so wall_time (1) and step (2) come before the summary (5), and what
    follows is not read."""
    step, wall = 0, 0.0
    for number, wire, value in fields(data, budget):
        if number == 1 and wire == 1 and isinstance(value, bytes) and len(value) == 8:
            wall = struct.unpack("<d", value)[0]
        elif number == 2 and isinstance(value, int):  # (a varint: wire type 0)
            step = signed64(value)
        elif number == 5 and isinstance(value, bytes):
            return step, wall, value
    return step, wall, None


def records(f: IO[bytes], path: str, problems: list[str]) -> Iterator[tuple[bytes, int, int]]:
    """Each complete record: (its data, its data's CRC as written, the offset after it). A partial record
    at the end (being written) ends the file quietly; a length that fails its CRC ends it, said."""
    while True:
        header = f.read(12)
        if len(header) < 12:
            return
        length_bytes, (crc,) = header[:8], struct.unpack("<I", header[8:])
        if masked_crc32c(length_bytes) != crc:
            problems.append(f"{path}: a record's length fails its CRC at byte {f.tell() - 12}; the rest is not read")
            return
        (length,) = struct.unpack("<Q", length_bytes)
        if length > RECORD_MAX:
            problems.append(f"{path}: a record of {length} bytes at byte {f.tell() - 12}; the rest is not read")
            return
        data, footer = f.read(length), f.read(4)
        if len(data) < length or len(footer) < 4:
            return  # the writer has not finished this record
        yield data, struct.unpack("<I", footer)[0], f.tell()


def read_scalars(path: str, problems: list[str], resume: dict[str, Any] | None = None) -> dict[str, list[Point]]:
    """Every scalar in one event file: tag -> [[step, wall time, value]] in the order written (a value
    that is not finite as None: JSON has no NaN). An event without a summary (a graph, a session log) is
    skipped unread; a summary's record is checked against its CRC first. ``resume`` (what an earlier read
    of this file left: its ``offset``, ``plugins`` and ``series``) is read on from where it stopped, and
    left as this read ends."""
    state = resume if resume is not None else {}
    series: dict[str, list[Point]] = state.setdefault("series", {})
    plugins: dict[str, str | None] = state.setdefault("plugins", {})
    said: list[str] = state.setdefault("problems", [])  # kept with the state: a resumed read says them again
    problems += said
    said_before = len(said)
    with open(path, "rb") as f:
        f.seek(state.get("offset", 0))
        for data, crc, end in records(f, path, problems):
            state["offset"] = end
            try:
                budget = Budget()
                step, wall, summary = event_parts(data, budget)
                if summary is None:
                    continue
                if masked_crc32c(data) != crc:  # before the summary is read
                    said.append(f"{path}: a record fails its CRC at byte {end - 4 - len(data)}; skipped")
                    continue
                scalars = summary_scalars(summary, plugins, budget)
            except Corrupt as e:
                what = "fails its CRC" if masked_crc32c(data) != crc else f"is not an event ({e})"
                said.append(f"{path}: a record {what} at byte {end - 4 - len(data)}; skipped")
                continue
            for tag, value in scalars:
                series.setdefault(tag, []).append((step, wall, value if math.isfinite(value) else None))
    problems += said[said_before:]
    return series
