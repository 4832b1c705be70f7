"""`sweep`'s flags as one checked object (remote/tasks/sweepoptions.py): each bad combination refused with
the flag and the fix before anything is read or sent, numbers read within their bounds."""

from __future__ import annotations

import pytest

from gpu_train.errors import UsageError
from remote.tasks.sweepoptions import SweepOptions, problem

GRID = {"script": "train.py", "values": ("lr=1,2",)}


@pytest.mark.parametrize(
    "flags, said",
    [
        (GRID, None),
        ({"command": "python t.py", "random": ("lr=0:1",), "count": 3}, None),
        ({"script": "t.py", "file": "sweep.yaml"}, None),
        ({"script": "t.py", "workers": 4}, None),
        ({"action": "status"}, None),
        ({"action": "best", "metric": "loss", "mode": "max"}, None),
        ({"action": "stop", "sweep": "grid"}, None),
        ({"action": "go"}, "sweep 'go': use one of start, status, best, stop"),
        ({**GRID, "mode": "median"}, "--mode 'median': min or max"),
        ({"action": "stop"}, "sweep stop needs --sweep NAME (`sweep status` names the newest)"),
        ({"action": "best"}, "sweep best needs --metric NAME (a tag the trials log) and --mode min|max"),
        ({"values": ("lr=1,2",)}, "give the trial's --script (or --command)"),
        ({**GRID, "workers": 2}, "--workers runs your own sweep agent: give no --file, --values or --random with it"),
        ({"script": "t.py", "file": "s.yaml", "workers": 2}, "--workers runs your own sweep agent"),
        ({**GRID, "file": "s.yaml"}, "--file or --values/--random, not both"),
        ({"script": "t.py"}, "say what to sweep: --values NAME=V1,V2 (a grid), --random NAME=MIN:MAX --count N, or --file sweep.yaml"),
    ],
)
def test_flags_together(flags, said):
    if said is None:
        assert problem(SweepOptions(**flags)) is None
        return
    with pytest.raises(UsageError) as e:
        SweepOptions(**flags)
    assert str(e.value).startswith(said)


@pytest.mark.parametrize(
    "flags, said",
    [
        ({"count": "0"}, "--count '0': must be from 1 or more"),
        ({"gpus_per_trial": "65"}, "--gpus-per-trial '65': must be from 1 to 64"),
        ({"slots": "x"}, "--slots 'x': expected a whole number"),
        ({"workers": "0"}, "--workers '0': must be from 1 to 10000"),
        ({"hours_per_trial": "-1"}, "--hours-per-trial '-1': must be from 0 or more"),
        ({"action": "stop", "sweep": "../x"}, "--sweep '../x' is not a run id"),  # a sweep's name is a run id's (it said --run)
    ],
)
def test_numbers_and_names_as_invoke_gives_them(flags, said):
    with pytest.raises(UsageError) as e:
        SweepOptions.read(**{"script": "train.py", "values": ["lr=1"], **flags})
    assert said in str(e.value)


def test_invokes_values_read_once():
    o = SweepOptions.read(action=None, script="t.py", values=["lr=1,2"], random=None, env=["A=1"], count="3", gpus_per_trial="2", args=None)
    assert (o.action, o.values, o.random, o.env, o.count, o.gpus_per_trial, o.args) == ("start", ("lr=1,2",), (), ("A=1",), 3, 2, "")
    assert o.base() == "t"
