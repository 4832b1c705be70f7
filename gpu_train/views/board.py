"""The dashboard's page as data: every stack, every run, the warnings that matter. Pure decisions.

The entry points gather what `ls`, `status` and `fetch` read (a stack's ``listing.StackFacts``, each
node's ``StatusDoc``, the fetch record's word on each run) and hand it in; this module turns one look
at the project into the JSON document the page draws (``board``). The live page and the report file
draw the same document, so they cannot disagree.

A run's cost is the stack's $/h while it ran, shared among the runs of the stack that ran at the same
time (a sweep's four trials on one VM cost a quarter of its hours each, and add up to the VM's).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_train.answers import GpuRow, StatusDoc
from gpu_train.catalog.model import Catalog
from gpu_train.contract import ACTIVE, RUNNING
from gpu_train.gcp.pricing import hourly_cost
from gpu_train.gcp.provisioning import way
from gpu_train.gcp.validate import shape_of
from gpu_train.views import listing

IDLE_GPU_PERCENT = 5.0  # a GPU below this utilisation is idle


@dataclass(frozen=True)
class NodeLook:
    """One node's answer to `status --summaries` (or why there is none)."""

    node: int
    host: str
    status: StatusDoc | None = None
    error: str | None = None


@dataclass(frozen=True)
class StackLook:
    """One poll of one stack: what `ls` gathers, every node's status, which runs are home."""

    facts: listing.StackFacts
    nodes: tuple[NodeLook, ...] = ()
    runs: tuple[dict[str, Any], ...] = ()  # the runs, one state each across the nodes (gpu_train.jobs.aggregate_runs)
    home: dict[str, bool] = field(default_factory=dict)  # run id -> its copy here is what the host has
    polled_at: float | None = None
    mine: frozenset[str] | None = None  # the runs of this project (gpu_train/identity.py's scope); None: every run
    owners: dict[str, str] = field(default_factory=dict)  # run id -> its project's name (identity.name_of)


def price_of(facts: listing.StackFacts, catalog: Catalog) -> tuple[float | None, str | None]:
    """(the stack's $/h for all its nodes, the date of that price) where known: the deployed program's
    figure (its outputs), else the catalog's for the stack's shape; the date is the catalog's prices'."""
    cfg = facts.cfg
    if cfg is None or not cfg.is_gcp:
        return None, None
    cost = hourly_cost(shape_of(cfg, catalog), catalog)
    deployed = (facts.outputs or {}).get("hourlyCostUsd")
    price = deployed if deployed is not None else listing.catalog_price(cfg, catalog)
    return (None, None) if price is None else (float(price), cost.date or catalog.dates.get("prices"))


