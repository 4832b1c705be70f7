"""The dashboard's page as data (gpu_train/views/board.py), as tables: costs shared among the runs beside
each other, what is home, the warnings, a sweep's best trial, a cluster's nodes, another project's runs."""

from __future__ import annotations

import pytest

from gpu_train.views import board

H = 3600.0


@pytest.mark.parametrize(
    ("spans", "hours"),
    [
        ({"a": (0, H)}, {"a": 1.0}),
        ({"a": (0, H), "b": (0, H)}, {"a": 0.5, "b": 0.5}),  # two trials side by side: half the VM each
        ({"a": (0, 2 * H), "b": (H, 2 * H)}, {"a": 1.5, "b": 0.5}),
        ({"a": (0, H), "b": (2 * H, 3 * H)}, {"a": 1.0, "b": 1.0}),  # one after the other: the whole VM each
        ({}, {}),
    ],
)
def test_a_runs_hours_are_shared_with_the_runs_beside_it(spans: dict, hours: dict) -> None:
    assert board.shares(spans) == pytest.approx(hours)


@pytest.mark.parametrize(
    ("run", "span"),
    [
        ({"state": "running", "durationS": 600, "ended": None}, (1000 - 600, 1000)),
        ({"state": "succeeded", "durationS": 60, "ended": 500}, (440, 500)),
        ({"state": "interrupted", "durationS": 60, "ended": 500}, (440, 500)),
        ({"state": "starting", "durationS": None}, None),
    ],
)
def test_run_span(run: dict, span) -> None:
    assert board.run_span(run, 1000) == span


@pytest.mark.parametrize(
    ("run", "sweep"),
    [
        ({"id": "lr_t1_lr0p1_20261128_101010", "sweep": "lr"}, "lr"),
        ({"id": "lr_t1_lr0p1_20261128_101010"}, None),  # a name alone makes no trial
        ({"id": "train_20261128_101010", "sweep": None}, None),
    ],
)
def test_sweep_of(run: dict, sweep) -> None:
    assert board.sweep_of(run) == sweep


FILES = {"files": 2, "bytes": 10, "newestNs": 1}


NONE = {"files": 0, "bytes": 0, "newestNs": 0}


@pytest.mark.parametrize(
    ("run", "home", "only"),
    [
        ({"jobSummary": FILES, "workdirSummary": NONE}, False, True),
        ({"jobSummary": FILES, "workdirSummary": NONE}, True, False),
        ({"jobSummary": NONE, "workdirSummary": FILES}, False, True),
        ({"jobSummary": NONE, "workdirSummary": NONE}, False, False),
        ({"jobSummary": FILES, "bucket": {"final": True, "onlyHost": []}}, False, False),  # all of it verified in the bucket
        ({"jobSummary": FILES, "bucket": {"final": True, "onlyHost": ["ckpt"]}}, False, True),
    ],
)
def test_only_on_host(run: dict, home: bool, only: bool) -> None:
    assert board.only_on_host(run, home) is only


def stack(**over) -> dict:
    doc = {"stack": "t4", "billing": True, "idle": "idle 3 of 30 min", "hourlyNow": 0.28, "notes": [], "state": "RUNNING"}
    doc["nodes"] = [{"node": 0, "host": "1.2.3.4", "gpus": [{"index": 0, "name": "T4", "utilization": 0.0}], "error": None}]
    return {**doc, **over}


def run(**over) -> dict:
    return {"id": "r1", "state": "succeeded", "onlyHost": False, **over}


@pytest.mark.parametrize(
    ("s", "runs", "kinds", "words"),
    [
        (stack(), [], ["idle-gpu"], "1 GPU(s) idle while billed at $0.28/h: no run is using them; idle stop: idle 3 of 30 min"),
        (stack(), [run(state="running")], ["idle-gpu"], "r1 running but not using them"),
        (stack(billing=False), [], [], ""),  # a stopped VM bills no GPU
        (stack(nodes=[{"node": 0, "host": "h", "gpus": [{"index": 0, "name": "T4", "utilization": 97.0}], "error": None}]), [], [], ""),
        (stack(billing=False), [run(onlyHost=True)], ["only-host"], "outputs only on the host: r1 (fetch them before `down`)"),
        (stack(billing=False), [run(onlyHost=True, state="running")], [], ""),  # still writing: not yet a warning
        (stack(billing=False, notes=["preempted 14:02, coming back (attempt 3)"]), [], ["preempted"], "coming back (attempt 3)"),
        (
            stack(billing=False, nodes=[{"node": 0, "host": "h", "gpus": [], "error": "connection refused"}]),
            [],
            ["unreachable"],
            "node 0 (h) did not answer: connection refused",
        ),
        (stack(billing=False, state="TERMINATED", nodes=[{"node": 0, "host": "h", "gpus": [], "error": "timed out"}]), [], [], ""),
    ],
)
def test_warnings(s: dict, runs: list, kinds: list, words: str) -> None:
    found = board.warnings(s, runs)
    assert [w["kind"] for w in found] == kinds
    assert all(words in w["text"] for w in found)


