"""`gpu-train sweep` on a real sshd: 6 trials over 4 declared slots of a host without GPUs, the queue on the
host (the 5th trial starts when one ends, never more than 4 at once, each in a slot of its own), a trial
power-cut mid-sweep and resumed by the host's boot step from its own checkpoint while the others go on, and
`sweep best` naming the trial whose logged metric is best. Loopback 127.0.41.2."""

from __future__ import annotations

import json
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import Lab
from tests.unit.test_resilience import agent_cmd, reboot, state

LAB_ADDRESS = "127.0.41.2"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TRIAL = textwrap.dedent(
    """
    import argparse, json, os, time

    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--bs", type=int, required=True)
    p.add_argument("--resume", action="store_true")
    a = p.parse_args()
    job = os.environ["JOB_DIR"]
    ckpt = os.path.join(job, "ckpt.json")
    start = json.load(open(ckpt))["step"] if a.resume and os.path.exists(ckpt) else 0
    seen = {"slot": os.environ.get("GPU_TRAIN_SLOT"), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "start": start, "began": time.time()}
    with open(os.path.join(job, "metrics.jsonl"), "a") as m:
        for step in range(start, 5):
            loss = (a.lr - 0.01) ** 2 * 1000 + 1.0 / (step + 1) + a.bs / 1000
            m.write(json.dumps({"step": step, "loss": loss}) + "\\n")
            m.flush()
            with open(ckpt + ".tmp", "w") as f:
                json.dump({"step": step + 1}, f)
            os.replace(ckpt + ".tmp", ckpt)
    with open(os.path.join(job, "seen.jsonl"), "a") as f:
        f.write(json.dumps(seen) + "\\n")
    while not os.path.exists(os.path.join(job, "release")):
        time.sleep(0.05)
    with open(os.path.join(job, "ended"), "w") as f:
        f.write(str(time.time()))
    """
)


def _runs(lab: Lab) -> list[str]:
    top = lab.remote / "runs"
    return sorted(p.name for p in top.iterdir() if p.name.startswith("grid_t")) if top.is_dir() else []


def _seen(lab: Lab, run: str) -> list[dict]:
    path = lab.remote / "runs" / run / "job" / "seen.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _started(lab: Lab, count: int) -> list[str] | None:
    """The sweep's runs once ``count`` of them exist and each has started its job."""
    runs = _runs(lab)
    return runs if len(runs) == count and all(_seen(lab, r) for r in runs) else None


