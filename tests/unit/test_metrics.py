"""`scalars` on the host: which files, how a resumed series reads, the bounds of the answer."""

from __future__ import annotations

import json
import math
import os
import time

import pytest

from agent import metrics
from agent.store import AgentError
from gpu_train.contract import SCALAR_SERIES_MAX, Scalars


@pytest.mark.parametrize(
    "steps, expected",
    [
        ([0, 1, 2, 3], [0, 1, 2, 3]),
        ([0, 10, 20, 30, 10, 20, 30, 40], [0, 10, 20, 30, 40]),  # resumed from the checkpoint at 10
        ([0, 10, 20, 30, 15, 25], [0, 10, 15, 25]),  # from a step between two points
        ([5, 5, 5], [5, 5, 5]),  # a step written again is not a restart
        ([0, 10, 0, 10], [0, 10]),  # started over
    ],
)
def test_a_resumed_series_reads_as_one_history(steps, expected):
    points: list = []
    metrics.extend(points, [(s, float(i), float(i)) for i, s in enumerate(steps)])
    assert [p[0] for p in points] == expected
    assert points[-1][2] == len(steps) - 1  # the latest write of a step wins


@pytest.mark.parametrize(
    "n, limit, expected",
    [
        (5, 10, [0, 1, 2, 3, 4]),
        (10, 4, [0, 3, 6, 9]),
        (101, 5, [0, 25, 50, 75, 100]),
        (7, 2, [0, 6]),
        (7, 1, [6]),
    ],
)
def test_thinning_keeps_the_ends_evenly(n, limit, expected):
    assert [p[0] for p in metrics.thinned([(i, 0, 0) for i in range(n)], limit)] == expected


@pytest.mark.parametrize(
    "tag, source, names, expected",
    [
        ("loss", "job/logs/train", [], True),
        ("loss", "job/logs/train", ["loss"], True),
        ("epoch_loss", "job/logs/validation", ["validation/epoch_loss"], True),
        ("epoch_loss", "job/logs/train", ["validation/epoch_loss"], False),
        ("eval/loss", "code/output/runs/x", ["eval/*"], True),
        ("train/loss", "code/output/runs/x", ["loss"], False),  # not a suffix on a tag's own parts
        ("loss", "code/runs", ["runs/loss", "acc"], True),
    ],
)
def test_tags_asked_for(tag, source, names, expected):
    assert metrics.wanted(tag, source, names) is expected


def test_jsonl_metrics_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [
        {"step": 0, "loss": 2.0, "lr": 0.1, "time": 100.0},
        {"step": 10, "loss": 1.0, "eval": {"acc": 0.5}, "note": "text", "flag": True},
        "not json",
        [1, 2],
        {"step": 20, "loss": float("nan")},
        {"step": 10, "loss": 0.9},  # resumed from step 10
    ]
    text = "\n".join(json.dumps(x) if not isinstance(x, str) else x for x in lines) + "\n" + '{"step": 30, "lo'
    path.write_text(text)
    problems: list[str] = []
    got = metrics.read_jsonl(str(path), problems)
    assert {t: [(s, v) for s, _, v in p] for t, p in got.items()} == {
        "loss": [(0, 2.0), (10, 0.9)],
        "lr": [(0, 0.1)],
        "eval/acc": [(10, 0.5)],
    }
    assert got["lr"][0][1] == 100.0  # its own time
    assert problems == [f"{path}: 2 line(s) that are not a JSON object with a finite step; skipped"]


DEEP = "[" * 100_000 + "]" * 100_000  # json.loads: RecursionError
DEEP_OBJECT = '{"a": ' * 5_000 + "1" + "}" * 5_000


