"""A sweep's plan (gpu_train/sweeps.py): spaces, trials, names, arguments, slots, the queue's next step."""

from __future__ import annotations

import math
import re

import pytest

from gpu_train import sweeps
from gpu_train.contract import RUN_ID_PATTERN
from gpu_train.jobs import STAMP_LEN

GRID = {"parameters": {"lr": {"values": [0.001, 0.01, 0.1]}, "bs": {"values": [16, 32]}}}


def test_a_grid_is_the_product_first_parameter_slowest():
    trials = sweeps.expand(sweeps.check_space(GRID))
    assert trials == [
        {"lr": 0.001, "bs": 16},
        {"lr": 0.001, "bs": 32},
        {"lr": 0.01, "bs": 16},
        {"lr": 0.01, "bs": 32},
        {"lr": 0.1, "bs": 16},
        {"lr": 0.1, "bs": 32},
    ]


class _Unbuilt(list):
    """Values whose iteration counts: a refused grid must be refused by its size, never by building it."""

    walked = 0

    def __iter__(self):
        _Unbuilt.walked += 1
        return super().__iter__()


@pytest.mark.parametrize(
    "sizes, trials",
    [
        ([10] * 7, None),  # 10**7: refused without building 10 million tuples (10 s and 1 GB before)
        ([10] * 4 + [2], None),  # 20_000
        ([100, 101], None),  # 10_100: just over
        ([100, 100], 10_000),  # exactly the limit
        ([10, 10, 10], 1_000),
        ([1], 1),
    ],
)
def test_a_grid_is_refused_by_its_size_before_it_is_built(sizes, trials):
    _Unbuilt.walked = 0
    space = {"method": "grid", "parameters": {f"p{k}": {"values": _Unbuilt(range(n))} for k, n in enumerate(sizes)}}
    if trials is None:
        with pytest.raises(sweeps.SpaceError, match=rf"the grid has {math.prod(sizes)} trials, more than {sweeps.TRIALS_MAX}"):
            sweeps.expand(space)
        assert _Unbuilt.walked == 0
    else:
        assert len(sweeps.expand(space)) == trials


def test_random_draws_are_seeded_and_within_their_ranges():
    space = sweeps.check_space(
        {
            "method": "random",
            "count": 50,
            "seed": 7,
            "parameters": {
                "lr": {"min": 1e-5, "max": 1e-2, "distribution": "log_uniform"},
                "layers": {"min": 2, "max": 6, "distribution": "int_uniform"},
                "drop": {"min": 0.0, "max": 0.5},
                "opt": {"values": ["adam", "sgd"]},
            },
        }
    )
    a, b = sweeps.expand(space), sweeps.expand(space)
    assert a == b and len(a) == 50
    assert all(1e-5 <= t["lr"] <= 1e-2 and 2 <= t["layers"] <= 6 and isinstance(t["layers"], int) for t in a)
    assert all(0 <= t["drop"] <= 0.5 and t["opt"] in ("adam", "sgd") for t in a)
    assert {t["layers"] for t in a} == {2, 3, 4, 5, 6}
    assert sum(t["lr"] < 1e-3 for t in a) > 25  # log-uniform: two decades of three below 1e-3


@pytest.mark.parametrize(
    "doc, message",
    [
        ([1], "must be a mapping"),
        ({"parameters": {}}, "at least one"),
        ({"method": "bayes", "parameters": GRID["parameters"]}, "method 'bayes'"),
        ({"parameters": {"lr": {"min": 0, "max": 1}}}, "needs method: random"),
        ({"method": "random", "parameters": {"lr": {"min": 0, "max": 1}}}, "count: a random sweep"),
        ({"method": "random", "count": 2, "parameters": {"lr": {"min": 0, "max": 1, "distribution": "log_uniform"}}}, "min > 0"),
        ({"parameters": {"lr": {"values": []}}}, "parameters.lr.values"),
        ({"parameters": {"lr": {"values": [1]}}, "args": "--x {y}"}, "args names {y}"),
        ({"parameters": {"a b": {"values": [1]}}}, "parameters.a b"),
        ({"parameters": {"lr": {"values": [1]}}, "grid": 1}, "unknown sweep setting(s) grid"),
    ],
)
def test_a_bad_space_is_named(doc, message):
    with pytest.raises(sweeps.SpaceError, match=re.escape(message)):
        sweeps.check_space(doc)


@pytest.mark.parametrize(
    "values, ranges, count, expected",
    [
        (["lr=0.1,0.01", "bs=16"], [], None, {"method": "grid", "lr": [0.1, 0.01], "bs": [16]}),
        (["opt=adam,sgd", "amp=true,false"], [], None, {"method": "grid", "opt": ["adam", "sgd"], "amp": [True, False]}),
        ([], ["lr=1e-5:1e-2:log", "n=1:4:int"], 3, {"method": "random", "lr": "log_uniform", "n": "int_uniform"}),
    ],
)
def test_inline_spaces(values, ranges, count, expected):
    space = sweeps.inline_space(values, ranges, count, None)
    assert space["method"] == expected["method"]
    for name, want in expected.items():
        if name == "method":
            continue
        p = space["parameters"][name]
        assert (p["values"] if "values" in p else p["distribution"]) == want


