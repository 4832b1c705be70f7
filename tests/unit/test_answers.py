"""The agent's answers are one declared contract on both sides (gpu_train/answers.py): the agent builds
each through ``codec.answer``, the laptop reads each through ``codec.check``, and a field renamed on
either side fails here. The answers are real: the agent's own commands on a real run store."""

from __future__ import annotations

import io
import json
import os
import stat
import types
import typing
import zlib
from pathlib import Path
from typing import Any

import pytest

from agent import cluster, fetchserve, lifecycle, metrics, prune, status
from agent.store import update_state, write_json
from gpu_train import answers
from gpu_train.codec import answer, check
from gpu_train.contract import AUTHORIZED_KEYS_ENV, JobSpec, Scalars

RUN = "train_20260101_000000"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOv3kF0Zq6Gm9m3x4YcQ2b8b1sV3oYq0r7Zt8m2Jk1aB"
METRICS = '{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.25}\n'  # a JSONL metrics file, for `scalars`
NVIDIA_SMI = "#!/bin/sh\necho '0, NVIDIA L4, 37, 1024, 23034'\n"  # the driver's CSV (--query-gpu ... --format=csv,noheader,nounits)


@pytest.fixture(scope="module")
def real_answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, dict]]:
    """Each subcommand's answer, from the agent's own code on a real REMOTE_ROOT with a finished run (its
    JOB_DIR, outputs and log) and a GPU (nvidia-smi's CSV, as the driver prints it)."""
    tmp = tmp_path_factory.mktemp("answers")
    root = str(tmp / "root")
    run_dir = os.path.join(root, "runs", RUN)
    os.makedirs(os.path.join(run_dir, "job"))
    os.makedirs(os.path.join(run_dir, "code"))
    Path(run_dir, "job", "ckpt.pt").write_bytes(b"w" * 10)
    Path(run_dir, "code", "out.txt").write_text("an output in the working directory")
    Path(run_dir, "log").write_text("step 1\nloss 0.5\n")
    Path(run_dir, "job", "metrics.jsonl").write_text(METRICS)
    write_json(os.path.join(run_dir, "spec.json"), JobSpec(run_id=RUN, base="train", command="true").to_json())
    update_state(run_dir, id=RUN, base="train", state="succeeded", created=1.0, started=2.0, ended=5.0, exit_code=0)
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(stat.S_IRWXU)
    saved = {k: os.environ.get(k) for k in ("PATH", AUTHORIZED_KEYS_ENV)}
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{saved['PATH']}"
    os.environ[AUTHORIZED_KEYS_ENV] = str(tmp / "authorized_keys")
    try:
        said = {
            "status": (answers.StatusDoc, status.cmd_status(root, None, summaries=True)),
            "stop": (answers.Stopped, lifecycle.cmd_stop(root, RUN, 0)),
            "prune": (answers.Pruned, prune.cmd_prune(root, None, dry_run=True)),
            "tick": (answers.Ticked, lifecycle.cmd_tick(root)),
            "configure": (answers.Configured, lifecycle.cmd_configure(root, {"maxResumes": 3}, cron=False)),
            "boot": (answers.Booted, lifecycle.cmd_boot(root)),
            "authorize": (answers.Authorized, cluster.cmd_authorize(KEY, "s", None, root, RUN, "train")),
            "unauthorize": (answers.Unauthorized, cluster.cmd_unauthorize(KEY)),
            "scalars": (Scalars, metrics.cmd_scalars(root, [RUN], [], 10)),
        }
        listed, hashes, pong, refusal = fetch_serve(
            root,
            {"op": "list", "runs": [RUN, f"{RUN}/workdir", f"{RUN}/.gpu-train", "r_19990101_000000"]},
            {"op": "hash", "items": [[RUN, "ckpt.pt", 0, 10, 4], [RUN, "gone.pt", 0, 1, 1]]},
            {"op": "ping"},
            {"op": "delete"},
        )
        said |= {
            "fetch-serve list": (answers.Listed, listed),
            "fetch-serve hash": (answers.Hashes, hashes),
            "fetch-serve ping": (answers.Pong, pong),
            "fetch-serve refusal": (answers.Refusal, refusal),
        }
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    # As the laptop gets them: through JSON.
    return {cmd: (kind, json.loads(json.dumps(doc))) for cmd, (kind, doc) in said.items()}