def shares(spans: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Each run's hours, shared with the runs that ran at the same time: {run: hours that are its own}."""
    edges = sorted({t for s, e in spans.values() for t in (s, e)})
    out = dict.fromkeys(spans, 0.0)
    for a, b in itertools.pairwise(edges):
        on = [r for r, (s, e) in spans.items() if s <= a and e >= b]
        for r in on:
            out[r] += (b - a) / 3600 / len(on)
    return out


def run_span(run: dict[str, Any], now: float) -> tuple[float, float] | None:
    """When the run's job ran, as one span ending at its end (or now): its legs' time laid end to end."""
    duration = run.get("durationS")
    if duration is None:
        return None
    ended = run.get("ended")
    end = float(ended) if run.get("state") not in ACTIVE and ended is not None else now
    return (end - float(duration), end)


def sweep_of(run: dict[str, Any]) -> str | None:
    """The sweep a trial belongs to, as its status says (RunStatus.sweep); None for a run of its own."""
    return str(run["sweep"]) if run.get("sweep") else None


def runs_of(look: StackLook, price: float | None, now: float) -> list[dict[str, Any]]:
    """The stack's runs (one state per run across its nodes), each with whether it is home, whose it is,
    its sweep and its share of the stack's cost."""
    runs = look.runs
    spans = {r["id"]: s for r in runs if (s := run_span(r, now)) is not None}
    hours = shares(spans) if price is not None else {}
    out = []
    for r in runs:
        out.append(
            {
                "stack": look.facts.name,
                "id": r["id"],
                "base": r.get("base"),
                "state": r.get("state"),
                "exitCode": r.get("exitCode"),
                "reason": r.get("reason"),
                "resumes": r.get("resumes", 0),
                "preemptions": r.get("preemptions", 0),
                "created": r.get("created"),
                "started": r.get("started"),
                "ended": r.get("ended"),
                "durationS": r.get("durationS"),
                "lastLine": r.get("lastLine", ""),
                "home": look.home.get(r["id"], False),
                "onlyHost": only_on_host(r, look.home.get(r["id"], False)),
                "project": look.owners.get(r["id"]),
                "ours": look.mine is None or r["id"] in look.mine,
                "sweep": sweep_of(r),
                "costUsd": None if r["id"] not in hours or price is None else round(hours[r["id"]] * price, 4),
            }
        )
    return out


def is_home(run: Mapping[str, Any], local: tuple[dict[str, Any], dict[str, Any]] | None) -> bool:
    """Whether the laptop's copy of a run (summaries of the folders `fetch` fills: its JOB_DIR files, its
    working directory's outputs, each a contract.TreeSummary) holds what the host's say, with something in it."""
    host = (run.get("jobSummary"), run.get("workdirSummary"))
    if local is None:
        return False
    same = all(
        h is not None and all(h.get(k) == mine.get(k) for k in ("files", "bytes", "newestNs")) for h, mine in zip(host, local, strict=True)
    )
    return same and any((h or {}).get("files") for h in host)


def only_on_host(run: dict[str, Any], home: bool) -> bool:
    """Outputs that exist on the host alone: written, not fetched as they are now, not all in its bucket."""
    if home:
        return False
    bucket = run.get("bucket")
    if bucket and bucket.get("final") and not bucket.get("onlyHost"):
        return False
    summaries = [run.get(k) or {} for k in ("jobSummary", "workdirSummary")]
    return any(s.get("files") for s in summaries)


def nodes_of(look: StackLook) -> list[dict[str, Any]]:
    return [
        {
            "node": n.node,
            "host": n.host,
            "gpus": list(n.status.get("gpus") or []) if n.status else [],
            "uptimeS": n.status.get("uptimeS") if n.status else None,
            "error": n.error,
        }
        for n in look.nodes
    ]


def idle_gpus(gpus: Sequence[GpuRow]) -> bool:
    return bool(gpus) and all(float(g.get("utilization") or 0) < IDLE_GPU_PERCENT for g in gpus)


def warnings(stack: dict[str, Any], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a researcher must not miss on this stack: GPUs idle while it bills, outputs only on the host
    (what `down` would fetch first, or lose with --force), a preempted VM coming back, a host not answering."""
    out = []
    name = stack["stack"]
    gpus = [g for n in stack["nodes"] for g in n["gpus"]]
    if stack["billing"] and idle_gpus(gpus):
        busy = [r["id"] for r in runs if r["state"] == RUNNING]
        why = f"{', '.join(busy)} running but not using them" if busy else "no run is using them"
        clock = f"; idle stop: {stack['idle']}" if stack["idle"] not in ("-", "") else ""
        cost = f" at ${stack['hourlyNow']:.2f}/h" if stack.get("hourlyNow") else ""
        out.append({"stack": name, "kind": "idle-gpu", "text": f"{len(gpus)} GPU(s) idle while billed{cost}: {why}{clock}"})
    lonely = [r["id"] for r in runs if r["onlyHost"] and r["state"] not in ACTIVE]
    if lonely:
        shown = ", ".join(lonely[:3]) + (f" and {len(lonely) - 3} more" if len(lonely) > 3 else "")
        out.append({"stack": name, "kind": "only-host", "text": f"outputs only on the host: {shown} (fetch them before `down`)"})
    for note in stack["notes"]:
        if "coming back" in note or "preempted" in note:
            out.append({"stack": name, "kind": "preempted", "text": note})
    for n in stack["nodes"]:
        if n["error"] and stack["state"] not in ("TERMINATED", "none"):
            out.append({"stack": name, "kind": "unreachable", "text": f"node {n['node']} ({n['host']}) did not answer: {n['error']}"})
    return out


def stack_view(look: StackLook, now: float, catalog: Catalog) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One stack's card and its runs."""
    status = next((n.status for n in look.nodes if n.status is not None), None)
    errors = [n.error for n in look.nodes if n.error]
    facts = listing.StackFacts(**{**look.facts.__dict__, "status": status, "status_error": errors[0] if errors and not status else None})
    row = listing.row(facts, now, catalog).to_json()
    price, date = price_of(facts, catalog)
    stack = {
        **row,
        "price": price,
        "priceDate": date,
        "nodes": nodes_of(look),
        "polledAt": look.polled_at,
        "gcp": bool(facts.cfg and facts.cfg.is_gcp),
        "way": way(facts.cfg) if facts.cfg is not None and facts.cfg.is_gcp else None,
    }
    return stack, runs_of(look, price, now)


def board(looks: Sequence[StackLook], now: float, catalog: Catalog, project: str, interval_s: float | None) -> dict[str, Any]:
    """The page's document: stacks (billing first, as `ls`), every run (running first, newest first), warnings."""
    stacks, runs, warned = [], [], []
    for look in looks:
        stack, its_runs = stack_view(look, now, catalog)
        stacks.append(stack)
        runs += its_runs
        warned += warnings(stack, its_runs)
    stacks.sort(key=lambda s: (not s["billing"], s["stack"]))
    runs.sort(key=lambda r: (r["state"] not in ACTIVE, -(r.get("created") or 0), r["stack"], r["id"]))
    sweeps: dict[str, dict[str, Any]] = {}
    for r in runs:
        if r["sweep"]:
            key = f"{r['stack']}/{r['sweep']}"
            s = sweeps.setdefault(key, {"stack": r["stack"], "sweep": r["sweep"], "runs": [], "costUsd": 0.0, "priced": True})
            s["runs"].append(r["id"])
            s["priced"] = s["priced"] and r["costUsd"] is not None
            s["costUsd"] = round(s["costUsd"] + (r["costUsd"] or 0), 4)
    return {
        "project": project,
        "at": now,
        "intervalS": interval_s,
        "stacks": stacks,
        "runs": runs,
        "sweeps": list(sweeps.values()),
        "warnings": warned,
        "billingNow": round(sum(s["hourlyNow"] or 0 for s in stacks if s["billing"]), 4),
    }


# -- a sweep's best trial ----------------------------------------------------------------------
# Which way a metric is better, by the words in its tag (the first that matches): a loss, an error, a
# perplexity go down; an accuracy, a score, a reward go up. A tag that says neither names no best.
LOWER, HIGHER = "min", "max"
DIRECTIONS = (
    ("loss", LOWER),
    ("err", LOWER),
    ("perplexity", LOWER),
    ("ppl", LOWER),
    ("acc", HIGHER),
    ("f1", HIGHER),
    ("score", HIGHER),
    ("reward", HIGHER),
    ("auc", HIGHER),
    ("bleu", HIGHER),
)
# Of several tags, the one a sweep is judged by: an evaluation's before a training's.
EVAL_WORDS = ("val", "eval", "test")


def direction(tag: str) -> str | None:
    low = tag.lower()
    return next((mode for word, mode in DIRECTIONS if word in low), None)


def judged_by(tags: list[str]) -> str | None:
    """The tag a sweep's best trial is judged by: an evaluation's loss (or other metric with a direction)
    before a training one; None when no tag says which way is better."""
    ranked = [t for t in tags if direction(t)]
    ranked.sort(key=lambda t: (not any(w in t.lower() for w in EVAL_WORDS), direction(t) != LOWER, t))
    return ranked[0] if ranked else None


def best_trial(runs: dict[str, list[dict[str, Any]]], tag: str | None = None) -> dict[str, Any] | None:
    """The best trial of a sweep by ``tag`` (else ``judged_by`` its tags): {run, tag, mode, value}, the
    value the trial's best point (contract.ScalarSeries min or max), None when no trial has the tag."""
    tag = tag or judged_by(sorted({s["tag"] for series in runs.values() for s in series}))
    mode = direction(tag) if tag else None
    if tag is None or mode is None:
        return None
    best: dict[str, Any] | None = None
    for run, series in sorted(runs.items()):
        for s in series:
            point = s.get(mode) if s["tag"] == tag else None
            if point is None or point[1] is None:
                continue
            value = float(point[1])
            if best is None or (value < best["value"] if mode == LOWER else value > best["value"]):
                best = {"run": run, "tag": tag, "mode": mode, "value": value}
    return best
