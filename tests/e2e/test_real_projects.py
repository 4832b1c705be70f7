"""Real projects, unchanged (issue 27): a Hugging Face Trainer, a Lightning Trainer and a nanoGPT-style
configurator script (tests/real_projects/), trained through gpu-train on a real sshd with their own
arguments, hard-killed after a checkpoint, relaunched by the host's boot step with the README's
`--resume-args`/`--resume-if`, and checked by what the libraries themselves wrote: their logs, their
global step, their checkpoint files on the host. Then `fetch` must bring every output of the working
directory home byte for byte, and `down` must refuse while it cannot. This suite's loopback addresses
are 127.0.27.x."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT, Lab
from tests.unit.test_resilience import agent_cmd, reboot, state

LAB_ADDRESS = "127.0.27.1"
pytestmark = [pytest.mark.long, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def readme_recipe(style: str, own_args: str) -> list[str]:
    """`--args` (the README's, then the test's own sizes), `--resume-args` and `--resume-if` as the
    README's resume recipe gives them for ``style`` (in the comment above its command): the tests run
    what the README tells a user."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Resuming after a reboot") :]
    block = section[section.index("```sh\n") + 6 : section.index("```\n", section.index("```sh\n") + 6)]
    lines = block.replace("\\\n", " ").splitlines()
    command = next(lines[i + 1] for i, line in enumerate(lines) if line.startswith("#") and style in line)
    words = shlex.split(command)
    given = {word: words[i + 1] for i, word in enumerate(words) if word in ("--args", "--resume-args", "--resume-if")}
    assert "--resume-args" in given and "--resume-if" in given, f"README's recipe for {style}: {command}"
    return [
        "--args",
        " ".join(filter(None, (given.get("--args"), own_args))),
        "--resume-args",
        given["--resume-args"],
        "--resume-if",
        given["--resume-if"],
    ]


PROJECTS = Path(__file__).parents[1] / "real_projects"


def write_project(lab: Lab, name: str) -> set[str]:
    """The project as its author keeps it: a git repo (the lab's working directory, its project root);
    returns the paths of the files it holds."""
    shutil.copytree(PROJECTS / name, lab.cwd, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "init", "-q"], cwd=lab.cwd, check=True)
    return files_under(lab.cwd)


def files_under(top: Path) -> set[str]:
    """Relative paths of the regular files under ``top`` (symbolic links neither followed nor counted)."""
    found = set()
    for folder, _, names in os.walk(top):
        for name in names:
            path = Path(folder, name)
            if path.is_file() and not path.is_symlink():
                found.add(path.relative_to(top).as_posix())
    return found