def fetch_serve(root: str, *requests: dict) -> list[dict]:
    """The documents the agent's fetch server (agent/fetchserve.py) answers ``requests`` with, off its wire."""
    wire = io.BytesIO()
    assert fetchserve.serve(root, [json.dumps(r).encode() + b"\n" for r in requests], wire) == 0
    wire.seek(0)
    docs = []
    while head := wire.readline():
        docs.append(json.loads(zlib.decompress(wire.read(json.loads(head)["len"]))))
    return docs


def key_paths(kind: Any, doc: dict, where: tuple = ()) -> list[tuple]:
    """Every key the contract declares in ``doc``, nested answers included (a list's first item, each
    item of a list of several kinds, each value of a map)."""
    if not typing.is_typeddict(kind):  # a Document (contract.Scalars): its fields, under their wire names
        return [(*where, key) for key in doc if key != "version"]
    hints = typing.get_type_hints(kind, localns={"NotRequired": typing.NotRequired})
    paths = []
    for key, value in doc.items():
        paths.append((*where, key))
        paths += inner_paths(hints[key], value, (*where, key))
    return paths


def inner_paths(hint: Any, value: Any, where: tuple) -> list[tuple]:
    kinds = [k for k in (typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)) if typing.is_typeddict(k)]
    if kinds and isinstance(value, dict):  # the one of them it is: the one that declares all its keys
        return next((key_paths(k, value, where) for k in kinds if set(value) <= set(k.__annotations__)), [])
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list and value:
        items = list(enumerate(value)) if isinstance(args[0], types.UnionType) else [(0, value[0])]
        return [path for i, item in items for path in inner_paths(args[0], item, (*where, i))]
    if origin is dict and isinstance(value, dict):
        return [path for k, item in value.items() for path in inner_paths(args[1], item, (*where, k))]
    return []


def misspelled(key: str) -> str:
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in key)
    return snake if snake != key else f"{key}s"


def renamed(doc: Any, path: tuple) -> Any:
    """``doc`` with the key at ``path`` renamed as a careless edit would (camelCase to snake_case, or a plural)."""
    if len(path) == 1:
        return {misspelled(k) if k == path[0] else k: v for k, v in doc.items()}
    head, rest = path[0], path[1:]
    if isinstance(doc, list):
        return [renamed(doc[head], rest), *doc[1:]]
    return {**doc, head: renamed(doc[head], rest)}


def test_the_real_answers_are_what_the_contract_declares(real_answers) -> None:
    for cmd, (kind, doc) in real_answers.items():
        assert answers.ANSWERS.get(cmd, kind) is kind  # (fetch-serve's documents are a stream's: not in the table)
        assert check(kind, doc, cmd) == (doc if typing.is_typeddict(kind) else kind.from_json(doc)), cmd
    run = real_answers["status"][1]["runs"][0]
    assert {"jobSummary", "workdirSummary", "logSummary"} <= set(run) and run["jobSummary"]["bytes"] == 10 + len(METRICS)
    assert real_answers["status"][1]["gpus"] == [
        {"index": 0, "name": "NVIDIA L4", "utilization": 37.0, "memoryUsedMiB": 1024.0, "memoryTotalMiB": 23034.0}
    ]


def test_a_renamed_field_is_refused_by_the_laptop(real_answers) -> None:
    """Every field of every real answer, renamed: the laptop's check refuses it, naming the key."""
    tried = 0
    for cmd, (kind, doc) in real_answers.items():
        for path in key_paths(kind, doc):
            with pytest.raises(ValueError) as refused:
                check(kind, renamed(doc, path), cmd)
            assert str(refused.value).startswith(cmd) and f"has '{misspelled(path[-1])}', which " in str(refused.value), refused.value
            tried += 1
    assert tried > 60  # the status family alone has more