@pytest.mark.parametrize(
    "fixed, values, template, expected",
    [
        ([], {"lr": 0.01, "bs": 16}, None, ["--lr", "0.01", "--bs", "16"]),
        (["--epochs", "3"], {"lr": 0.01}, None, ["--epochs", "3", "--lr", "0.01"]),
        (["--lr={lr}"], {"lr": 0.01, "amp": True}, None, ["--lr=0.01", "--amp", "true"]),  # nanoGPT's --key=value
        ([], {"lr": 1e-4}, "--learning_rate {lr} --seed 0", ["--learning_rate", "0.0001", "--seed", "0"]),
        (["--keep", "{other}"], {}, None, ["--keep", "{other}"]),
    ],
)
def test_trial_arguments(fixed, values, template, expected):
    assert sweeps.trial_args(fixed, values, template) == expected


@pytest.mark.parametrize(
    "sweep, index, values, expected",
    [
        ("grid", 2, {"lr": 0.01, "bs": 16}, "grid_t2_lr0p01_bs16"),
        ("s", 0, {"lr": 1e-05, "opt": "adam-w"}, "s_t0_lr1em05_optadamw"),
        ("s", 1, {"x": -0.5}, "s_t1_xm0p5"),
        ("s", 3, {}, "s_t3"),
        ("n" * 40, 9999, {"v" * 50: "w" * 50}, None),
    ],
)
def test_trial_names_are_run_ids(sweep, index, values, expected):
    base = sweeps.trial_base(sweep, index, values, 128 - STAMP_LEN)
    if expected is not None:
        assert base == expected
    assert re.fullmatch(RUN_ID_PATTERN, base + "_20260101_000000") and f"_t{index}" in base


@pytest.mark.parametrize(
    "gpus, per_trial, declared, expected",
    [
        (8, 1, None, [[k] for k in range(8)]),
        (8, 2, None, [[0, 1], [2, 3], [4, 5], [6, 7]]),
        (8, 3, None, [[0, 1, 2], [3, 4, 5]]),
        (4, 1, 2, [[0], [1]]),
        (0, 1, 4, [[], [], [], []]),
    ],
)
def test_slots(gpus, per_trial, declared, expected):
    assert sweeps.slots_of(gpus, per_trial, declared) == expected


@pytest.mark.parametrize(
    "gpus, per_trial, declared, message", [(0, 1, None, "--slots N"), (2, 4, None, "only 2 GPU"), (2, 0, None, "at least 1")]
)
def test_slots_refused(gpus, per_trial, declared, message):
    with pytest.raises(sweeps.SpaceError, match=message):
        sweeps.slots_of(gpus, per_trial, declared)


@pytest.mark.parametrize(
    "count, node_slots, expected",
    [
        (6, [4], [0] * 6),
        (6, [2, 2], [0, 1, 0, 1, 0, 1]),
        (7, [4, 1], [0, 1, 0, 0, 0, 0, 1]),  # in proportion to the slots
        (3, [0, 2], [1, 1, 1]),
    ],
)
def test_trials_spread_over_nodes(count, node_slots, expected):
    assert sweeps.spread(count, node_slots) == expected


@pytest.mark.parametrize(
    "states, held, slots, expected",
    [
        (["pending"] * 6, [None] * 6, 4, [(0, 0), (1, 1), (2, 2), (3, 3)]),
        (["succeeded", "running", "running", "running", "pending", "pending"], [0, 1, 2, 3, None, None], 4, [(4, 0)]),
        # an interrupted trial keeps its slot for boot's resume: the next waits
        (["interrupted", "running", "running", "running", "pending", "pending"], [0, 1, 2, 3, None, None], 4, []),
        (["failed", "stopped", "running", "running", "pending", "pending"], [0, 1, 2, 3, None, None], 4, [(4, 0), (5, 1)]),
        (["succeeded"] * 3, [0, 1, 0], 2, []),
        (["pending"], [None], 0, []),
    ],
)
def test_next_launches(states, held, slots, expected):
    assert sweeps.next_launches(states, held, slots) == expected


@pytest.mark.parametrize(
    "trials, slots, gpt, hours, price, nodes, expected",
    [
        (6, 4, 1, 2.0, 10.0, 1, sweeps.Estimate(6, 4, 2, 12.0, 4.0, 40.0)),
        (8, 8, 1, 0.5, None, 1, sweeps.Estimate(8, 8, 1, 4.0, 0.5, None)),
        (5, 2, 2, None, 3.0, 1, sweeps.Estimate(5, 2, 3, None, None, None)),
        (4, 4, 1, 1.0, 2.0, 2, sweeps.Estimate(4, 4, 1, 4.0, 1.0, 4.0)),
    ],
)
def test_estimate(trials, slots, gpt, hours, price, nodes, expected):
    assert sweeps.estimate(trials, slots, gpt, hours, price, nodes) == expected


