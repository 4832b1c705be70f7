"""`gpu-train sweep`: one script over a space of arguments, a trial per GPU slot, each an ordinary run.

The plan is the core's (gpu_train/sweeps.py: trials, names, slots, the estimate); the queue is the host's
(agent/sweep.py). `sweep` sends the code once (node 0 passes it on to the others, as `train`'s does) and
each node's record; `sweep status`, `sweep best`, `sweep stop` are one agent call per node.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import shlex
import tempfile
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from invoke import Context, task

from gpu_train import sweeps
from gpu_train.environment import Environment
from gpu_train.errors import GpuTrainError, UsageError
from remote.tasks.optional import optional_positional
from remote.tasks.outcomes import all_or_none, sweep_outcome
from remote.tasks.session import CLI, STACK_HELP, Session, every_answer, on_every_node, say
from remote.tasks.sweepcalls import stop_node, stop_sweep, sweep_rows
from remote.tasks.sweepoptions import SweepOptions

if TYPE_CHECKING:
    from gpu_train.answers import SweepStarted
    from gpu_train.contract import JobSpec
    from remote.ssh.target import Target


@task(
    name="sweep",
    positional=["action"],
    iterable=["values", "random", "env"],
    help={
        "action": "start (default), status, best or stop",
        "script": "Python file to run per trial, as `train --script` takes it",
        "command": "shell command per trial instead of --script (with --workers: your own sweep agent)",
        "args": "the fixed arguments; {NAME} places a parameter's value, else each goes last as --NAME VALUE",
        "file": "a sweep file (YAML): method grid|random, parameters, count, seed, args",
        "values": "NAME=V1,V2,... : a grid over these values (repeatable)",
        "random": "NAME=MIN:MAX[:log|int] : a range drawn from (repeatable; with --count)",
        "count": "trials of a random sweep",
        "seed": "the random sweep's seed (default 0: the same trials each time)",
        "gpus_per_trial": "GPUs each trial sees (CUDA_VISIBLE_DEVICES), default 1",
        "slots": "trials at once per node (a host without GPUs needs it; default: its GPUs / --gpus-per-trial)",
        "workers": "start N copies of --command/--script (your own sweep agent, e.g. an Optuna study), one per slot",
        "name": "the sweep's name (default: the script's); trials are NAME_tI_VALUES_YYYYmmdd_HHMMSS",
        "env": "NAME=VALUE for every trial's environment (repeatable)",
        "resume_args": "arguments added at each trial's relaunch (reboot, kill), as for train",
        "resume_if": "add --resume-args only once this file or glob exists, as for train",
        "dry_run": "say the trials, slots, GPU-hours and cost; start nothing",
        "hours_per_trial": "how long one trial takes, for --dry-run's GPU-hours and cost",
        "sweep": "status/best/stop: which sweep (default: the newest)",
        "metric": "status/best: a tag the jobs log (TensorBoard, metrics.jsonl or metrics.csv)",
        "mode": "best: min (default) or max",
        "json": "print the answer as JSON",
        "stack": STACK_HELP,
    },
)
def sweep_(
    c: Context,
    action: str | None = None,
    script: str | None = None,
    command: str | None = None,
    args: str = "",
    file: str | None = None,
    values: str | None = None,
    random: str | None = None,
    count: str | None = None,
    seed: str | None = None,
    gpus_per_trial: int = 1,
    slots: str | None = None,
    workers: str | None = None,
    name: str | None = None,
    env: str | None = None,
    resume_args: str = "",
    resume_if: str | None = None,
    dry_run: bool = False,
    hours_per_trial: str | None = None,
    sweep: str | None = None,
    metric: str | None = None,
    mode: str = "min",
    json_: bool = False,
    stack: str | None = None,
) -> None:
    """Run a script over a grid or random samples of its arguments, one trial per GPU slot."""
    o = SweepOptions.read(
        action=action,
        script=script,
        command=command,
        args=args,
        file=file,
        values=values,
        random=random,
        count=count,
        seed=seed,
        gpus_per_trial=gpus_per_trial,
        slots=slots,
        workers=workers,
        name=name,
        env=env,
        resume_args=resume_args,
        resume_if=resume_if,
        dry_run=bool(dry_run),
        hours_per_trial=hours_per_trial,
        sweep=sweep,
        metric=metric,
        mode=mode,
        as_json=bool(json_),
        stack=stack,
    )
    run_sweep(Environment.of(c), o)


def run_sweep(environment: Environment, o: SweepOptions) -> None:
    """`sweep`'s work for checked options: a plan, a start, or the sweep's status, best or stop."""
    if o.action == "start" and o.dry_run and (offline := gcp_facts(environment, o.stack)) is not None:
        return dry_run_plan(o, *offline)  # a GCP stack's plan needs no VM: its settings and the catalog
    session = Session(environment, o.stack)
    if o.action == "stop":
        return stop_sweep(session, o.sweep or "", o.as_json)
    if o.action in ("status", "best"):
        rows, doc = sweep_rows(session, o.sweep, o.metric, o.mode)
        if o.action == "best":
            return show_best(rows, doc, o.metric or "", o.mode, o.as_json)
        return show_status(rows, doc, o.metric, o.as_json)
    return start(environment, session, o)


def space_of(o: SweepOptions) -> dict[str, Any] | None:
    """The space from --file or the inline options (None with --workers)."""
    if o.workers is not None:
        return None
    try:
        if o.file:
            import yaml

            path = Path(o.file).expanduser()
            try:
                doc = yaml.safe_load(path.read_text())
            except (OSError, yaml.YAMLError) as e:
                raise UsageError(f"--file {path}: {e}") from None
            return sweeps.check_space(doc)
        return sweeps.inline_space(list(o.values), list(o.random), o.count, o.seed)
    except sweeps.SpaceError as e:
        raise UsageError(f"{o.file or 'the sweep'}: {e}") from None


def node_gpus(session: Session) -> list[int]:
    """Each node's GPUs: the stack's where it knows them (GCP), else each host's own count."""
    cluster = session.cluster
    if cluster.node_gpus:
        return list(cluster.node_gpus)
    if cluster.gpus_per_node:
        return [cluster.gpus_per_node] * len(cluster.hosts)
    return [len(d["gpus"]) for d in every_answer(on_every_node(session.nodes(), lambda s: s.call("status")))]


