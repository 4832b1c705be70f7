"""`fetch --all-nodes` with a bucket: the nodes that cannot be reached come from the bucket (their RUN/node-N/),
the same runs the others answered with; the others as the hosts gave them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpu_train.errors import ExitStatus, GpuTrainError, Unreachable
from remote.tasks import frombucket


def _cluster(bucket: str | None):
    lead = SimpleNamespace(node=0, cluster=SimpleNamespace(bucket=bucket), env=None)
    return lead, [lead, SimpleNamespace(node=1), SimpleNamespace(node=2)]


def test_only_the_nodes_out_of_reach_come_from_the_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = []
    monkeypatch.setattr(frombucket, "from_bucket", lambda env, target, run, all_, dest, streams, node: asked.append((run, dest, node)))
    lead, sessions = _cluster("gs://ckpt/team")
    gone = Unreachable("cannot reach 10.0.0.2 over SSH")
    failed = GpuTrainError("a file the host cannot read")
    results = [([{"id": "a_20260101_000000"}, {"id": "b_20260101_000000"}], []), gone, failed]
    out = frombucket.gone_nodes(lead, sessions, results, None, True, "/tmp/d", 4)
    assert asked == [("a_20260101_000000", "/tmp/d/a_20260101_000000", 1), ("b_20260101_000000", "/tmp/d/b_20260101_000000", 1)]
    assert out[0] is results[0] and out[1] == ([], []) and out[2] is failed  # a node's other failure stays one


def test_no_bucket_leaves_the_failures_and_none_answering_is_the_whole_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frombucket, "from_bucket", lambda *a, **k: pytest.fail("no bucket to fetch from"))
    gone = Unreachable("cannot reach")
    lead, sessions = _cluster(None)
    results = [([], []), gone, gone]
    assert frombucket.gone_nodes(lead, sessions, results, None, False, None, 4) == results
    lead, sessions = _cluster("gs://ckpt")
    with pytest.raises(Unreachable) as e:  # the caller brings the whole runs (every node's files) from the bucket
        frombucket.gone_nodes(lead, sessions, [gone, gone, gone], None, False, None, 4)
    assert e.value.status == ExitStatus.UNREACHABLE