@pytest.mark.parametrize(
    "line, expected, skipped",
    [
        ('{"step": NaN, "loss": 1.0}', {}, 1),  # int(nan): ValueError
        ('{"step": Infinity, "loss": 1.0}', {}, 1),  # int(inf): OverflowError
        ('{"step": -Infinity, "loss": 1.0}', {}, 1),
        ('{"step": 1' + "0" * 400 + ', "loss": 1.0}', {}, 1),  # an int no float holds
        ('{"iteration": NaN, "step": 2, "loss": 1.0}', {"loss": [(2, 1.0)]}, 0),  # "step" is the step: read first
        (DEEP, {}, 1),
        ('{"step": 2, "deep": ' + DEEP + "}", {}, 1),
        ('{"step": 2, "x": ' + DEEP_OBJECT + "}", {}, 1),
        ('{"step": 2, "loss": Infinity, "acc": 0.5}', {"loss": [(2, None)], "acc": [(2, 0.5)]}, 0),  # a gap
        ('{"step": 2, "big": 1' + "0" * 400 + "}", {"big": [(2, None)]}, 0),
        ('{"step": 2, "time": NaN, "loss": 1.0}', {"loss": [(2, 1.0)]}, 0),  # the file's time instead
    ],
)
def test_one_bad_jsonl_line_costs_only_itself(tmp_path, line, expected, skipped):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 3.0}\n' + line + '\n{"step": 3, "loss": 2.0}\n')
    problems: list[str] = []
    got = metrics.read_jsonl(str(path), problems)
    want = {**expected, "loss": [(1, 3.0), *expected.get("loss", []), (3, 2.0)]}
    assert {t: [(s, v) for s, _, v in p] for t, p in got.items()} == want
    assert all(math.isfinite(w) for p in got.values() for _, w, _ in p)
    assert problems == ([f"{path}: 1 line(s) that are not a JSON object with a finite step; skipped"] if skipped else [])


LIGHTNING_CSV = "epoch,step,train_loss,val_loss\r\n0,9,2.5,\r\n0,19,2.0,\r\n0,19,,1.75\r\n1,29,1.5,\r\n"


@pytest.mark.parametrize(
    "text, expected, skipped",
    [
        (  # Lightning's CSVLogger: \r\n, a blank where a metric was not logged that step, epoch a tag
            LIGHTNING_CSV,
            {
                "epoch": [(9, 0.0), (19, 0.0), (19, 0.0), (29, 1.0)],
                "train_loss": [(9, 2.5), (19, 2.0), (29, 1.5)],
                "val_loss": [(19, 1.75)],
            },
            0,
        ),
        ("step,loss\n1,nan\n2,inf\n3,-Infinity\n4,0.5\n", {"loss": [(1, None), (2, None), (3, None), (4, 0.5)]}, 0),  # gaps
        ("step,loss\nnan,1.0\n,2.0\n1e400,3.0\nx,4.0\n5,5.0\n", {"loss": [(5, 5.0)]}, 4),  # no finite step
        ("step,loss\n1,2.0\n2,3.0", {"loss": [(1, 2.0)]}, 0),  # the last line is still being written
        ("step,loss\n1,2.0\n2,", {"loss": [(1, 2.0)]}, 0),
        ("step,lo", {}, 0),  # not even the header yet
        ("", {}, 0),
        ("loss,acc\n3.0,0.1\n\n2.0,\n", {"loss": [(0, 3.0), (1, 2.0)], "acc": [(0, 0.1)]}, 0),  # no step: the row
        ("step,loss,phase\n1,2.0,train\n2,tensor(1.0),val\n", {"loss": [(1, 2.0)]}, 0),  # text is no point
        ("step,loss\n1,2.0,7\n2,1.0\n", {"loss": [(2, 1.0)]}, 1),  # longer than its header
        ("step,loss\n1,2.0\n2\n", {"loss": [(1, 2.0)]}, 0),  # shorter: the rest blank
        ("step,loss\n1,\x002.0\n2,1.0\n", {"loss": [(2, 1.0)]}, 1),  # a NUL: a file cut while rewritten
        ("step,loss\n1,2.0\nstep,acc,loss\n2,0.5,1.0\n", {"loss": [(1, 2.0), (2, 1.0)], "acc": [(2, 0.5)]}, 0),  # a new header
        ("step,loss\n10,2.0\n20,1.0\n10,1.9\n", {"loss": [(10, 1.9)]}, 0),  # resumed from step 10
        (" step , val/loss \n 1 , 2.0 \n", {"val/loss": [(1, 2.0)]}, 0),  # spaces around
        ('"step","a,b"\n1,2.0\n', {"a,b": [(1, 2.0)]}, 0),  # a quoted name
        ("global_step,time,loss,_runtime\n7,100.0,1.0,3.0\n", {"loss": [(7, 1.0)]}, 0),  # its own time; not tags
    ],
)
def test_csv_metrics_file(tmp_path, text, expected, skipped):
    path = tmp_path / "metrics.csv"
    path.write_bytes(text.encode())
    problems: list[str] = []
    got = metrics.read_csv(str(path), problems)
    assert {t: [(s, v) for s, _, v in p] for t, p in got.items()} == expected
    assert all(math.isfinite(w) and w > 0 for p in got.values() for _, w, _ in p)
    assert problems == (
        [f"{path}: {skipped} row(s) without a finite step, longer than the header or unreadable; skipped"] if skipped else []
    )