def plan(
    o: SweepOptions, gpus: list[int], base: str, without_gpus: int | None = None
) -> tuple[list[dict[str, Any]], list[list[list[int]]], dict[str, Any] | None]:
    """(trials, each node's slots, the space), for nodes of ``gpus`` GPUs each (``without_gpus``: the slots of a
    node without GPUs when --slots is not given; None: refused, naming --slots)."""
    space = space_of(o)
    try:
        node_slots = [sweeps.slots_of(g, o.gpus_per_trial, o.slots or (None if g else without_gpus)) for g in gpus]
        chosen: list[dict[str, Any]] = [{} for _ in range(o.workers or 0)] if space is None else sweeps.expand(space)
        nodes = sweeps.spread(len(chosen), [len(s) for s in node_slots])
    except sweeps.SpaceError as e:
        raise UsageError(str(e)) from None
    from gpu_train.jobargs import split_args
    from gpu_train.jobs import STAMP_LEN

    fixed = list(split_args("--args", o.args))
    template = space.get("args") if space else None
    trials = []
    for i, vals in enumerate(chosen):
        trial_base = sweeps.trial_base(base, i, vals, 128 - STAMP_LEN) if space else f"{base}_w{i}"
        trials.append({"index": i, "values": vals, "args": sweeps.trial_args(fixed, vals, template), "base": trial_base, "node": nodes[i]})
    return trials, node_slots, space


