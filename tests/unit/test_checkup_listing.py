"""The judgements behind `check` and `ls`: tables of probed facts and the rows they give."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from gpu_train.catalog.loader import load_catalog
from gpu_train.stack.config import parse
from gpu_train.views import checkup, listing
from tests.conftest import gcp_raw

CATALOG = load_catalog()

WHOAMI = "User: alice\nOrganizations: alice\nBackend URL: https://app.pulumi.com/alice\n"
NOT_LOGGED_IN = "error: PULUMI_ACCESS_TOKEN must be set for login during non-interactive CLI sessions\n"


@pytest.mark.parametrize(
    ("output", "ok", "words"),
    [
        (None, False, "not found on PATH"),
        ("v3.272.0\n", True, "v3.272.0"),
        ("v3.150.1\n", False, "older than v3.200.0"),
        ("garbage", False, "cannot read its version"),
    ],
)
def test_pulumi_cli(output: str | None, ok: bool, words: str) -> None:
    f = checkup.pulumi_cli(output)
    assert f.ok is ok and words in f.detail and (f.fix != "") == (not ok)


@pytest.mark.parametrize(
    ("found", "whoami", "ok", "words"),
    [
        (False, None, None, "not checked"),
        (True, (255, "", NOT_LOGGED_IN), False, "PULUMI_ACCESS_TOKEN must be set"),
        (True, (0, WHOAMI, ""), True, "alice at https://app.pulumi.com/alice"),
        (True, (0, "bob\n", ""), True, "bob"),
    ],
)
def test_backend(found: bool, whoami, ok, words: str) -> None:
    f = checkup.backend(found, whoami)
    assert f.ok is ok and words in f.detail


@pytest.mark.parametrize(
    ("adc", "ok", "words"),
    [
        (checkup.Adc("/h/adc.json", False), False, "no file at /h/adc.json"),
        (checkup.Adc("/h/adc.json", True, error="ValueError: bad"), False, "cannot be used: ValueError"),
        (checkup.Adc("/h/adc.json", True, "authorized_user", "proj-1"), True, "authorized_user in /h/adc.json; project proj-1"),
        (checkup.Adc("/h/adc.json", True, "authorized_user"), True, "no project of its own"),
    ],
)
def test_credentials(adc, ok, words) -> None:
    f = checkup.credentials(adc)
    assert f.ok is ok and words in f.detail


@pytest.mark.parametrize(
    ("states", "error", "creds", "oks", "fix"),
    [
        ({"compute.googleapis.com": "ENABLED", "cloudquotas.googleapis.com": "ENABLED"}, None, True, [True, True], ""),
        (
            {"compute.googleapis.com": "ENABLED", "cloudquotas.googleapis.com": "DISABLED"},
            None,
            True,
            [True, False],
            "gcloud services enable cloudquotas.googleapis.com --project p",
        ),
        (None, "HTTP 403: Permission denied", True, [False, False], "serviceUsageViewer"),
        (None, None, False, [None, None], ""),
    ],
)
def test_apis(states, error, creds, oks, fix) -> None:
    found = checkup.apis("p", states, error, creds)
    assert [f.ok for f in found] == oks and [f.what for f in found] == ["Compute Engine API in p", "Cloud Quotas API in p"]
    assert fix in " ".join(f.fix for f in found)


def test_ssh_key_and_stack_findings() -> None:
    assert checkup.ssh_key("a", "/k", False, None).fix.startswith("ssh-keygen")
    assert checkup.ssh_key("a", "/k", True, "no readable public key at /k.pub").ok is False
    assert checkup.ssh_key("a", "/k", True, None).ok is True
    bad = checkup.stack_file("b", None, "stack 'b' is invalid (1 problem):\n  - gpu-train:zone: is required", None, "")
    assert bad.ok is False and "invalid: gpu-train:zone: is required" in bad.detail and "scripts/plan --stack b" in bad.fix
    assert "not deployed" in checkup.stack_file("t", "gcp", None, False, "backend").detail
    assert "deployed (last known outputs)" in checkup.stack_file("t", "gcp", None, True, "last known outputs").detail
    assert "unknown" in checkup.stack_file("t", "gcp", None, None, "no backend to ask").detail


def test_render_and_exit_code() -> None:
    findings = [checkup.pulumi_cli(None), checkup.backend(False, None), checkup.credentials(checkup.Adc("/a", False))]
    text = checkup.render(findings)
    assert "FAIL  Pulumi CLI: not found on PATH" in text and "--    Pulumi backend: not checked" in text
    assert "2 things missing" in text and checkup.exit_code(findings) == 1
    assert checkup.exit_code([checkup.pulumi_cli("v3.272.0")]) == 0


# -- ls ---------------------------------------------------------------------------------------
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc).timestamp()
HOUR = 3600.0
GCP = parse(gcp_raw(spot=True), "t4", CATALOG)
SSH = parse({"gpu-train:target": "ssh", "gpu-train:hosts": ["me@box:22"]}, "lab", CATALOG)
OUTPUTS = {
    "externalIp": "198.51.100.4",
    "zone": "us-central1-a",
    "machineType": "n1-standard-8",
    "gpuType": "nvidia-tesla-t4",
    "gpuCount": 1,
    "spot": True,
    "hourlyCostUsd": 0.28,
}


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat()


def status(runs: list[str], idle_since: float | None = None, limit: int = 30, uptime: float = 2 * HOUR) -> dict:
    return {
        "runs": [{"id": f"r{i}", "state": s} for i, s in enumerate(runs)],
        "uptimeS": uptime,
        "now": NOW,
        "agent": {"idleStopMinutes": limit, "idleSince": idle_since},
    }


@pytest.mark.parametrize(
    ("facts", "state", "source", "runs", "hourly", "billing"),
    [
        (
            listing.StackFacts(
                "t4",
                GCP,
                outputs=OUTPUTS,
                instances=[{"status": "RUNNING", "lastStartTimestamp": iso(NOW - HOUR)}],
                status=status(["running"]),
            ),
            "RUNNING",
            "compute api",
            1,
            0.28,
            True,
        ),
        (
            listing.StackFacts("t4", GCP, outputs=OUTPUTS, instances=[{"status": "TERMINATED"}]),
            "TERMINATED",
            "compute api",
            None,
            0.0,
            False,
        ),
        (listing.StackFacts("t4", GCP, outputs=None, instances=[]), "none", "compute api", None, 0.0, False),
        (listing.StackFacts("t4", GCP, outputs=OUTPUTS, api_error="no credentials"), "RUNNING?", "last known outputs", None, 0.28, True),
        (listing.StackFacts("t4", GCP, outputs=OUTPUTS, status=status([])), "RUNNING", "host answered", 0, 0.28, True),
        (
            listing.StackFacts("t4", parse(gcp_raw(running=False), "t4", CATALOG), outputs=OUTPUTS),
            "TERMINATED?",
            "last known outputs",
            None,
            0.0,
            False,
        ),
        (listing.StackFacts("t4", GCP), "none", "no outputs", None, 0.0, False),
        (listing.StackFacts("lab", SSH, status=status(["running", "succeeded"], limit=0)), "reachable", "host answered", 1, None, False),
        (listing.StackFacts("lab", SSH, status_error="cannot reach"), "unreachable", "ssh", None, None, False),
        (listing.StackFacts("bad", problem="stack 'bad' is invalid"), "invalid", "stack file", None, None, False),
    ],
)
def test_rows(facts, state, source, runs, hourly, billing) -> None:
    r = listing.row(facts, NOW, CATALOG)
    assert (r.state, r.source, r.runs_running, r.hourly_now, r.billing) == (state, source, runs, hourly, billing)


def test_cluster_state_counts_running_nodes() -> None:
    facts = listing.StackFacts(
        "c",
        parse(gcp_raw(nodes=2, machineType="g2-standard-8", gpuType=None, gpuCount=None), "c", CATALOG),
        outputs={**OUTPUTS, "machineType": "g2-standard-8", "gpuType": "nvidia-l4"},
        instances=[{"status": "RUNNING"}, {"status": "TERMINATED"}],
    )
    r = listing.row(facts, NOW, CATALOG)
    assert r.state == "RUNNING 1/2" and r.billing and r.shape.startswith("2 x g2-standard-8")


@pytest.mark.parametrize(
    ("ledger", "instance", "uptime", "hours"),
    [
        ((), {"status": "RUNNING", "lastStartTimestamp": iso(NOW - 3 * HOUR)}, None, 3.0),
        # stopped: from last start to last stop
        ((), {"status": "TERMINATED", "lastStartTimestamp": iso(NOW - 5 * HOUR), "lastStopTimestamp": iso(NOW - 4 * HOUR)}, None, 1.0),
        # a run from last month counts only from the 1st
        (
            (),
            {"status": "RUNNING", "lastStartTimestamp": iso(listing.month_start(NOW) - 10 * HOUR)},
            None,
            (NOW - listing.month_start(NOW)) / HOUR,
        ),
        # the ledger remembers earlier runs; overlapping looks are not counted twice
        (((NOW - 30 * HOUR, NOW - 20 * HOUR),), {"status": "RUNNING", "lastStartTimestamp": iso(NOW - 2 * HOUR)}, 2 * HOUR, 12.0),
        (((NOW - 30 * HOUR, NOW - 20 * HOUR), (NOW - 25 * HOUR, NOW - 18 * HOUR)), None, None, 12.0),
    ],
)
def test_spent_this_month(ledger, instance, uptime, hours) -> None:
    facts = listing.StackFacts(
        "t4",
        GCP,
        outputs=OUTPUTS,
        instances=[instance] if instance else None,
        status={"runs": [], "uptimeS": uptime, "now": NOW, "agent": {}} if uptime else None,
        ledger=ledger,
    )
    r = listing.row(facts, NOW, CATALOG)
    assert r.spent_month == round(hours * 0.28, 2)


@pytest.mark.parametrize(
    ("doc", "text"),
    [
        (None, "-"),
        (status([], limit=0), "off"),
        (status(["running"]), "busy (stops after 30 idle min)"),
        (status([], idle_since=NOW - 12 * 60), "idle 12 of 30 min"),
        (status([]), "stops after 30 idle min"),
    ],
)
def test_idle_clock(doc, text) -> None:
    assert listing.idle_text(doc) == text


def test_billing_stacks_first_and_render() -> None:
    facts = [
        listing.StackFacts("aaa-stopped", GCP, outputs=OUTPUTS, instances=[{"status": "TERMINATED"}]),
        listing.StackFacts("lab", SSH, status=status([])),
        listing.StackFacts("zzz-up", GCP, outputs=OUTPUTS, instances=[{"status": "RUNNING", "lastStartTimestamp": iso(NOW - HOUR)}]),
    ]
    table = listing.rows(facts, NOW, CATALOG)
    assert [r.stack for r in table] == ["zzz-up", "aaa-stopped", "lab"]
    text = listing.render(table)
    # the column counts runs running now (a host with 10 finished runs shows 0), and says so
    assert text.splitlines()[0].split() == [
        "STACK",
        "TARGET",
        "SHAPE",
        "ZONE/HOSTS",
        "VM",
        "RUNNING",
        "$/H",
        "NOW",
        "THIS",
        "MONTH",
        "IDLE",
        "STOP",
    ]
    assert text.splitlines()[1].split()[:7] == ["zzz-up", "gcp", "n1-standard-8", "+", "1", "x", "T4"]
    assert "billing now: $0.28/h across 1 stack(s)" in text and "≥$0.28" in text