def test_the_fetch_stream_refuses_a_renamed_field_or_a_row_out_of_shape(real_answers, tmp_path: Path) -> None:
    """The laptop's fetch stream (remote/transfer/fetch/stream.py) reads the host's documents through the same
    check: each renamed key of a real listing and real hashes ends the stream with an error naming it."""
    from remote.transfer.fetch.stream import Stream, StreamError

    def read(kind: Any, doc: Any) -> Any:
        packed = zlib.compress(json.dumps(doc).encode())
        (tmp_path / "wire").write_bytes(json.dumps({"len": len(packed), "zlib": True}).encode() + b"\n" + packed)
        stream = Stream(["cat", str(tmp_path / "wire")])
        try:
            return stream.read_doc(kind, "the host's document")
        finally:
            stream.close()

    tried = 0
    for cmd in ("fetch-serve list", "fetch-serve hash"):
        kind, doc = real_answers[cmd]
        assert read(kind, doc) == doc
        for path in key_paths(kind, doc):
            with pytest.raises(StreamError, match=f"^the host's document.* has '{misspelled(path[-1])}', which "):
                read(kind, renamed(doc, path))
            tried += 1
    assert tried == 10  # runs, its four sources; items, sha256, whole, stat, error
    listed = real_answers["fetch-serve list"][1]
    row = listed["runs"][RUN]["entries"][0]
    for bad, said in (([*row[:2], "10", *row[3:]], r"entries\[0\]\[2\] is '10', not an int"), (row[:5], r"entries\[0\] is \[")):
        with pytest.raises(StreamError, match=said):
            read(answers.Listed, {"runs": {RUN: {"entries": [bad]}}})
    with pytest.raises(StreamError, match="the host refused: unknown op 'delete'"):
        read(answers.Pong, real_answers["fetch-serve refusal"][1])


def test_the_state_comes_back_as_a_run_state(real_answers) -> None:
    from gpu_train.contract import RunState

    doc = check(answers.StatusDoc, real_answers["status"][1], "status")
    assert doc["runs"][0]["state"] is RunState.SUCCEEDED
    with pytest.raises(ValueError, match=r"status's runs\[0\]'s state is 'done', not one of starting, running"):
        check(answers.StatusDoc, {**doc, "runs": [{**doc["runs"][0], "state": "done"}]}, "status")


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda r: {**r, "exitCode": "0"}, r"runs\[0\]'s exitCode is '0', not an int or null"),
        (lambda r: {**r, "resumes": True}, r"runs\[0\]'s resumes is True, not an int"),
        (lambda r: {**r, "durationS": None}, None),  # declared float | None
        (lambda r: {**r, "jobSummary": {"files": 1, "bytes": 2}}, r"runs\[0\]'s jobSummary has no newestNs"),
        (lambda r: {k: v for k, v in r.items() if k != "logSummary"}, None),  # NotRequired: --summaries only
        (lambda r: {k: v for k, v in r.items() if k != "lastLine"}, r"runs\[0\] has no lastLine"),
        (lambda r: {**r, "returns": [1]}, r"runs\[0\]'s returns\[0\] is 1, not an object"),
    ],
)
def test_the_laptop_says_what_does_not_fit(real_answers, change, said) -> None:
    doc = real_answers["status"][1]
    changed = {**doc, "runs": [change(doc["runs"][0])]}
    if said is None:
        check(answers.StatusDoc, changed, "status")
    else:
        with pytest.raises(ValueError, match=said):
            check(answers.StatusDoc, changed, "status")


def test_the_agents_builder_refuses_a_missing_an_unknown_or_a_mistyped_key(real_answers) -> None:
    """The agent's one constructor: for every required key of every answer, leaving it out fails; so
    does a key no declaration has, and a value of another type."""
    for kind, doc in real_answers.values():
        if not typing.is_typeddict(kind):
            continue  # a Document's builder is its dataclass, which refuses an unknown or missing field itself
        for key in doc:
            if not kind.__annotations__[key].__forward_arg__.startswith("NotRequired["):
                with pytest.raises(TypeError, match=f"has no {key}"):
                    answer(kind, **{k: v for k, v in doc.items() if k != key})
            with pytest.raises(TypeError, match="does not declare"):
                answer(kind, **renamed(doc, (key,)))
        if doc:  # (Pong has no key)
            with pytest.raises(TypeError, match=r"is object\(\)|is <object"):
                answer(kind, **{**doc, next(iter(doc)): object()})


def test_every_answer_the_laptop_reads_is_declared_in_one_table() -> None:
    """The agent's subcommands that answer with one document each have their declaration."""
    from agent.cli import parser

    commands = set(parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr,arg-type]  # (argparse keeps subcommands in private, loosely typed fields)
    streamed = {"wrap", "upload", "bucket-data", "bucket-probe", "fetch-serve", "receive-code", "relay-code", "logs", "launch", "watch"}
    assert commands - streamed == set(answers.ANSWERS)
