"""The laptop<->host contract: one codec both sides use, and a field renamed on one side fails here."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import fields, replace
from pathlib import Path

import pytest

from agent.bundle import CARRIED, parse_python
from gpu_train.codec import CONTRACT_VERSION, wire_name
from gpu_train.contract import (
    ACTIVE,
    FAILED,
    RUNNING,
    TERMINAL,
    AgentSettings,
    ContainerSpec,
    JobSpec,
    RunRecord,
    RunState,
)
from tests.conftest import ROOT, parse_source

FULL = JobSpec(
    run_id="r_20260101_000000",
    base="r",
    script="train.py",
    command="true",
    args=("--lr", "3e-4"),
    env={"WANDB_API_KEY": "s3cret"},
    python="/usr/bin/python3",
    expect_gpus=2,
    code_manifest="abc",
    reuse_code=True,
    agent_settings={"maxResumes": 3},
    launcher="torchrun",
    nproc=2,
    node={"rank": 1, "nnodes": 2},
    project="p",
    venv=True,
    needs_torch=True,
    go_when="arrived",
    notify="https://hooks.example/x",
    pass_job_dir=True,
    resume_args=("--init_from=resume",),
    resume_if="out/ckpt.pt",
    bucket={"name": "ckpt", "prefix": "team/l4/r_20260101_000000/"},
    bucket_data=({"folder": "data", "files": {"a.bin": {"generation": 7, "size": 3, "sha256": "ab" * 32}}},),
    path="/usr/bin:/bin",
    externally_managed=True,
    container=ContainerSpec(image="nvcr.io/nvidia/pytorch:24.05-py3", own_program=True, entrypoint=("python3",), args=("-m", "t")),
    pool="worker",
)


def test_every_field_is_set_in_the_full_example() -> None:
    """So the round trip below covers every field (a new field must be added to FULL)."""
    for f in fields(JobSpec):
        default = f.default_factory() if callable(f.default_factory) else f.default
        assert getattr(FULL, f.name) != default, f"give FULL a non-default {f.name}"


def test_the_spec_round_trips_through_json() -> None:
    doc = json.loads(json.dumps(FULL.to_json()))
    assert doc["version"] == CONTRACT_VERSION
    assert JobSpec.from_json(doc) == FULL
    assert JobSpec.from_json({"runId": "a", "base": "a"}) == JobSpec(run_id="a", base="a")
    assert "notify" not in JobSpec(run_id="a", base="a").to_json()  # a secret left unset is left out


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({"runId": "a"}, "no base"),
        ({"runId": "a", "base": "a", "version": CONTRACT_VERSION + 1}, "newer than this agent"),
        ({"runId": "a", "base": "a", "expectGpus": "two"}, "expectGpus is 'two', not an int"),
        ({"runId": "a", "base": "a", "expectGpus": 1.5}, "expectGpus is 1.5, not an int"),
        ({"runId": "a", "base": "a", "args": 5}, "args is 5, not a list of strings"),
        ({"runId": "a", "base": "a", "args": ["--lr", 3]}, "args is .* not a list of strings"),
        ({"runId": "a", "base": "a", "venv": "false"}, "venv is 'false', not a bool"),
        ({"runId": "a", "base": "a", "script": ["t.py"]}, r"script is \['t.py'\], not a str"),
        ({"runId": "a", "base": "a", "env": ["A=1"]}, "env is .*, not a dict"),
        ({"runId": "a", "base": None}, "no base"),
        (["runId"], "the job spec is list, not a JSON object"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_field(doc: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        JobSpec.from_json(doc)


@pytest.mark.parametrize(
    ("name", "wire"), [("run_id", "runId"), ("expect_gpus", "expectGpus"), ("pass_job_dir", "passJobDir"), ("env", "env")]
)
def test_wire_names(name: str, wire: str) -> None:
    assert wire_name(name) == wire


def spec_reads_in_the_agent() -> tuple[set[str], list[str]]:
    """(the attributes the agent reads from a spec: ``spec.X`` on a name called spec; the dict lookups
    on one: ``spec["X"]``, ``spec.get("X")``, as file:line)."""
    attributes: set[str] = set()
    lookups: list[str] = []
    for path in sorted((ROOT / "agent").glob("*.py")):
        if path.name == "serve.py":  # TensorBoard/Jupyter's own request, not a job spec
            continue
        for node in ast.walk(parse_source(path)):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "spec":
                if node.attr in ("get", "pop", "keys", "items", "setdefault"):
                    lookups.append(f"{path.name}:{node.lineno}")
                else:
                    attributes.add(node.attr)
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "spec":
                lookups.append(f"{path.name}:{node.lineno}")
    return attributes, lookups


def test_the_agent_reads_the_typed_spec_only() -> None:
    """The agent reads the JobSpec the contract decoded, by attribute: a field renamed in the contract
    (or misspelt in the agent) fails here, and so does a dict lookup on a spec (no rename would catch it)."""
    attributes, lookups = spec_reads_in_the_agent()
    assert not lookups, f"the agent looks a spec up as a dict (read it with store.read_spec): {lookups}"
    assert {"run_id", "python", "node", "bucket", "resume_args"} <= attributes, "the scan found too little: update it"
    known = {f.name for f in fields(JobSpec)} | {"to_json"}
    assert attributes <= known, f"the agent reads spec attributes JobSpec lacks: {sorted(attributes - known)}"


def test_what_the_laptop_writes_the_agent_reads() -> None:
    """One codec both ways: every key of the laptop's document is a field the agent decodes, and back."""
    doc = FULL.to_json()
    assert set(doc) == {"version"} | {wire_name(f.name) for f in fields(JobSpec)}
    assert JobSpec.from_json({**doc, "someNewerKey": 1}) == FULL  # a newer laptop's extra key does no harm
    kept = replace(FULL, notify=None, path=None).to_json()
    assert "notify" not in kept and "path" not in kept  # a secret (and the host's own PATH) left out while unset


