"""The agent's event-file reader against the real writers (PyTorch's SummaryWriter, TensorBoard's own
EventFileWriter with TF2's tensor scalars) and TensorBoard's own reader as the oracle."""

from __future__ import annotations

import glob
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agent import tfevents
from gpu_train.checksum import crc32c, masked_crc32c
from tests.conftest import ROOT


def _files(folder) -> list[str]:
    return sorted(glob.glob(os.path.join(folder, "**", "events.out.tfevents.*"), recursive=True))


def _oracle(path: str) -> dict[str, list[tuple[int, float]]]:
    """TensorBoard's own reading of one file: simple values, and tensors of one element."""
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    ea = event_accumulator.EventAccumulator(path, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    ea.Reload()
    out = {t: [(e.step, e.value) for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}
    for t in ea.Tags()["tensors"]:
        meta = ea.SummaryMetadata(t)
        if meta.plugin_data.plugin_name != "scalars":
            continue
        out[t] = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in ea.Tensors(t)]
    return out


def _ours(path: str) -> tuple[dict[str, list[tuple[int, float | None]]], list[str]]:
    problems: list[str] = []
    read = tfevents.read_scalars(path, problems)
    return {t: [(s, v) for s, _, v in pts] for t, pts in read.items()}, problems


def _same(ours: dict, theirs: dict) -> None:
    assert sorted(ours) == sorted(theirs)
    for tag, points in theirs.items():
        assert [s for s, _ in ours[tag]] == [s for s, _ in points], tag
        for (_, a), (_, b) in zip(ours[tag], points, strict=True):
            assert (a is None and not np.isfinite(b)) or a == pytest.approx(b, rel=1e-6), tag


@pytest.fixture(scope="module")
def torch_events(tmp_path_factory):
    """Simple values, as PyTorch's SummaryWriter writes them (through this same EventFileWriter), with a
    histogram and an image between them; tests/e2e/test_scalars.py reads SummaryWriter's own files."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    folder = tmp_path_factory.mktemp("simple")
    w = EventFileWriter(str(folder))

    def put(step: int, *values: summary_pb2.Summary.Value) -> None:
        w.add_event(event_pb2.Event(step=step, wall_time=1e9 + step, summary=summary_pb2.Summary(value=list(values))))

    for step in range(0, 300, 3):
        put(step, summary_pb2.Summary.Value(tag="train/loss", simple_value=2.0 / (step + 1)))
        if step % 30 == 0:
            histo = summary_pb2.HistogramProto(min=0, max=1, num=2, bucket_limit=[0.5, 1], bucket=[1, 1])
            put(step, summary_pb2.Summary.Value(tag="weights", histo=histo))
            image = summary_pb2.Summary.Image(height=1, width=1, colorspace=1, encoded_image_string=b"\x89PNG")
            put(step, summary_pb2.Summary.Value(tag="sample", image=image))
    put(300, summary_pb2.Summary.Value(tag="train/loss", simple_value=float("nan")))
    put(2**40, summary_pb2.Summary.Value(tag="train/loss", simple_value=-3.5))  # a step past 32 bits
    w.close()
    return folder


def test_simple_values_read_as_tensorboard_reads_them(torch_events):
    (path,) = _files(torch_events)
    ours, problems = _ours(path)
    assert problems == [] and list(ours) == ["train/loss"]  # not the histogram, not the image
    _same(ours, _oracle(path))
    assert ours["train/loss"][-1] == (2**40, -3.5) and ours["train/loss"][-2] == (300, None)


def test_tf2_tensor_scalars_of_every_numeric_dtype(tmp_path):
    """TF2's tf.summary.scalar: a tensor whose metadata (scalars plugin) comes with a tag's first value only."""
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.util import tensor_util

    dtypes = [np.float32, np.float64, np.int64, np.int32, np.float16, np.int8, np.uint8, np.int16, np.bool_]
    w = EventFileWriter(str(tmp_path))
    for step, dt in enumerate(dtypes * 2):
        v = summary_pb2.Summary.Value(tag="epoch_loss", tensor=tensor_util.make_tensor_proto(dt(step % 7)))
        if step == 0:
            v.metadata.plugin_data.plugin_name = "scalars"
            v.metadata.data_class = summary_pb2.DATA_CLASS_SCALAR
        text = summary_pb2.Summary.Value(tag="words", tensor=tensor_util.make_tensor_proto(np.array("x", dtype=object)))
        text.metadata.plugin_data.plugin_name = "text"
        w.add_event(event_pb2.Event(step=step, wall_time=10.0 + step, summary=summary_pb2.Summary(value=[v, text])))
    # a 'scalars' tensor sent as repeated fields, not tensor_content (float_val, double_val, int64_val, half_val)
    for step, (kind, value) in enumerate([("float_val", 1.5), ("double_val", 2.5), ("int64_val", -7), ("int_val", -3)], 100):
        proto = tensor_pb2.TensorProto(dtype={"float_val": 1, "double_val": 2, "int64_val": 9, "int_val": 3}[kind])
        proto.tensor_shape.SetInParent()  # rank 0
        getattr(proto, kind).append(value)
        v = summary_pb2.Summary.Value(tag="epoch_loss", tensor=proto)
        w.add_event(event_pb2.Event(step=step, wall_time=1.0, summary=summary_pb2.Summary(value=[v])))
    w.close()
    (path,) = _files(tmp_path)
    ours, problems = _ours(path)
    assert problems == [] and list(ours) == ["epoch_loss"]
    _same(ours, _oracle(path))
    assert ours["epoch_loss"][-4:] == [(100, 1.5), (101, 2.5), (102, -7.0), (103, -3.0)]


def _record(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


def test_a_file_being_written_and_a_corrupt_one(torch_events, tmp_path):
    (source,) = [f for f in _files(torch_events) if os.path.dirname(f) == str(torch_events)]
    data = Path(source).read_bytes()
    whole, _ = _ours(source)
    # cut in the middle of the last record: what is complete reads, quietly (the writer is at work)
    cut = tmp_path / "events.out.tfevents.1.cut"
    cut.write_bytes(data[:-7])
    ours, problems = _ours(str(cut))
    assert problems == [] and ours["train/loss"] == whole["train/loss"][:-1]
    # one summary record's data changed: that record is skipped and said, the rest reads
    flipped = bytearray(data)
    offset = len(data) - 30
    flipped[offset] ^= 0x55
    bad = tmp_path / "events.out.tfevents.2.bad"
    bad.write_bytes(bytes(flipped))
    ours, problems = _ours(str(bad))
    assert len(problems) == 1 and "fails its CRC" in problems[0] and "skipped" in problems[0]
    assert ours["train/loss"] == whole["train/loss"][:-1]
    # a length that fails its CRC: nothing after it can be framed, so the file ends there, said
    broken = tmp_path / "events.out.tfevents.3.len"
    first = _record(b"\x08\x01")  # an event with a wall time only
    broken.write_bytes(first + b"\xff" * 12 + data)
    ours, problems = _ours(str(broken))
    assert ours == {} and "length fails its CRC" in problems[0]


def _field(number: int, data: bytes) -> bytes:
    """A length-delimited field (field numbers below 16)."""
    size, n = b"", len(data)
    while True:
        size += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
        n >>= 7
        if not n:
            break
    return bytes([number << 3 | 2]) + size + data


HOSTILE = 512 << 10  # bytes of tiny fields in a record whose CRC is right (the review's was 8 MiB: 8 s, 324 MiB)
TINY = b"\x08\x01" * (HOSTILE // 2)  # field 1 = 1, 262_144 times
SCALAR = _field(1, _field(1, b"ok") + b"\x15" + struct.pack("<f", 0.5))  # Value{tag: "ok", simple_value: 0.5}


# The read of one file in a fresh Python, saying the fields walked and how far its resident memory grew
# (the kernel's peak, reset just before: /proc/self/clear_refs "5"). tracemalloc in pytest's process
# measured the same at 15 times the CPU (2.4 s a record).
MEASURED = r"""import json, sys
sys.path.insert(0, sys.argv[2])
from agent import tfevents
walked = 0
real = tfevents.fields
def counted(buf, *rest):
    global walked
    for f in real(buf, *rest):
        walked += 1
        yield f
tfevents.fields = counted
def kib(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))
problems = []
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = kib("VmRSS")
read = tfevents.read_scalars(sys.argv[1], problems)
peak = (kib("VmHWM") - before) * 1024
ours = {t: [[s, v] for s, _, v in pts] for t, pts in read.items()}
print(json.dumps({"walked": walked, "peak": peak, "ours": ours, "problems": problems}))
"""


@pytest.mark.parametrize(
    "event, said",
    [
        (b"\x11" + bytes(8) + TINY, "more than"),  # an Event of tiny fields and no summary
        (b"\x10\x07" + _field(5, TINY), "more than"),  # a Summary of tiny fields
        (b"\x10\x07" + _field(5, SCALAR + _field(1, TINY)), "more than"),  # one Value of them, after a scalar
        (b"\x10\x07" + _field(5, SCALAR * (HOSTILE // len(SCALAR))), "more than"),  # 37_449 real scalars
        # a tensor of 524_288 packed int64s (a scalar's is 1): not one element, nothing said
        (b"\x10\x07" + _field(5, _field(1, _field(1, b"t") + _field(8, b"\x08\x09" + _field(10, b"\x01" * HOSTILE)))), None),
    ],
)
def test_a_hostile_record_costs_bounded_work_and_memory(tmp_path, event, said):
    good = b"\x10\x01" + _field(5, SCALAR), b"\x10\x09" + _field(5, SCALAR)
    path = tmp_path / "events.out.tfevents.1.hostile"
    path.write_bytes(_record(good[0]) + _record(event) + _record(good[1]))
    read = subprocess.run([sys.executable, "-c", MEASURED, str(path), str(ROOT)], capture_output=True, text=True, timeout=60)
    assert read.returncode == 0, read.stderr
    got = json.loads(read.stdout)
    ours, problems = {t: [tuple(p) for p in pts] for t, pts in got["ours"].items()}, got["problems"]
    assert got["walked"] <= 70_000  # FIELDS_MAX (65_536) and the two good records'; 262_144 before
    assert got["peak"] < 16 * HOSTILE, got["peak"]  # 8 MiB (5 MB at most here): never a list of its fields (15 to 45 MB before)
    assert ours["ok"][0] == (1, 0.5) and ours["ok"][-1] == (9, 0.5)  # the records around it read
    if said:
        assert len(problems) == 1 and said in problems[0] and "skipped" in problems[0]
        assert len(ours["ok"]) == 2
    else:
        assert problems == [] and "t" not in ours


def test_crc32c_check_values():
    assert crc32c(b"123456789") == 0xE3069283  # the Castagnoli check value (RFC 3720's B.4)
    assert crc32c(b"") == 0 and crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720's 32 bytes of zeros


@pytest.mark.parametrize(
    "buf, expected",
    [
        (b"\x08\x96\x01", [(1, 0, 150)]),  # protobuf's own example: field 1 = 150
        (b"\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", [(2, 0, 2**64 - 1)]),  # -1 as an int64
        (b"\x12\x03abc", [(2, 2, b"abc")]),
        (b"\x15\x00\x00\xc0\x3f", [(2, 5, b"\x00\x00\xc0\x3f")]),
    ],
)
def test_wire_format_fields(buf, expected):
    assert list(tfevents.fields(buf)) == expected


@pytest.mark.parametrize("buf", [b"\x12\x05abc", b"\x08\x96", b"\x0b\x00", b"\x15\x00"])
def test_wire_format_refuses_what_runs_past_its_message(buf):
    with pytest.raises(tfevents.Corrupt):
        list(tfevents.fields(buf))