def test_a_csv_row_costs_its_own_cells_not_its_headers(tmp_path):
    """A header of 100,000 names (a job that logs a metric per class, or a hostile file) above 1,000 rows of
    two cells: each row read at the cost of its own cells. Looking for the step column along the whole
    header for every row took 5.5 s of CPU here (11:20 UTC, load 2.5); one look per header, 0.05 s."""
    path = tmp_path / "metrics.csv"
    names = ",".join(f"c{i}" for i in range(100_000))
    path.write_text(f"step,{names}\n" + "".join(f"{r},1.0\n" for r in range(1000)))
    cpu = time.process_time()
    got = metrics.read_csv(str(path), [])
    assert time.process_time() - cpu < 1.5
    assert [s for s, _, _ in got["c0"]] == list(range(1000)) and list(got) == ["c0"]


def test_a_big_text_metrics_file_is_read_from_its_last_bytes(tmp_path, monkeypatch):
    """A JSONL or CSV file over TEXT_MAX bytes (a dataset whose name matched, every step of a long run) is
    read from its last TEXT_MAX bytes, a CSV with its header, and said: read whole, a 16 MB CSV took 3.4 s
    of CPU and 330 MB on the host at each call. A step-less line keeps its number in the whole file."""
    monkeypatch.setattr(metrics, "TEXT_MAX", 4096)
    csv_path, jsonl_path = tmp_path / "server_metrics.csv", tmp_path / "metrics.jsonl"
    csv_path.write_text("step,loss,acc\n" + "".join(f"{i},{i}.5,\n" for i in range(2000)))
    jsonl_path.write_text("".join(json.dumps({"loss": i}) + "\n" for i in range(2000)))
    problems: list[str] = []
    rows = metrics.read_csv(str(csv_path), problems)
    lines = metrics.read_jsonl(str(jsonl_path), problems)
    assert set(rows) == {"loss"} and [s for s, _, _ in rows["loss"]][-1] == 1999 and 100 < len(rows["loss"]) < 500
    assert all(v == s + 0.5 for s, _, v in rows["loss"])  # each cell under its header's name
    assert all(v == s for s, _, v in lines["loss"]) and lines["loss"][-1][0] == 1999 and len(lines["loss"]) < 500
    assert problems == [f"{csv_path}: 0 MiB; only its last 0 MiB read", f"{jsonl_path}: 0 MiB; only its last 0 MiB read"]
    csv_path.write_text("loss\n" + "".join(f"{i}.5\n" for i in range(2000)))  # no step column: the row's number
    assert all(v == s + 0.5 for s, _, v in metrics.read_csv(str(csv_path), [])["loss"])