def start(environment: Environment, session: Session, o: SweepOptions) -> None:
    """The sweep's code sent once (to node 0, which passes it on) and each node's record, each node's queue
    started: the job built, the code planned and sent, the bucket and the webhook placed as `train`'s are
    (remote/tasks/launching.py)."""
    from gpu_train.stack.agentdoc import settings_part
    from remote.ssh.agentcall import AnswerLost
    from remote.tasks import launching
    from remote.transfer import codehop
    from remote.transfer.relay import ChannelRelay

    cluster = session.cluster
    if o.dry_run:
        return dry_run_plan(o, node_gpus(session), cluster.hourly_cost_usd)
    base = o.base()
    trials, node_slots, _ = plan(o, node_gpus(session), base)
    slots_total = sum(len(s) for s in node_slots)
    stamp = datetime.now().strftime("_%Y%m%d_%H%M%S")
    staged = f"{base}{stamp}"  # the code's name in each host's staging area, and the job's placeholder run id
    opts = o.job(environment)  # the folder to sync, the script in it: as `train` finds them
    job = launching.job_for(environment, cluster, opts, run=staged, base=base, nodes=1)  # each trial: one node's run
    job, trials = in_bucket(environment, cluster, job, trials, stamp)
    node_jobs = launching.notifying_node0([job] * len(cluster.hosts))
    with tempfile.TemporaryDirectory(prefix="gpu-train-") as scratch:
        code, _ = launching.plan_code(environment, cluster, opts.code_dir, Path(scratch), None, base)
        sessions = session.nodes()
        # Several nodes: the laptop sends the code to node 0 only, node 0 passes it on (as `train` does).
        fanout = codehop.CodeFanout(cluster, staged, base) if len(sessions) > 1 else None

        def one(s: Session) -> SweepStarted:
            try:
                with ChannelRelay(s.connect().transport) as relay:
                    launching.node_push(s, relay, code, staged, base, fanout)()
            finally:
                if fanout is not None:  # a node that failed before its part of the fan-out holds no one up
                    fanout.settle(s.node, "that node failed")
            node_job = dataclasses.replace(
                node_jobs[s.node], agent_settings=settings_part(s.target.agent_settings), expect_gpus=s.target.expect_gpus
            )
            doc = sweeps.SweepDoc(
                name=base,
                stamp=stamp,
                job=node_job.to_json(),
                trials=tuple(trials),
                slots=tuple(node_slots[s.node]),
                node=s.node,
                mode="workers" if o.workers is not None else "trials",
            )
            record = json.dumps(doc.to_json()).encode() + b"\n"

            def begin() -> SweepStarted:
                try:
                    return s.call("sweep-start", "--staged", staged, stdin=record)
                except AnswerLost as lost:  # (the host may have kept it: asked by its staged name, as a launch is)
                    return sweep_outcome(s, base, staged, lost)

            return launching.until_ready(s, begin)  # the driver, as a launch

        stop = functools.partial(stop_node, sweep=base)
        answers = all_or_none(sessions, on_every_node(sessions, one), stop, f"sweep {base}")  # every node's sweep going, or none
    started = [r for a in answers for r in a["started"]]
    print(f"sweep {base}: {len(trials)} trials over {slots_total} slot(s); started {len(started)}: {', '.join(started)}")
    print(f"  status:  {CLI} sweep status --sweep {base} [--metric NAME]")
    print(f"  best:    {CLI} sweep best --sweep {base} --metric NAME --mode min|max")
    print(f"  stop:    {CLI} sweep stop --sweep {base}")


def in_bucket(
    environment: Environment, cluster: Target, job: JobSpec, trials: list[dict[str, Any]], stamp: str
) -> tuple[JobSpec, list[dict[str, Any]]]:
    """With gpu-train:bucket, each trial's own place in it, by its run id (a trial's files never land in
    another's), and the job's: the project's pushed data for every trial."""
    from remote.tasks import launching

    if not cluster.bucket:
        return job, trials
    runs = [dataclasses.replace(job, run_id=f"{t['base']}{stamp}") for t in trials]
    placed = launching.in_bucket(environment, cluster, [job, *runs], each_a_run=True)
    return placed[0], [{**t, "bucket": s.bucket} for t, s in zip(trials, placed[1:], strict=True)]


def gcp_facts(environment: Environment, stack: str | None) -> tuple[list[int], float | None] | None:
    """A GCP stack's GPUs per node and its $/h for all nodes, from its settings and the catalog; None for an
    SSH stack (its hosts say their GPUs)."""
    from remote.ssh import target as targets

    name = targets.select_stack(environment, stack)
    from gpu_train.stack import check, stackfile

    raw = stackfile.read_stack_file(environment.stack_file(name))
    if check.target_of(raw) == "ssh":
        return None
    from gpu_train.catalog.loader import load_catalog
    from gpu_train.gcp import validate
    from gpu_train.gcp.validate import shape_of
    from gpu_train.views.listing import catalog_price

    catalog = load_catalog()
    cfg, _ = validate.check(raw, name, catalog)
    return [shape_of(cfg, catalog).gpu_count] * cfg.nodes, catalog_price(cfg, catalog)