def test_run_states_are_plain_words() -> None:
    assert [str(s) for s in RunState] == ["starting", "running", "succeeded", "failed", "stopped", "interrupted"]
    assert json.dumps({"state": RUNNING}) == '{"state": "running"}' and f"{FAILED:>7}" == " failed"
    assert "running" in ACTIVE and "failed" in TERMINAL and RunState("stopped") in TERMINAL
    assert not set(ACTIVE) & set(TERMINAL)


def test_the_agent_ships_the_contract_it_imports() -> None:
    import zipfile
    from io import BytesIO

    from agent import bundle

    shipped = zipfile.ZipFile(BytesIO(bundle.payload()))
    for name in bundle.CARRIED:
        assert shipped.read(f"gpu_train/{name}") == bundle.lean((ROOT / "gpu_train" / name).read_bytes()), name
    agent_imports = {
        n.module if n.module != "gpu_train" else f"gpu_train.{a.name}"
        for p in (ROOT / "agent").glob("*.py")
        if p.name != "bundle.py"
        for n in ast.walk(parse_source(p))
        if isinstance(n, ast.ImportFrom) and n.module and n.level == 0 and n.module.split(".")[0] == "gpu_train"
        for a in n.names
    }
    assert agent_imports <= {f"gpu_train.{name.removesuffix('.py')}" for name in bundle.CARRIED}, agent_imports
    assert "gpu_train.contract" in agent_imports


# google_crc32c: imported where a checksum is taken, in the upload's process (the job's Python, with Google's client)
BEYOND_STDLIB = {"checksum.py": {"google_crc32c"}}


@pytest.mark.parametrize("shipped", CARRIED)
def test_what_the_agent_carries_of_the_core_needs_python_3_8_and_the_standard_library_only(shipped: str) -> None:
    tree = parse_python((ROOT / "gpu_train" / shipped).read_text(), feature_version=(3, 8))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    import sys

    carried = {f"gpu_train.{name.removesuffix('.py')}" for name in CARRIED}  # beside it in the zipapp
    imported = {m if m in carried else m.split(".")[0] for m in imported} - carried
    assert imported <= set(sys.stdlib_module_names) | {"__future__"} | BEYOND_STDLIB.get(shipped, set()), imported
    at_load = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    assert not at_load & BEYOND_STDLIB.get(shipped, set()), "import it where it is used: the agent's other calls lack it"