def _wait(what: str, ready, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := ready():
            return got
        time.sleep(0.05)
    raise AssertionError(f"no {what} within {timeout:g} s")


def _release(lab: Lab, run: str) -> None:
    (lab.remote / "runs" / run / "job" / "release").write_text("")


def test_a_dry_run_on_a_host_without_gpus_says_its_plan_without_slots(lab: Lab) -> None:
    """`sweep --dry-run` without --slots on a host with no GPU refused ("say how many trials may run at once"),
    though it starts nothing; it now plans one trial at a time there and says what a start needs."""
    (lab.cwd / "train.py").write_text(TRIAL)
    grid = ("--script", "train.py", "--values", "lr=0.001,0.01,0.1", "--values", "bs=16,32")
    dry = lab.fab("sweep", *grid, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "6 trials, 1 slot(s) in 6 wave(s)" in dry.stdout and "train_t5_lr0p1_bs32" in dry.stdout
    assert "a node has no GPU" in dry.stderr and "--slots N" in dry.stderr and _runs(lab) == []
    planned = json.loads(lab.fab("sweep", *grid, "--dry-run", "--json", check=True).stdout)  # stdout stays the JSON
    assert planned["nodeSlots"] == [[[]]] and len(planned["trials"]) == 6
    refused = lab.fab("sweep", *grid)  # a start still needs the number
    assert refused.returncode != 0 and "--slots N" in refused.stderr and not (lab.remote / "runs").exists()


def test_six_trials_over_four_slots_survive_a_power_cut_and_name_the_best(lab: Lab) -> None:
    (lab.cwd / "train.py").write_text(TRIAL)
    subprocess.run(["git", "init", "-q"], cwd=lab.cwd, check=True)
    dry = lab.fab("sweep", "--script", "train.py", "--values", "lr=0.001,0.01,0.1", "--values", "bs=16,32", "--slots", "4", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "6 trials, 4 slot(s) in 2 wave(s)" in dry.stdout and _runs(lab) == []
    out = lab.fab(
        "sweep",
        *("--script", "train.py", "--name", "grid", "--slots", "4", "--resume-args", "--resume"),
        *("--values", "lr=0.001,0.01,0.1", "--values", "bs=16,32"),
        check=True,
    ).stdout
    assert "grid: 6 trials over 4 slot(s); started 4" in out, out
    first = _wait("4 trials at work", lambda: _started(lab, 4))
    assert sorted(_seen(lab, r)[0]["slot"] for r in first) == ["0", "1", "2", "3"]  # each its own slot
    assert all(_seen(lab, r)[0]["cuda"] is None for r in first)  # no GPU here: none to hide
    assert [r.split("_20")[0] for r in first] == [
        "grid_t0_lr0p001_bs16",
        "grid_t1_lr0p001_bs32",
        "grid_t2_lr0p01_bs16",
        "grid_t3_lr0p01_bs32",
    ]
    status = lab.fab("sweep", "status", "--sweep", "grid", "--metric", "loss", check=True).stdout
    assert status.count("pending") == 2 and status.count("running") == 4, status

    # A power cut of trial 1 (every process of it SIGKILLed): its slot stays its own until boot resumes it.
    cut = first[1]
    reboot(lab, cut)
    _release(lab, first[0])
    fifth = _wait("the 5th trial", lambda: next((r for r in _runs(lab) if r not in first and _seen(lab, r)), None))
    assert _seen(lab, fifth)[0]["slot"] == _seen(lab, first[0])[0]["slot"]  # the slot that freed, not the cut one's
    assert len(_runs(lab)) == 5  # the cut trial still holds slot 1: no 6th
    actions = agent_cmd(lab, "boot")["actions"]
    assert [(a["runId"], a["action"]) for a in actions] == [(cut, "resumed")]
    resumed = _wait("the resumed trial", lambda: len(_seen(lab, cut)) == 2 and _seen(lab, cut))
    assert resumed[1]["start"] == 5 and resumed[1]["slot"] == resumed[0]["slot"]  # from its checkpoint, in its slot
    for r in _runs(lab):
        _release(lab, r)
    sixth = _wait("the 6th trial", lambda: _started(lab, 6))
    for r in sixth:
        _release(lab, r)
    for r in sixth:
        _wait(f"{r} to end", lambda r=r: state(lab, r).get("state") == "succeeded")

    # Never more than 4 at once: each trial's time between its start and its end.
    spans = sorted((s["began"], float((lab.remote / "runs" / r / "job" / "ended").read_text())) for r in sixth for s in _seen(lab, r)[-1:])
    assert max(sum(1 for b, e in spans if b <= t < e) for t, _ in spans) <= 4

    best = json.loads(lab.fab("sweep", "best", "--sweep", "grid", "--metric", "loss", "--mode", "min", "--json", check=True).stdout)
    logged = {
        r: min(json.loads(line)["loss"] for line in Path(lab.remote / "runs" / r / "job" / "metrics.jsonl").read_text().splitlines())
        for r in sixth
    }
    assert best["runId"] == min(logged, key=logged.__getitem__) and best["runId"].startswith("grid_t2_lr0p01_bs16")
    assert best["best"] == pytest.approx(logged[best["runId"]]) and best["values"] == {"lr": 0.01, "bs": 16}
    worst = json.loads(lab.fab("sweep", "best", "--sweep", "grid", "--metric", "loss", "--mode", "max", "--json", check=True).stdout)
    assert worst["runId"].startswith("grid_t") and worst["best"] == pytest.approx(max(max_loss(lab, r) for r in sixth))

    lab.fab("fetch", "--sweep", "grid", check=True, timeout=300)
    for r in sixth:  # every trial's JOB_DIR home, byte for byte
        home = lab.cwd / "runs" / "lab" / r / "metrics.jsonl"
        assert home.read_bytes() == (lab.remote / "runs" / r / "job" / "metrics.jsonl").read_bytes()


def test_your_own_sweep_agent_one_worker_per_slot_stopped_as_a_sweep(lab: Lab) -> None:
    """--workers: N copies of the user's own agent (here a loop that would run forever), each in a slot."""
    (lab.cwd / "worker.py").write_text(
        "import json, os, time\n"
        "open(os.path.join(os.environ['JOB_DIR'], 'slot'), 'w').write(os.environ['GPU_TRAIN_SLOT'])\n"
        "while True:\n    time.sleep(0.1)\n"
    )
    subprocess.run(["git", "init", "-q"], cwd=lab.cwd, check=True)
    out = lab.fab("sweep", "--workers", "3", "--slots", "2", "--command", "python3 worker.py", "--name", "byo", check=True).stdout
    assert "byo: 3 trials over 2 slot(s); started 2" in out, out
    slots = _wait("2 workers", lambda: (p := list((lab.remote / "runs").glob("byo_w*/job/slot"))) and len(p) == 2 and p)
    assert sorted(p.read_text() for p in slots) == ["0", "1"]
    stopped = json.loads(lab.fab("stop", "--sweep", "byo", "--json", "--grace", "2", check=True).stdout)
    assert len(stopped["stopped"]) == 2
    status = lab.fab("sweep", "status", "--sweep", "byo", check=True).stdout
    assert status.count("stopped") == 3, status  # the third never starts
    assert agent_cmd(lab, "sweep-advance")["started"] == []


def max_loss(lab: Lab, run: str) -> float:
    return max(json.loads(line)["loss"] for line in (lab.remote / "runs" / run / "job" / "metrics.jsonl").read_text().splitlines())


QUICK = textwrap.dedent(
    """
    import argparse, json, os, time

    p = argparse.ArgumentParser()
    p.add_argument("--x", type=float, required=True)
    a = p.parse_args()
    job = os.environ["JOB_DIR"]
    began = time.time()
    with open(os.path.join(job, "metrics.jsonl"), "w") as m:
        for step in range(3):
            m.write(json.dumps({"step": step, "score": a.x * (step + 1)}) + "\\n")
    time.sleep(0.5)  # long enough for trials of one node to overlap when the queue lets them
    with open(os.path.join(job, "span.json"), "w") as f:
        json.dump({"slot": os.environ["GPU_TRAIN_SLOT"], "began": began, "ended": time.time()}, f)
    """
)


@pytest.fixture
def duo(tmp_path: Path):
    """Two loopback hosts as a two-node SSH stack `duo` (node 0 reaches node 1 with the lab's key)."""
    from remote.loopback import Sshd
    from tests.conftest import cluster_stack

    a = Sshd(tmp_path / "a", "127.0.41.3").start()
    b = Sshd(tmp_path / "b", "127.0.41.4", client_key=a.client_key).start()
    cluster_stack(tmp_path / "stacks", "duo", [a.spec, b.spec], a.client_key)
    yield tmp_path
    a.stop()
    b.stop()
    subprocess.run(["pkill", "-f", str(tmp_path)], check=False)


def test_a_two_node_cluster_runs_its_share_of_trials_on_each_node(duo: Path) -> None:
    from tests.conftest import fab_env, run_fab

    tmp_path = duo
    roots = [tmp_path / "node0", tmp_path / "node1"]
    cwd = tmp_path / "work"
    cwd.mkdir()
    (cwd / "train.py").write_text(QUICK)
    subprocess.run(["git", "init", "-q"], cwd=cwd, check=True)
    env = fab_env(tmp_path / "stacks", tmp_path / "home", "duo", cwd)
    out = run_fab(
        env, cwd, "sweep", "--script", "train.py", "--name", "duo", "--slots", "2", "--values", "x=1,2,3,4,5,6", check=True, timeout=300
    )
    assert "duo: 6 trials over 4 slot(s); started 4" in out.stdout, out.stdout

    def ended(node: int) -> list[Path]:
        return sorted((roots[node] / "runs").glob("duo_t*/job/span.json")) if (roots[node] / "runs").is_dir() else []

    _wait("every trial's end", lambda: len(ended(0)) == 3 and len(ended(1)) == 3, timeout=180)
    names = [sorted(p.parts[-3].split("_20")[0] for p in ended(n)) for n in (0, 1)]
    assert names == [["duo_t0_x1", "duo_t2_x3", "duo_t4_x5"], ["duo_t1_x2", "duo_t3_x4", "duo_t5_x6"]]  # spread by slots
    for n in (0, 1):
        spans = [json.loads(p.read_text()) for p in ended(n)]
        assert max(sum(1 for s in spans if s["began"] <= t["began"] < s["ended"]) for t in spans) <= 2
    rows = json.loads(run_fab(env, cwd, "sweep", "status", "--sweep", "duo", "--metric", "score", "--json", check=True).stdout)["trials"]
    assert [(r["index"], r["node"]) for r in rows] == [(i, i % 2) for i in range(6)]
    _wait(
        "every trial recorded",
        lambda: all(
            r["state"] == "succeeded"
            for r in json.loads(run_fab(env, cwd, "sweep", "status", "--sweep", "duo", "--json", check=True).stdout)["trials"]
        ),
        timeout=60,
    )
    best = json.loads(
        run_fab(env, cwd, "sweep", "best", "--sweep", "duo", "--metric", "score", "--mode", "max", "--json", check=True).stdout
    )
    assert best["runId"].startswith("duo_t5_x6") and best["best"] == 18.0 and best["node"] == 1
    run_fab(env, cwd, "fetch", "--sweep", "duo", check=True, timeout=300)
    assert len(list((cwd / "runs" / "duo").glob("duo_t*/metrics.jsonl"))) == 6  # from both nodes


@pytest.mark.long
def test_a_hugging_face_examples_script_swept_over_its_learning_rate(lab: Lab) -> None:
    """An unchanged script in the HF examples' shape (every flag TrainingArguments' own), its Trainer writing
    TensorBoard event files: `sweep best` agrees with what TensorBoard itself reads from each trial's files."""
    from tests.e2e.test_real_projects import write_project
    from tests.unit.test_tfevents import _oracle

    write_project(lab, "hf_args")
    fixed = "--output_dir out --report_to tensorboard --max_steps 12 --logging_steps 4 --save_strategy no --use_cpu --disable_tqdm true"
    lab.fab(
        "sweep",
        "--script",
        "train.py",
        "--name",
        "hf",
        "--slots",
        "3",
        "--args",
        fixed,
        "--values",
        "learning_rate=1e-4,3e-3,3e-2",
        check=True,
    )
    _wait("three trials", lambda: len(list((lab.remote / "runs").glob("hf_t*"))) == 3)
    for run in sorted(p.name for p in (lab.remote / "runs").glob("hf_t*")):
        info = lab.wait(run, timeout=400)
        assert info["state"] == "succeeded", lab.log(run)[-3000:]
    truth = {}
    for folder in (lab.remote / "runs").glob("hf_t*"):
        seen: dict[str, list] = {}
        for path in sorted(folder.glob("code/out/runs/*/events.out.tfevents.*")):
            for tag, points in _oracle(str(path)).items():
                seen.setdefault(tag, []).extend(points)
        truth[folder.name] = seen
    rows = json.loads(lab.fab("sweep", "status", "--sweep", "hf", "--metric", "train/loss", "--json", check=True).stdout)["trials"]
    for r in rows:
        points = truth[r["runId"]]["train/loss"]
        assert [s for s, _ in points] == [4, 8, 12]
        assert r["last"] == pytest.approx(points[-1][1]) and r["best"] == pytest.approx(min(v for _, v in points))
    best = json.loads(lab.fab("sweep", "best", "--sweep", "hf", "--metric", "eval/loss", "--json", check=True).stdout)
    evals = {run: tags["eval/loss"][-1][1] for run, tags in truth.items()}
    assert best["runId"] == min(evals, key=evals.__getitem__) and best["best"] == pytest.approx(min(evals.values()))
    printed = lab.fab("sweep", "best", "--sweep", "hf", "--metric", "eval_loss", "--mode", "min")  # as the Trainer prints it
    assert printed.returncode == 1 and "they logged eval/loss, " in printed.stderr, printed.stderr
    assert printed.stderr.rstrip().endswith("did you mean --metric eval/loss?"), printed.stderr


LIGHTNING_CSV_TRIAL = textwrap.dedent(
    """
    import argparse

    import lightning as L
    import torch
    from lightning.pytorch.loggers import CSVLogger
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset


    class Regressor(L.LightningModule):
        def __init__(self, lr):
            super().__init__()
            self.lr = lr
            self.net = nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            loss = nn.functional.mse_loss(self.net(batch[0]), batch[1])
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", nn.functional.mse_loss(self.net(batch[0]), batch[1]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)


    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, required=True)
    a = p.parse_args()
    L.seed_everything(0)
    x = torch.randn(512, 8)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    trainer = L.Trainer(max_steps=12, val_check_interval=6, limit_val_batches=2, log_every_n_steps=3, accelerator="cpu",
                        logger=CSVLogger("."), enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(Regressor(a.lr), DataLoader(data, batch_size=16), DataLoader(data, batch_size=16))
    """
)


@pytest.mark.long
def test_lightning_csvlogger_trials_judged_and_drawn_from_their_metrics_csv(lab: Lab) -> None:
    """Lightning's CSVLogger (its default where TensorBoard is not installed) writes
    lightning_logs/version_0/metrics.csv, a blank cell where a metric was not logged that step: `sweep status`
    and `sweep best` judge the trials by it, and the dashboard's `scalars` draws it, as csv.DictReader reads it."""
    import csv

    from gpu_train.environment import Environment
    from remote.tasks.scalars import fetch_scalars
    from remote.tasks.session import Session

    (lab.cwd / "trial.py").write_text(LIGHTNING_CSV_TRIAL)
    subprocess.run(["git", "init", "-q"], cwd=lab.cwd, check=True)
    lab.fab("sweep", "--script", "trial.py", "--name", "pl", "--slots", "2", "--values", "lr=0.001,0.05", check=True)
    _wait("two trials", lambda: len(list((lab.remote / "runs").glob("pl_t*"))) == 2)
    truth: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for folder in sorted((lab.remote / "runs").glob("pl_t*")):
        info = lab.wait(folder.name, timeout=300)
        assert info["state"] == "succeeded", lab.log(folder.name)[-3000:]
        with open(folder / "code" / "lightning_logs" / "version_0" / "metrics.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert any(r["val_loss"] == "" for r in rows) and any(r["train_loss"] == "" for r in rows)  # blanks, as Lightning writes
        truth[folder.name] = {tag: [(int(r["step"]), float(r[tag])) for r in rows if r[tag] != ""] for tag in ("train_loss", "val_loss")}
    assert all([s for s, _ in t["val_loss"]] == [5, 11] for t in truth.values()), truth
    status = json.loads(lab.fab("sweep", "status", "--sweep", "pl", "--metric", "train_loss", "--json", check=True).stdout)
    for r in status["trials"]:
        points = truth[r["runId"]]["train_loss"]
        assert r["last"] == pytest.approx(points[-1][1]) and r["best"] == pytest.approx(min(v for _, v in points))
    best = json.loads(lab.fab("sweep", "best", "--sweep", "pl", "--metric", "val_loss", "--json", check=True).stdout)
    finals = {run: tags["val_loss"][-1][1] for run, tags in truth.items()}
    lowest = {run: min(v for _, v in tags["val_loss"]) for run, tags in truth.items()}
    assert best["runId"] == min(lowest, key=lowest.__getitem__) and best["best"] == pytest.approx(min(lowest.values()))
    assert len(set(finals.values())) == 2  # the two learning rates end apart: the choice is not a tie
    session = Session(Environment.from_os(lab.env), "lab")
    doc = fetch_scalars(session, sorted(truth), tags=["val_loss", "train_loss"])
    session.close()
    for got in doc.runs:
        drawn = {(s["source"], s["kind"], s["tag"]): s["points"] for s in got["series"]}
        source = "code/lightning_logs/version_0/metrics.csv"
        assert drawn == {(source, "csv", tag): [[s, pytest.approx(v)] for s, v in pts] for tag, pts in truth[got["id"]].items()}
    assert doc.problems == ()
