"""Code copies: a warning when many files go as code, and `prune`, which frees finished runs' copies
while keeping everything each job wrote (fetched or not), the newest run of each name, and running
and interrupted runs."""

from __future__ import annotations

import pytest

from agent import prune
from remote.transfer import codesize
from tests.unit.test_project import sshd, started_run  # noqa: F401  (the fixture)

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


@pytest.mark.parametrize(
    ("files", "size", "folders", "words"),
    [
        (2999, 10 << 20, {"assets/": 2990}, None),
        (
            3001,
            10 << 20,
            {"assets/": 2990, "src/": 10, ".": 1},
            [
                "3,001 files, 10.0 MiB go as code (most in assets/ 2,990 files, src/ 10 files)",
                "a line `assets/` in .gputrainignore",
                "gpu-train prune",
            ],
        ),
        (12, 200 << 20, {".": 12}, ["12 files, 200.0 MiB go as code,", "a line `data/`"]),
    ],
)
def test_heavy_code_says_where_and_how(files, size, folders, words) -> None:
    said = codesize.heavy_code(files, size, folders, ".gputrainignore", "gpu-train")
    assert (said is None) == (words is None)
    for w in words or []:
        assert w in said, said


@pytest.mark.parametrize(
    ("state", "newest", "record", "why"),
    [
        ("succeeded", False, True, None),
        ("failed", False, True, None),
        ("stopped", False, True, None),
        ("running", False, True, "still going"),
        ("starting", False, True, "still going"),
        ("interrupted", False, True, "relaunches it from that code"),
        ("succeeded", True, True, "the newest run of its name"),
        ("succeeded", False, False, "launched before gpu-train recorded"),
    ],
)
def test_which_runs_keep_their_code(state, newest, record, why) -> None:
    said = prune.why_kept({"id": "r_1", "state": state}, record, {"r_1"} if newest else set())
    assert (said is None) if why is None else (why in said)