@pytest.mark.parametrize(
    "rows, mode, expected",
    [
        ([{"runId": "a", "best": 0.5}, {"runId": "b", "best": 0.2}, {"runId": "c", "best": None}], "min", "b"),
        ([{"runId": "a", "best": 0.5}, {"runId": "b", "best": 0.2}], "max", "a"),
        ([{"runId": "a", "best": None}], "min", None),
    ],
)
def test_best(rows, mode, expected):
    top = sweeps.best(rows, mode)
    assert (top and top["runId"]) == expected


def test_dry_run_on_a_gcp_stack_says_slots_waves_gpu_hours_and_cost_without_a_vm(tmp_path):
    """4 T4s on an n1-standard-8 are 4 slots (2 with --gpus-per-trial 2): the plan and its price from the stack's
    settings and the catalog, before anything exists."""
    import json
    import subprocess

    import yaml

    from gpu_train.catalog.loader import load_catalog
    from gpu_train.gcp import validate
    from gpu_train.views.listing import catalog_price
    from tests.conftest import fab_env, gcp_raw, run_fab

    raw = gcp_raw(gpuCount=4)
    stacks, project = tmp_path / "stacks", tmp_path / "work"
    stacks.mkdir()
    project.mkdir()
    (stacks / "Pulumi.octo.yaml").write_text(yaml.safe_dump({"config": raw}))
    (project / "train.py").write_text("print(1)\n")
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    price = catalog_price(validate.check(raw, "octo", load_catalog())[0], load_catalog())
    assert price
    env = fab_env(stacks, tmp_path / "home", "octo", project)
    args = ("sweep", "--script", "train.py", "--random", "lr=1e-5:1e-2:log", "--count", "20", "--hours-per-trial", "1", "--dry-run")
    out = run_fab(env, project, *args, check=True).stdout
    assert f"20 trials, 4 slot(s) in 5 wave(s); 20 GPU-hours, 5 h of wall time, about ${price * 5:,.2f} at ${price:,.2f}/h" in out, out
    doc = json.loads(run_fab(env, project, *args, "--gpus-per-trial", "2", "--json", check=True).stdout)
    assert doc["nodeSlots"] == [[[0, 1], [2, 3]]] and doc["slots"] == 2 and doc["waves"] == 10 and doc["gpu_hours"] == 40
    assert doc["cost"] == round(price * 10, 2) and len(doc["trials"]) == 20
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").rglob("*.json"))  # nothing asked of Pulumi


def test_a_sweep_file_and_its_mistakes_as_the_command_says_them(tmp_path):
    """--file: the trials it makes (its args template filled), and a bad file named with its setting before
    anything is sent (a GCP stack's dry run: nothing is contacted either way)."""
    import json
    import subprocess

    import yaml

    from tests.conftest import fab_env, gcp_raw, run_fab

    stacks, project = tmp_path / "stacks", tmp_path / "work"
    stacks.mkdir()
    project.mkdir()
    (stacks / "Pulumi.quad.yaml").write_text(yaml.safe_dump({"config": gcp_raw(gpuCount=4)}))
    (project / "train.py").write_text("print(1)\n")
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    env = fab_env(stacks, tmp_path / "home", "quad", project)
    (project / "sweep.yaml").write_text(
        "method: random\ncount: 3\nseed: 4\nargs: '--learning_rate={lr}'\n"
        "parameters:\n  lr: {min: 1.0e-5, max: 1.0e-2, distribution: log_uniform}\n  layers: {values: [2, 4]}\n"
    )
    planned = run_fab(env, project, "sweep", "--script", "train.py", "--file", "sweep.yaml", "--dry-run", "--json", check=True)
    doc = json.loads(planned.stdout)
    expected = sweeps.expand(sweeps.check_space(yaml.safe_load((project / "sweep.yaml").read_text())))
    assert [t["values"] for t in doc["trials"]] == expected
    assert [t["args"] for t in doc["trials"]] == [[f"--learning_rate={v['lr']}", "--layers", str(v["layers"])] for v in expected]
    (project / "bad.yaml").write_text("method: grid\nparameters:\n  lr: {min: 0.1, max: 1}\n")
    bad = run_fab(env, project, "sweep", "--script", "train.py", "--file", "bad.yaml", "--dry-run")
    assert bad.returncode == 2 and "parameters.lr: a range (min/max) needs method: random" in bad.stderr, bad.stderr
    none = run_fab(env, project, "sweep", "--script", "train.py", "--dry-run")
    assert none.returncode == 2 and "say what to sweep" in none.stderr