# -- the agent's settings: checked where they arrive -----------------------------------------------
def test_settings_round_trip_and_default_once() -> None:
    tuned = AgentSettings(
        idle_stop_minutes=0.5,
        max_resumes=3,
        ssh_port=2222,
        poweroff_command=("true",),
        gcp=True,
        max_run_hours=2.5,
        shutdown_grace_s=25,
        metadata_url="http://127.0.0.1:1/",
        user="alice",
        remote_root="~/gpu-train",
    )
    assert AgentSettings.from_json(json.loads(json.dumps(tuned.to_json()))) == tuned
    assert AgentSettings.from_json({}) == AgentSettings()
    assert "user" not in AgentSettings().to_json()  # only a VM's root copy names whose root it serves


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({"maxResumes": "ten"}, "agent.json's maxResumes is 'ten', not an int"),
        ({"idleStopMinutes": "30"}, "agent.json's idleStopMinutes is '30', not a float"),
        ({"gcp": "yes"}, "agent.json's gcp is 'yes', not a bool"),
        ({"poweroffCommand": "systemctl poweroff"}, "agent.json's poweroffCommand is 'systemctl poweroff', not a list of strings"),
        ({"sshPort": True}, "agent.json's sshPort is True, not an int"),
    ],
)
def test_bad_settings_are_named(doc: dict, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        AgentSettings.from_json(doc, "agent.json")


def test_the_agent_refuses_bad_settings_where_they_arrive(tmp_path: Path) -> None:
    """A bad value from the laptop is refused before agent.json is written; a bad agent.json is named, no KeyError."""
    from agent import store

    root = str(tmp_path)
    assert store.write_settings(root, {"maxResumes": 3}).max_resumes == 3
    with pytest.raises(store.AgentError, match=r"agent.json's maxResumes is 'lots', not an int: .* setup"):
        store.write_settings(root, {"maxResumes": "lots"})
    assert store.settings(root).max_resumes == 3  # the file as it was
    (tmp_path / "agent.json").write_text(json.dumps({"sshPort": "22a"}))
    with pytest.raises(store.AgentError, match=r"agent.json's sshPort is '22a', not an int"):
        store.settings(root)
    assert store.write_settings(root, {"sshPort": 22}).ssh_port == 22  # the laptop's setup mends it


# -- a run's record on its host: state.json ---------------------------------------------------------
OLD_RECORDS = [  # state.json as agents before the contract wrote it (no version), and what it reads as
    (
        {"id": "r_20250101_000000", "base": "r", "state": "starting", "created": 1735689600.0, "resumes": 0},
        {"state": RunState.STARTING, "created": 1735689600.0, "returns": (), "preempted": False},
    ),
    (
        {
            "id": "r_20250101_000000",
            "base": "r",
            "state": "running",
            "created": 1735689600.5,
            "resumes": 0,
            "wrapperPid": 41,
            "wrapperStart": "8812",
            "pid": 42,
            "pidStart": "8813",
            "started": 1735689601.25,
            "ended": None,
            "exitCode": None,
        },
        {"state": RunState.RUNNING, "pid": 42, "pid_start": "8813", "wrapper_pid": 41, "exit_code": None},
    ),
    (
        {
            "id": "r_20250101_000000",
            "state": "failed",
            "exitCode": 1,
            "ended": 1735690000,
            "reason": "pip install failed",
            "stepPid": 50,
            "stepStart": "alive",
        },  # an int time, a start time no /proc could give
        {"state": RunState.FAILED, "exit_code": 1, "ended": 1735690000, "step_start": "alive", "base": None},
    ),
    (
        {"state": "interrupted", "interruptedAt": 1735690100.0, "preempted": True, "resumes": 2, "unit": "gpu-train-r.service"},
        {"state": RunState.INTERRUPTED, "interrupted_at": 1735690100.0, "preempted": True, "resumes": 2, "id": ""},
    ),
    (
        {
            "state": "starting",
            "resumes": 3,
            "preemptions": 2,
            "relaunched": 1735690200.0,
            "returns": [{"event": "PREEMPTED", "at": 1735690100.0, "back": 1735690190.0, "attempts": 1}],
            "someOldKey": 7,
        },
        {"preemptions": 2, "returns": ({"event": "PREEMPTED", "at": 1735690100.0, "back": 1735690190.0, "attempts": 1},)},
    ),
    ({}, {"state": RunState.STARTING, "resumes": 0}),  # a run whose state.json is not there yet
]


@pytest.mark.parametrize(("doc", "expected"), OLD_RECORDS)
def test_an_older_agents_record_reads(doc: dict, expected: dict) -> None:
    record = RunRecord.from_json(doc)
    assert {k: getattr(record, k) for k in expected} == expected
    again = RunRecord.from_json(json.loads(json.dumps(record.to_json())))
    assert again == record and again.to_json()["version"] == CONTRACT_VERSION


def test_every_key_an_agent_wrote_is_a_field() -> None:
    """Each key of the old records is read (or known to be dropped), so a renamed field fails here."""
    written = {k for doc, _ in OLD_RECORDS for k in doc} - {"someOldKey"}
    assert written <= {wire_name(f.name) for f in fields(RunRecord)}, written - {wire_name(f.name) for f in fields(RunRecord)}


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({"state": "paused"}, "state is 'paused', not one of starting, running, succeeded, failed, stopped, interrupted"),
        ({"pid": "42"}, "pid is '42', not an int"),
        ({"returns": {"event": "x"}}, "returns is {'event': 'x'}, not a tuple"),
        ({"version": CONTRACT_VERSION + 1}, "newer than this agent"),
    ],
)
def test_a_bad_record_is_named(doc: dict, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        RunRecord.from_json(doc, "runs/r/state.json")


def test_a_whole_number_stays_as_written() -> None:
    """`idle stop after 20 min`, not 20.0: a float field keeps an int as the stack wrote it."""
    conf = AgentSettings.from_json({"idleStopMinutes": 20, "shutdownGraceS": 25.5})
    assert (conf.to_json()["idleStopMinutes"], conf.shutdown_grace_s) == (20, 25.5)
    assert str(conf.idle_stop_minutes) == "20"


def test_the_agent_writes_only_fields_of_the_record() -> None:
    """update_state(run_dir, field=...) takes RunRecord's fields: a field renamed in the contract, or
    misspelt in the agent, fails here before any run does (mypy checks the reads, attributes)."""
    known = {f.name for f in fields(RunRecord)}
    written = {}
    for path in sorted((ROOT / "agent").glob("*.py")):
        for node in ast.walk(parse_source(path)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "update_state":
                written.update({k.arg: f"{path.name}:{node.lineno}" for k in node.keywords if k.arg})
    assert {"state", "exit_code", "interrupted_at", "wrapper_pid"} <= set(written), "the scan found too little"
    assert set(written) <= known, {k: v for k, v in written.items() if k not in known}