def dry_run_plan(o: SweepOptions, gpus: list[int], hourly: float | None) -> None:
    """`sweep --dry-run`: the trials, the slots, GPU-hours and the cost; nothing starts."""
    trials, node_slots, _ = plan(o, gpus, o.base(), without_gpus=1)  # it starts nothing: a host without GPUs is no reason to refuse
    est = sweeps.estimate(len(trials), sum(len(s) for s in node_slots), o.gpus_per_trial, o.hours_per_trial, hourly, 1)
    show_plan(trials, node_slots, est, o.hours_per_trial, hourly, o.as_json)
    if not o.slots and 0 in gpus:
        say("a node has no GPU: planned with 1 trial at a time there; to start it, say how many may run at once with --slots N")


def show_plan(
    trials: list[dict[str, Any]],
    node_slots: list[list[list[int]]],
    est: sweeps.Estimate,
    hours: float | None,
    hourly: float | None,
    as_json: bool,
) -> None:
    if as_json:
        print(json.dumps({**dataclasses.asdict(est), "nodeSlots": node_slots, "trials": trials}, indent=1))
        return
    for t in trials:
        print(f"  {t['base']}  node {t['node']}  {shlex.join(t['args'])}")
    gpu_h = f"{est.gpu_hours:g} GPU-hours" if est.gpu_hours is not None else "GPU-hours: give --hours-per-trial"
    cost = (
        f", about ${est.cost:,.2f} at ${hourly:,.2f}/h"
        if est.cost is not None
        else (", cost unknown (no price for the stack)" if hours else "")
    )
    wall = f", {est.wall_hours:g} h of wall time" if est.wall_hours is not None else ""
    print(f"{est.trials} trials, {est.slots} slot(s) in {est.waves} wave(s); {gpu_h}{wall}{cost}")


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.6g}"


def show_status(rows: Sequence[Mapping[str, Any]], doc: Mapping[str, Any], metric: str | None, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"sweep": doc["sweep"], "trials": rows}, indent=1))
        return
    from gpu_train.views.table import aligned

    head = ["#", "values", "state", *(["last " + metric, "best " + metric] if metric else []), "duration", "run"]
    body = []
    for r in rows:
        vals = " ".join(f"{k}={sweeps.shown(v)}" for k, v in r["values"].items()) or "-"
        took = "-" if r["durationS"] is None else f"{r['durationS'] / 60:.1f} min"
        body.append([str(r["index"]), vals, r["state"], *([_num(r["last"]), _num(r["best"])] if metric else []), took, r["runId"]])
    print("\n".join(aligned([head, *body])))
    if metric and doc["tags"]:
        print(not_logged(doc, metric))
    if doc.get("blocked"):
        print(f"the next trial could not start: {doc['blocked']}")


def show_best(rows: Sequence[Mapping[str, Any]], doc: Mapping[str, Any], metric: str, mode: str, as_json: bool) -> None:
    top = sweeps.best(rows, mode)
    if top is None and doc["tags"]:
        raise GpuTrainError(not_logged(doc, metric))
    if top is None:
        raise GpuTrainError(f"no trial of sweep {doc['sweep']} has logged {metric!r} yet (`{CLI} sweep status --metric {metric}`)")
    if as_json:
        print(json.dumps({"sweep": doc["sweep"], "metric": metric, "mode": mode, **top}, indent=1))
        return
    vals = " ".join(f"{k}={sweeps.shown(v)}" for k, v in top["values"].items())
    print(f"{top['runId']}: {metric} {mode} {_num(top['best'])} ({vals}; {top['state']})")


def not_logged(doc: Mapping[str, Any], metric: str) -> str:
    """A --metric that no trial logged, where they logged others: those, and the closest."""
    tags = doc["tags"]
    close = difflib.get_close_matches(metric, tags, n=1, cutoff=0.5) or [t for t in tags if t.endswith(metric.rsplit("/", 1)[-1])][:1]
    guess = f"; did you mean --metric {close[0]}?" if close else ""
    return f"no trial of sweep {doc['sweep']} has logged {metric!r} (yet); they logged {', '.join(tags)}{guess}"


optional_positional(sweep_, "action")