def series(tag: str, lo: float, hi: float) -> dict:
    return {"tag": tag, "points": [[0, hi], [1, lo]], "min": [1, lo], "max": [0, hi]}


@pytest.mark.parametrize(
    ("tags", "chosen"),
    [
        (["train/loss", "val/loss", "lr"], "val/loss"),
        (["train/loss", "accuracy"], "train/loss"),
        (["eval/accuracy", "train/loss"], "eval/accuracy"),
        (["lr", "epoch"], None),
    ],
)
def test_the_tag_a_sweep_is_judged_by(tags: list, chosen) -> None:
    assert board.judged_by(tags) == chosen


def test_best_trial_by_the_direction_of_its_metric() -> None:
    runs = {"s_t0": [series("val/loss", 0.5, 2.0), series("acc", 0.6, 0.9)], "s_t1": [series("val/loss", 0.3, 2.5)], "s_t2": []}
    assert board.best_trial(runs) == {"run": "s_t1", "tag": "val/loss", "mode": "min", "value": 0.3}
    assert board.best_trial(runs, "acc") == {"run": "s_t0", "tag": "acc", "mode": "max", "value": 0.9}
    assert board.best_trial({"s_t0": [series("lr", 0.1, 0.2)]}) is None


@pytest.mark.parametrize(
    ("run", "local", "home"),
    [
        ({"jobSummary": FILES, "workdirSummary": NONE}, (FILES, NONE), True),
        ({"jobSummary": FILES, "workdirSummary": NONE}, ({**FILES, "newestNs": 2}, NONE), False),  # changed on the host since
        ({"jobSummary": FILES, "workdirSummary": FILES}, (FILES, NONE), False),  # its working directory's outputs not home
        ({"jobSummary": FILES, "workdirSummary": NONE}, None, False),  # never fetched
        ({"jobSummary": NONE, "workdirSummary": NONE}, (NONE, NONE), False),  # nothing to have home
        ({"state": "running"}, (FILES, NONE), False),  # no summaries: cannot say
    ],
)
def test_is_home(run: dict, local, home: bool) -> None:
    assert board.is_home(run, local) is home


def test_a_clusters_gpus_per_node_and_one_state_per_run() -> None:
    """Two nodes: each node's GPUs on the card, the run failed on the cluster when node 1's part failed."""
    from gpu_train.catalog.loader import load_catalog
    from gpu_train.views import listing
    from remote.dashboard.poll import one_state_each

    def doc(state: str, util: float) -> dict:
        gpu = {"index": 0, "name": "NVIDIA L4", "utilization": util, "memoryUsedMiB": 100.0, "memoryTotalMiB": 23034.0}
        run = {"id": "r_20261128_101010", "state": state, "durationS": 3600, "ended": 7200, "exitCode": 0 if state == "succeeded" else 1}
        return {"runs": [run], "gpus": [gpu], "agent": {}, "uptimeS": 10.0, "now": 7200}

    nodes = (board.NodeLook(0, "10.0.0.2", doc("succeeded", 91.0)), board.NodeLook(1, "10.0.0.3", doc("failed", 0.0)))
    look = board.StackLook(listing.StackFacts("duo"), nodes, one_state_each(nodes), {}, 7200.0)
    stack, runs = board.stack_view(look, 7200.0, load_catalog())
    assert [(n["host"], [g["utilization"] for g in n["gpus"]]) for n in stack["nodes"]] == [("10.0.0.2", [91.0]), ("10.0.0.3", [0.0])]
    assert [(r["id"], r["state"]) for r in runs] == [("r_20261128_101010", "failed")]
    assert one_state_each((board.NodeLook(0, "h", error="refused"), nodes[1])) == ()  # node 0 keeps the runs: none without it


def test_another_projects_run_is_marked_with_its_name() -> None:
    from gpu_train.identity import Scope, name_of
    from gpu_train.views import listing

    scope = Scope("mnist-0123abcd", ("mnist-0123abcd",), legacy="mnist")
    runs = ({"id": "a", "project": "mnist-0123abcd"}, {"id": "b", "project": "nanogpt-89abcdef"}, {"id": "c"})  # c: before ids
    mine = frozenset(r["id"] for r in runs if scope.keeps(r.get("project")))
    look = board.StackLook(listing.StackFacts("lab"), (), runs, {}, 0.0, mine, {r["id"]: name_of(r.get("project")) for r in runs})
    assert [(r["id"], r["ours"], r["project"]) for r in board.runs_of(look, None, 0.0)] == [
        ("a", True, "mnist"),
        ("b", False, "nanogpt"),
        ("c", True, "?"),
    ]