def wait_for(what: str, ready: Callable[[], object], lab: Lab, run: str, timeout: float = 120) -> object:
    """``ready()`` once it is truthy; the run's log in the failure."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := ready():
            return got
        time.sleep(0.05)
    raise AssertionError(f"{run}: no {what} within {timeout:g} s; log:\n{lab.log(run)[-3000:]}")


def steps(pattern: str, text: str) -> list[int]:
    return [int(m) for m in re.findall(pattern, text, re.M)]


def relaunched_by_boot(lab: Lab, run: str, resumes: int, while_down: Callable[[], object] = lambda: None) -> tuple[int, object]:
    """Power cut (every process of the run's screen session SIGKILLed), ``while_down()`` (what the
    checkpoint says, read before the relaunch can write a newer one), then the host's boot step;
    returns where the log of the relaunch begins, and what ``while_down`` gave."""
    reboot(lab, run)
    seen = while_down()
    relaunch_starts = len(lab.log(run))
    actions = agent_cmd(lab, "boot")["actions"]
    assert [(a["runId"], a["action"], a["resumes"]) for a in actions] == [(run, "resumed", resumes)], actions
    return relaunch_starts, seen


def outputs_come_home(lab: Lab, run: str, sent: set[str], expected: set[str]) -> None:
    """`down` refuses while the outputs cannot come home (a file stands where they go on the laptop),
    leaving that file alone; `fetch` brings every file the job created under its working directory
    (all but what the project sent: its code and pushed data) to runs/lab/RUN/workdir/, byte for byte,
    and nothing else; then `down` goes ahead."""
    work = lab.remote / "runs" / run / "code"
    made = {rel for rel in files_under(work) - sent if "__pycache__" not in rel.split("/")}  # Python's caches are no result
    outputs = {rel: (work / rel).read_bytes() for rel in made}  # read from the host's own disk
    missing = {rel for rel in expected if rel not in outputs}
    assert not missing, f"the job did not write {missing}; it wrote {sorted(outputs)}"
    home = lab.cwd / "runs" / "lab" / run
    home.mkdir(parents=True, exist_ok=True)
    (home / "workdir").write_text("mine\n")
    refused = lab.fab("down")
    assert refused.returncode == 1 and run in refused.stderr, (refused.returncode, refused.stdout, refused.stderr)
    assert (home / "workdir").read_text() == "mine\n"
    (home / "workdir").unlink()
    lab.fab("fetch", "--run", run, check=True)
    local = home / "workdir"
    assert files_under(local) == set(outputs), sorted(files_under(local) ^ set(outputs))
    different = [rel for rel, data in outputs.items() if (local / rel).read_bytes() != data]
    assert not different, f"fetched but not byte-identical: {different}"
    assert "nothing to destroy" in lab.fab("down", check=True).stdout


def test_hugging_face_trainer_resumes_from_its_own_checkpoint(lab: Lab) -> None:
    """`resume_from_checkpoint=True` raises when output_dir holds no checkpoint: a relaunch before the
    first one must start fresh (--resume-if), one after it must continue from it."""
    sent = write_project(lab, "hf_trainer")
    run = lab.train("--script", "train.py", *readme_recipe("Hugging Face", "--max_steps 30 --save_steps 10 --step_sleep 0.4"))
    # Killed while importing transformers: nothing to resume from.
    wait_for("job start", lambda: state(lab, run).get("state") == "running", lab, run)
    time.sleep(0.5)
    assert not steps(r"^global step (\d+)/", lab.log(run)), "killed too late: it had started training"
    fresh, _ = relaunched_by_boot(lab, run, 1)
    wait_for("step 12", lambda: max(steps(r"^global step (\d+)/", lab.log(run)[fresh:]), default=0) >= 12, lab, run)
    output = lab.remote / "runs" / run / "code" / "output"
    assert steps(r"^global step (\d+)/", lab.log(run)[fresh:])[0] == 1  # started over, and did not fail
    cont, saved = relaunched_by_boot(
        lab, run, 2, lambda: max(json.loads(p.read_text())["global_step"] for p in output.glob("checkpoint-*/trainer_state.json"))
    )
    assert saved >= 10
    info = lab.wait(run, timeout=180)
    log = lab.log(run)
    assert info["state"] == "succeeded", log[-3000:]
    assert steps(r"^global step (\d+)/", log[cont:])[0] == saved + 1, log[cont:]  # the Trainer's own count
    assert "finished at global step 30" in log[cont:]
    outputs_come_home(
        lab,
        run,
        sent,
        {
            "output/model.safetensors",
            "output/config.json",
            f"output/checkpoint-{saved}/optimizer.pt",
            "output/checkpoint-30/trainer_state.json",
        },
    )


def test_lightning_trainer_resumes_from_last_ckpt(lab: Lab) -> None:
    sent = write_project(lab, "lightning_trainer")
    run = lab.train("--script", "train.py", *readme_recipe("Lightning", "--max_steps 30 --every_n_steps 10 --step_sleep 1.0"))
    wait_for("step 12", lambda: max(steps(r"^global_step=(\d+) ", lab.log(run)), default=-1) >= 12, lab, run)
    assert steps(r"^global_step=(\d+) ", lab.log(run))[0] == 0
    import torch

    last = lab.remote / "runs" / run / "code" / "checkpoints" / "last.ckpt"
    cont, saved = relaunched_by_boot(lab, run, 1, lambda: torch.load(last, map_location="cpu", weights_only=False)["global_step"])
    assert saved >= 10
    info = lab.wait(run, timeout=180)
    log = lab.log(run)
    assert info["state"] == "succeeded", log[-3000:]
    after = log[cont:]
    assert "Restored all states from the checkpoint at" in after and "last.ckpt" in after, after
    assert steps(r"^global_step=(\d+) ", after)[0] == saved  # Lightning's own count, restored
    assert "done at global_step=30" in after
    outputs_come_home(
        lab,
        run,
        sent,
        {
            "checkpoints/last.ckpt",
            f"checkpoints/epoch=0-step={saved}.ckpt",
            "checkpoints/epoch=0-step=30.ckpt",
            "lightning_logs/version_0/hparams.yaml",
            "lightning_logs/version_1/hparams.yaml",
        },
    )


def test_configurator_script_resumes_with_init_from_resume(lab: Lab) -> None:
    """nanoGPT's shape: `--job-dir` would kill its configurator; its data/shakespeare_char/ holds
    prepare.py in the code and the .bin files it made (gitignored) arrive with `push data`."""
    write_project(lab, "nanogpt")
    subprocess.run([sys.executable, "data/shakespeare_char/prepare.py"], cwd=lab.cwd, check=True, capture_output=True)
    sent = files_under(lab.cwd)
    lab.fab("push", "data", check=True)
    run = lab.train("--script", "train.py", *readme_recipe("nanoGPT", "--iter_sleep=0.2"))  # its out_dir: out/
    wait_for("iter 12", lambda: max(steps(r"^iter (\d+):", lab.log(run)), default=-1) >= 12, lab, run)
    assert "Initializing a new model from scratch" in lab.log(run) and steps(r"^iter (\d+):", lab.log(run))[0] == 0
    import torch

    ckpt = lab.remote / "runs" / run / "code" / "out" / "ckpt.pt"
    cont, saved = relaunched_by_boot(lab, run, 1, lambda: torch.load(ckpt, map_location="cpu")["iter_num"])
    assert saved >= 10
    refused = lab.fab("down")  # relaunched, running again
    assert refused.returncode == 1 and f"still running: {run}" in refused.stderr, refused.stderr
    info = lab.wait(run, timeout=180)
    log = lab.log(run)
    assert info["state"] == "succeeded", log[-3000:]
    after = log[cont:]
    assert "Resuming training from out\n" in after, after
    assert steps(r"^iter (\d+):", after)[0] == saved  # its own iter_num, from its own ckpt.pt
    assert steps(r"^iter (\d+):", after)[-1] == 60
    assert torch.load(ckpt, map_location="cpu")["iter_num"] == 60
    outputs_come_home(lab, run, sent, {"out/ckpt.pt"})