def test_csv_wall_time_is_its_column_else_the_files(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("step,time,loss\n1,100.5,2.0\n2,,1.0\n")
    os.utime(path, (200.0, 200.0))
    got = metrics.read_csv(str(path), [])
    assert [w for _, w, _ in got["loss"]] == [100.5, 200.0]


def test_lightning_versions_are_series_of_their_own(tmp_path):
    """A resumed Lightning job logs into version_1 beside version_0, with the columns it logs now."""
    root = str(tmp_path)
    run = _run(root, "l_20260101_000000")
    for version, text in (("0", LIGHTNING_CSV), ("1", "epoch,lr,step,train_loss\n1,0.01,39,1.25\n")):
        os.makedirs(os.path.join(run, "code", "lightning_logs", f"version_{version}"))
        with open(os.path.join(run, "code", "lightning_logs", f"version_{version}", "metrics.csv"), "w") as f:
            f.write(text)
    doc = metrics.cmd_scalars(root, None, ["*loss", "lr"], 10)
    got = [(s["source"], s["kind"], s["tag"], s["points"]) for s in doc["runs"][0]["series"]]
    assert got == [
        ("code/lightning_logs/version_0/metrics.csv", "csv", "train_loss", [[9, 2.5], [19, 2.0], [29, 1.5]]),
        ("code/lightning_logs/version_0/metrics.csv", "csv", "val_loss", [[19, 1.75]]),
        ("code/lightning_logs/version_1/metrics.csv", "csv", "lr", [[39, 0.01]]),
        ("code/lightning_logs/version_1/metrics.csv", "csv", "train_loss", [[39, 1.25]]),
    ]
    assert doc["problems"] == []


def _run(root, run_id: str) -> str:
    run_dir = os.path.join(root, "runs", run_id)
    os.makedirs(os.path.join(run_dir, "job"))
    os.makedirs(os.path.join(run_dir, "code"))
    with open(os.path.join(run_dir, "state.json"), "w") as f:
        json.dump({"id": run_id, "state": "succeeded", "created": 1.0}, f)
    return run_dir


def test_scalars_answer_is_the_contracts_and_bounded(tmp_path, monkeypatch):
    root = str(tmp_path)
    a = _run(root, "a_20260101_000000")
    b = _run(root, "b_20260101_000000")
    with open(os.path.join(a, "job", "metrics.jsonl"), "w") as f:
        for step in range(1000):
            f.write(json.dumps({"step": step, "loss": 1000 - step, "acc": step / 1000}) + "\n")
    os.makedirs(os.path.join(b, "code", ".venv"))
    with open(os.path.join(b, "code", ".venv", "metrics.jsonl"), "w") as f:  # a venv is never searched
        f.write('{"step": 1, "x": 1}\n')
    with open(os.path.join(b, "code", "train_metrics.jsonl"), "w") as f:
        f.write('{"step": 1, "x": 1}\n')
    doc = Scalars.from_json(json.loads(json.dumps(metrics.cmd_scalars(root, None, ["loss", "x"], 10))))
    assert [r["id"] for r in doc.runs] == ["a_20260101_000000", "b_20260101_000000"]
    (loss,) = doc.runs[0]["series"]
    assert loss["source"] == "job/metrics.jsonl" and loss["kind"] == "jsonl" and loss["count"] == 1000
    assert len(loss["points"]) == 10 and loss["points"][0] == [0, 1000.0] and loss["points"][-1] == [999, 1.0]
    assert loss["min"] == [999, 1.0] and loss["max"] == [0, 1000.0] and loss["last"] == [999, 1.0]
    assert [s["source"] for s in doc.runs[1]["series"]] == ["code/train_metrics.jsonl"]
    one = metrics.cmd_scalars(root, ["a_2026"], None, 5)  # a prefix; every tag
    assert [s["tag"] for r in one["runs"] for s in r["series"]] == ["acc", "loss"]
    monkeypatch.setattr(metrics, "SCALAR_SERIES_MAX", 1)
    capped = metrics.cmd_scalars(root, None, None, 5)
    assert capped["truncated"] and sum(len(r["series"]) for r in capped["runs"]) == 1
    assert SCALAR_SERIES_MAX >= 100
    with pytest.raises(AgentError, match="--points 0"):
        metrics.cmd_scalars(root, None, None, 0)


def test_event_files_are_read_on_from_where_the_last_call_stopped(tmp_path):
    """The dashboard asks every few seconds while the job writes: each call reads only the new records,
    and answers as a read from the start would."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    root = str(tmp_path)
    run_dir = _run(root, "r_20260101_000000")
    w = EventFileWriter(os.path.join(run_dir, "code", "tb"))

    def put(steps) -> None:
        for step in steps:
            value = summary_pb2.Summary.Value(tag="loss", simple_value=1.0 / (step + 1))
            w.add_event(event_pb2.Event(step=step, wall_time=1.0 + step, summary=summary_pb2.Summary(value=[value])))
        w.flush()

    def ask() -> dict:
        (run,) = metrics.cmd_scalars(root, None, ["loss"], 3)["runs"]
        return run["series"][0]

    put(range(10))
    first = ask()
    with open(os.path.join(run_dir, metrics.CACHE)) as f:
        cache = json.load(f)
    (entry,) = cache["files"].values()
    assert first["count"] == 10 and entry["offset"] == os.path.getsize(w.get_logdir() + "/" + os.listdir(w.get_logdir())[0])
    put(range(10, 25))
    grown = ask()
    assert grown["count"] == 25 and grown["last"] == [24, pytest.approx(1 / 25)]
    os.remove(os.path.join(run_dir, metrics.CACHE))
    assert ask() == grown  # the same answer from the start
    w.close()
    path = os.path.join(w.get_logdir(), os.listdir(w.get_logdir())[0])
    with open(path, "rb") as f:
        head = f.read()
    os.remove(path)
    with open(path, "wb") as f:  # another file under the name (a new inode, shorter): read anew
        f.write(head[: len(head) // 2])
    assert ask()["count"] < 25
