"""Several nodes: a real two-node torchrun (gloo) on two sshds (127.0.0.2 and 127.0.0.3), and the
pure decisions behind clusters: launch command lines, TF_CONFIG, one state for many nodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent import wrap
from gpu_train import jobs
from gpu_train.contract import JobSpec

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# -- pure decisions ---------------------------------------------------------------------------
NODE = {
    "rank": 1,
    "nnodes": 3,
    "masterAddr": "10.0.0.2",
    "masterPort": 29500,
    "hosts": ["10.0.0.2", "10.0.0.3", "10.0.0.4"],
    "tfPort": 2222,
    "ps": 0,
}


@pytest.mark.parametrize(
    ("spec", "extra", "argv"),
    [
        ({"script": "t.py", "args": ["--lr", "1"]}, [], ["py", "-u", "t.py", "--lr", "1"]),  # no flag it did not ask for
        ({"script": "t.py", "args": ["--lr", "1"], "passJobDir": True}, [], ["py", "-u", "t.py", "--lr", "1", "--job-dir", "/j"]),
        (
            {"script": "t.py", "args": ["--lr", "1"], "passJobDir": True},
            ["--init_from=resume"],
            ["py", "-u", "t.py", "--lr", "1", "--job-dir", "/j", "--init_from=resume"],
        ),
        (
            {"script": "t.py", "launcher": "torchrun", "node": {"nnodes": 1}},
            [],
            ["py", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4", "t.py"],
        ),
        (
            {"script": "t.py", "launcher": "torchrun", "node": NODE, "passJobDir": True},
            ["--resume"],
            [
                "py",
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "3",
                "--node_rank",
                "1",
                "--nproc_per_node",
                "4",
                "--master_addr",
                "10.0.0.2",
                "--master_port",
                "29500",
                "t.py",
                "--job-dir",
                "/j",
                "--resume",
            ],
        ),
        ({"command": "make train"}, [], ["bash", "-c", "make train"]),
        ({"command": "python t.py"}, ["--ckpt", "last one"], ["bash", "-c", "python t.py --ckpt 'last one'"]),
    ],
)
def test_job_argv(spec: dict, extra: list[str], argv: list[str]) -> None:
    assert wrap.job_argv(JobSpec.from_json({"runId": "r", "base": "r", **spec}), "py", "/j", 4, extra) == argv


@pytest.mark.parametrize(
    ("spec", "resumes", "files", "extra", "said"),
    [
        ({"resumeArgs": ["--init_from=resume"]}, 0, [], [], None),  # the first start: the original arguments
        ({"resumeArgs": ["--init_from=resume"]}, 1, [], ["--init_from=resume"], "resume arguments added"),
        ({}, 3, [], [], None),
        ({"resumeArgs": ["-r"], "resumeIf": "out/ckpt.pt"}, 1, [], [], "out/ckpt.pt not there yet: starting fresh"),
        ({"resumeArgs": ["-r"], "resumeIf": "out/ckpt.pt"}, 2, ["out/ckpt.pt"], ["-r"], "out/ckpt.pt exists"),
        ({"resumeArgs": ["-r"], "resumeIf": "ckpts/*.ckpt"}, 1, ["ckpts/last.txt"], [], "not there yet"),
        ({"resumeArgs": ["-r"], "resumeIf": "ckpts/*.ckpt"}, 1, ["ckpts/epoch=1.ckpt"], ["-r"], "exists"),
        ({"resumeArgs": ["-r"], "resumeIf": "**/checkpoint-*"}, 1, ["out/checkpoint-500/model.bin"], ["-r"], "exists"),
    ],
)
def test_resume_args(tmp_path: Path, spec: dict, resumes: int, files: list[str], extra: list[str], said: str | None) -> None:
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    got, note = wrap.resume_args(JobSpec.from_json({"runId": "r", "base": "r", **spec}), resumes, str(tmp_path), str(tmp_path / "job"))
    assert got == extra
    assert (note is None) if said is None else (said in note)


@pytest.mark.parametrize("resume_if", ["$JOB_DIR/ckpt.pt", "${JOB_DIR}/ckpt.pt", "$JOB_DIR/ckpt*"])
def test_resume_if_in_job_dir(tmp_path: Path, resume_if: str) -> None:
    """A job checkpointing in JOB_DIR, as the docs tell it to, resumed with `--resume-if '$JOB_DIR/ckpt.pt'`: the
    path was looked for in the working directory, literally, and the relaunch started fresh, its progress lost."""
    workdir, job_dir = tmp_path / "code", tmp_path / "job"
    workdir.mkdir()
    job_dir.mkdir()
    spec = JobSpec.from_json({"runId": "r", "base": "r", "resumeArgs": ["--resume"], "resumeIf": resume_if})
    assert wrap.resume_args(spec, 1, str(workdir), str(job_dir)) == (
        [],
        f"{resume_if} not there yet: starting fresh, without the resume arguments",
    )
    (workdir / "ckpt.pt").write_text("x")  # the working directory's is not JOB_DIR's
    assert wrap.resume_args(spec, 1, str(workdir), str(job_dir))[0] == []
    (job_dir / "ckpt.pt").write_text("x")
    assert wrap.resume_args(spec, 1, str(workdir), str(job_dir)) == (["--resume"], f"{resume_if} exists: resume arguments added: --resume")


@pytest.mark.parametrize(
    ("rank", "ps", "task", "cluster"),
    [
        (0, 0, {"type": "chief", "index": 0}, {"chief": ["10.0.0.2:2222"], "worker": ["10.0.0.3:2222", "10.0.0.4:2222"]}),
        (2, 0, {"type": "worker", "index": 1}, {"chief": ["10.0.0.2:2222"], "worker": ["10.0.0.3:2222", "10.0.0.4:2222"]}),
        (1, 1, {"type": "worker", "index": 0}, {"chief": ["10.0.0.2:2222"], "worker": ["10.0.0.3:2222"], "ps": ["10.0.0.4:2222"]}),
        (2, 1, {"type": "ps", "index": 0}, {"chief": ["10.0.0.2:2222"], "worker": ["10.0.0.3:2222"], "ps": ["10.0.0.4:2222"]}),
        (2, 2, {"type": "ps", "index": 1}, {"chief": ["10.0.0.2:2222"], "ps": ["10.0.0.3:2222", "10.0.0.4:2222"]}),
    ],
)
def test_cluster_env(rank: int, ps: int, task: dict, cluster: dict) -> None:
    env = wrap.cluster_env({**NODE, "rank": rank, "ps": ps}, 2)
    assert json.loads(env["TF_CONFIG"]) == {"cluster": cluster, "task": task}
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["NODE_RANK"], env["NNODES"]) == ("10.0.0.2", "29500", str(rank), "3")
    assert (env["NPROC_PER_NODE"], env["WORLD_SIZE"]) == ("2", "6")


@pytest.mark.parametrize(
    ("option", "nodes", "script", "chosen"),
    [
        (None, 2, "t.py", "torchrun"),
        (None, 1, "t.py", "none"),
        (None, 2, None, "none"),
        ("torchrun", 1, "t.py", "torchrun"),
        ("none", 4, "t.py", "none"),
    ],
)
def test_choose_launcher(option, nodes, script, chosen) -> None:
    assert jobs.choose_launcher(option, nodes, script) == chosen


@pytest.mark.parametrize(("option", "script", "words"), [("mpirun", "t.py", "use torchrun or none"), ("torchrun", None, "runs a --script")])
def test_choose_launcher_rejects(option, script, words) -> None:
    with pytest.raises(jobs.JobError, match=words):
        jobs.choose_launcher(option, 2, script)


def test_node_specs() -> None:
    spec = jobs.JobSpec(run_id="r_1", base="r", script="t.py", launcher="torchrun")
    specs = jobs.node_specs(spec, ["a", "b"], "10.0.0.2", 29500, 0)
    assert [s.node["rank"] for s in specs] == [0, 1] and {s.node["masterAddr"] for s in specs} == {"10.0.0.2"}
    assert jobs.node_specs(jobs.JobSpec(run_id="r", base="r"), ["a"], "a", 1, 0)[0].node is None
    with pytest.raises(jobs.JobError, match="--ps 2"):
        jobs.node_specs(spec, ["a", "b"], "a", 1, 2)


def run(state: str, code: int | None = None) -> dict:
    return {"state": state, "exitCode": code}


@pytest.mark.parametrize(
    ("per_node", "expected"),
    [
        ([run("succeeded", 0), run("succeeded", 0)], ("succeeded", 0, "")),
        ([run("running"), run("succeeded", 0)], ("running", None, "node 1 succeeded")),
        ([run("running"), run("failed", 3)], ("failed", 3, "node 1 failed (exit 3)")),
        ([run("failed", 1), run("failed", 2)], ("failed", 1, "node 0 failed (exit 1); node 1 failed (exit 2)")),
        ([run("stopped", -2), run("stopped", -15)], ("stopped", None, "")),
        ([run("running"), None], ("failed", None, "node 1: no such run")),
        ([run("interrupted"), run("running")], ("interrupted", None, "node 0 interrupted")),
    ],
)
def test_aggregate_state(per_node: list, expected: tuple) -> None:
    assert jobs.aggregate_state(per_node) == expected
