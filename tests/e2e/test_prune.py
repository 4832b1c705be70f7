"""The e2e tier of tests/unit/test_prune.py (the same subject; its helpers are there)."""

from __future__ import annotations

import sys
from pathlib import Path

from remote.transfer import codesize
from tests.unit.test_project import (
    sshd,  # noqa: F401 (a fixture)
    started_run,
)
from tests.unit.test_stack_select import OurProject


def test_prune_frees_code_keeps_outputs_and_finished_runs_only(tmp_path: Path, sshd) -> None:
    proj = OurProject(tmp_path)
    server = sshd("127.0.14.13")
    proj.stack(
        "lab",
        f"  gpu-train:hosts: ['{server.spec}']\n  gpu-train:sshKey: {server.client_key}\n"
        f"  gpu-train:python: {sys.executable}\n  gpu-train:venv: false\n",
    )
    assets = proj.dir / "assets"
    assets.mkdir()
    for i in range(codesize.MANY_FILES + 1):
        (assets / f"{i}.txt").write_text(str(i))
    job = "mkdir -p out && echo ckpt > out/ckpt.pt && echo '# tuned' >> hello.py"  # an output, and a code file changed
    first = proj.run("train", "--name", "job", "--command", job, "--follow", check=True)
    old = started_run(first)
    assert "warning: 3,007 files, " in first.stderr, first.stderr
    assert "most in assets/ 3,001 files" in first.stderr and "a line `assets/` in .gputrainignore" in first.stderr
    (proj.dir / ".gputrainignore").write_text("assets/\n")
    second = proj.run("train", "--name", "job", "--command", job, "--follow", check=True)
    newest = started_run(second)
    assert "go as code" not in second.stderr
    running = started_run(proj.run("train", "--name", "busy", "--command", "sleep 60", check=True))

    runs = server.dir / "home" / ".gpu-train" / "runs"
    dry = proj.run("prune", "--dry-run", check=True)
    assert "would remove the code of 1 run(s)" in dry.stdout and (runs / old / "code" / "assets" / "0.txt").is_file()
    done = proj.run("prune", check=True)
    assert f"  {old}\n" in done.stdout and "removed the code of 1 run(s)" in done.stdout, done.stdout
    assert f"kept {newest}: the newest run of its name" in done.stdout and f"kept {running}: running" in done.stdout
    code = runs / old / "code"
    assert not (code / "assets").exists() and not (code / "crash.py").exists()  # the code as sent: gone
    assert (code / "out" / "ckpt.pt").read_text() == "ckpt\n"  # what the job wrote: kept
    assert (code / "hello.py").read_text().endswith("# tuned\n")  # a code file the job changed: its output
    assert (runs / newest / "code" / "crash.py").is_file() and (runs / running / "code" / "crash.py").is_file()
    assert "removed the code of 0 run(s)" in proj.run("prune", check=True).stdout  # once

    proj.run("fetch", "--run", old, check=True)  # the outputs still come home
    assert (proj.dir / "runs" / "lab" / old / "workdir" / "out" / "ckpt.pt").read_text() == "ckpt\n"
    resumed = proj.run("resume", "--run", old)
    assert resumed.returncode != 0 and "was pruned" in resumed.stderr + resumed.stdout
    proj.run("stop", "--run", running, check=True)
