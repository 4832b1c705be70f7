"""Code copies: a warning when many files go as code, and `prune`, which frees finished runs' copies
while keeping everything each job wrote (fetched or not), the newest run of each name, and running
and interrupted runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from remote.agent import prune
from remote.transfer import codesize
from tests.test_project import sshd, started_run  # noqa: F401  (the fixture)
from tests.test_stack_select import OurProject

LISTING = """drwxr-xr-x          4,096 2025/01/01 00:00:00 .
-rw-r--r--            120 2025/01/01 00:00:00 train.py
drwxr-xr-x          4,096 2025/01/01 00:00:00 assets
-rw-r--r--             10 2025/01/01 00:00:00 assets/a.png
-rw-r--r--             10 2025/01/01 00:00:00 assets/sub/b.png
-rw-r--r--             10 2025/01/01 00:00:00 my dir/c d.txt
lrwxrwxrwx              9 2025/01/01 00:00:00 link -> train.py
"""


def test_files_are_counted_by_top_folder() -> None:
    assert codesize.folder_counts(LISTING) == {".": 1, "assets/": 2, "my dir/": 1}


@pytest.mark.parametrize(("files", "size", "folders", "words"), [
    (2999, 10 << 20, {"assets/": 2990}, None),
    (3001, 10 << 20, {"assets/": 2990, "src/": 10, ".": 1}, ["3,001 files, 10.0 MiB go as code (most in assets/ 2,990 files, "
                                                              "src/ 10 files)", "a line `assets/` in .gputrainignore",
                                                              "gpu-train prune"]),
    (12, 200 << 20, {".": 12}, ["12 files, 200.0 MiB go as code,", "a line `data/`"]),
])
def test_heavy_code_says_where_and_how(files, size, folders, words) -> None:
    said = codesize.heavy_code(files, size, folders, ".gputrainignore", "gpu-train")
    assert (said is None) == (words is None)
    for w in words or []:
        assert w in said, said


@pytest.mark.parametrize(("state", "newest", "record", "why"), [
    ("succeeded", False, True, None), ("failed", False, True, None), ("stopped", False, True, None),
    ("running", False, True, "still going"), ("starting", False, True, "still going"),
    ("interrupted", False, True, "relaunches it from that code"),
    ("succeeded", True, True, "the newest run of its name"),
    ("succeeded", False, False, "launched before gpu-train recorded"),
])
def test_which_runs_keep_their_code(state, newest, record, why) -> None:
    said = prune.why_kept({"id": "r_1", "state": state}, record, {"r_1"} if newest else set())
    assert (said is None) if why is None else (why in said)


def test_prune_frees_code_keeps_outputs_and_finished_runs_only(tmp_path: Path, sshd) -> None:  # noqa: F811
    proj = OurProject(tmp_path)
    server = sshd("127.0.14.13")
    proj.stack("lab", f"  gpu-train:hosts: ['{server.spec}']\n  gpu-train:sshKey: {server.client_key}\n"
                      f"  gpu-train:python: {sys.executable}\n  gpu-train:venv: false\n")
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
