"""`fab status`, `stop`, `resume`, `prune`: a run's state on every node (its log: runlogs.py)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, cast

from invoke import task

from gpu_train.environment import Environment
from gpu_train.errors import GpuTrainError, outcome
from remote.tasks import trust
from remote.tasks.completion import SeenRuns
from remote.tasks.render import render_status
from remote.tasks.session import ALL_PROJECTS_HELP, CLI, STACK_HELP, Session, failures, nodes_failed, on_every_node
from remote.tasks.taskoptions import ResumeOptions, StopOptions

if TYPE_CHECKING:
    from invoke import Context

    from gpu_train.answers import Resumed, Stopped


def cluster_status(session: Session, *args: str) -> dict[str, Any]:
    """The agent's status from every node, one state per run (a single node's document as it is)."""
    from gpu_train.jobs import aggregate_runs

    sessions = session.nodes()
    docs = on_every_node(sessions, lambda s: s.call("status", *args))
    for s in sessions:
        if s is not session:
            s.close()
    if len(docs) == 1:
        if isinstance(docs[0], GpuTrainError):
            raise docs[0]
        return cast(dict[str, Any], docs[0])
    doc = aggregate_runs([None if isinstance(d, GpuTrainError) else cast(dict[str, Any], d) for d in docs])
    doc["unreachable"] = failures(docs)
    return doc


@task(
    help={
        "json": "print JSON: project, runs[].{id, project, state, exitCode, jobDir, jobSummary, workdirSummary, ...}",
        "stack": STACK_HELP,
        "all_projects": "every project's runs on the host, with whose each is (default: this project's)",
    }
)
def status(c: Context, json_: bool = False, stack: str | None = None, all_projects: bool = False) -> None:
    """This project's runs with their state, duration, outputs and last log line; GPU use; hours and cost on GCP.

    A host shared by several projects (or clones, or users) keeps each one's runs apart: this project's
    are listed (in a monorepo, the folder's and those of the folders beneath it), the others counted;
    --all-projects lists every run with its PROJECT.

    A run's outputs are JOB_DIR's files and what the job wrote in its working directory. Its duration
    is the time its job ran, summed over its starts (every leg of a run resumed after a preemption or
    a reboot; not the time the machine was down or the run waited for `resume`).

    On several nodes a run is failed if any node failed (and says which), running while any runs.
    """
    env = Environment.of(c)
    session = Session(env, stack)
    scope = env.scope(all_projects)
    doc = cluster_status(session, "--summaries")  # each run's results: JOB_DIR and the working directory's outputs
    mine, others = scope.split(doc["runs"])
    doc = {**doc, "runs": mine}
    SeenRuns(env.state_home).write(session.target.stack, [r["id"] for r in mine])  # for `--run <TAB>`
    if json_:
        print(json.dumps({"stack": session.target.stack, "project": scope.current, "otherProjectsRuns": len(others), **doc}, indent=1))
    else:
        print(render_status(doc, session.cluster, CLI, scope.current, len(others)))


# -- stop -------------------------------------------------------------------------------------
@task(
    help={
        "run": "run id or a unique prefix (default: this project's running run)",
        "grace": "seconds between SIGINT, SIGTERM and SIGKILL (default 10)",
        "sweep": "a sweep instead: no more of its trials start, those at work stop (as `sweep stop`)",
        "json": "print the result as JSON",
        "stack": STACK_HELP,
        "all_projects": ALL_PROJECTS_HELP,
    }
)
def stop(
    c: Context,
    run: str | None = None,
    grace: str | None = None,
    stack: str | None = None,
    json_: bool = False,
    sweep: str | None = None,
    all_projects: bool = False,
) -> None:
    """Stop a run on every node: SIGINT, a grace period, SIGTERM, another, then SIGKILL of its process group.

    Without --run: this project's running run; when several run, they are listed and none is stopped
    (exit 2: name one with --run)."""
    o = StopOptions.read(run=run, grace=grace, stack=stack, as_json=bool(json_), sweep=sweep, all_projects=bool(all_projects))
    stop_run(Environment.of(c), o)


def stop_run(env: Environment, o: StopOptions) -> None:
    """`stop`'s work for checked options: a sweep's trials, the named run, or this project's running run."""
    from gpu_train.identity import running_run

    run, grace, json_ = o.run, o.grace, o.as_json
    session = Session(env, o.stack)
    if o.sweep is not None:
        from remote.tasks.sweepcalls import stop_sweep

        return stop_sweep(session, o.sweep, json_, grace)
    scope = env.scope(o.all_projects)
    sessions = session.nodes()
    if not run:  # this project's run at work, by the cluster's state (node 0's alone may not say it)
        runs = cluster_status(session)["runs"]
        run = running_run(runs, scope)
        if run is None:
            mine = scope.split(runs)[0]
            newest = f" (the newest, {mine[-1]['id']}, {mine[-1]['state']})" if mine else ""
            print(f"nothing to stop: no run of this project is running{newest}")
            return
    args = ["stop", "--grace", str(float(grace)), "--run", run, *scope.agent_args()]
    docs = on_every_node(sessions, lambda s: s.call(*args))
    if json_:
        print(json.dumps([d if not isinstance(d, GpuTrainError) else {"error": outcome(d)[1]} for d in docs], indent=1))
    for s, doc in zip(sessions, docs, strict=True):
        s.close()
        where = f"node {s.node}: " if len(sessions) > 1 else ""
        if not isinstance(doc, GpuTrainError) and not json_:
            said = cast("Stopped", doc)
            print(f"{where}{said['runId']}: {said['state']} ({', '.join(said['signals']) or 'no signal needed'})")
    if failures(docs):
        raise nodes_failed(docs)


@task(
    help={
        "run": "run id or a unique prefix (default: this project's newest interrupted run)",
        "grace": "seconds to let a still-running part stop (default 10)",
        "force": "restart a single-node run even while it still runs (its work since the last checkpoint is lost)",
        "json": "print the result as JSON",
        "stack": STACK_HELP,
        "all_projects": ALL_PROJECTS_HELP,
    }
)
def resume(
    c: Context,
    run: str | None = None,
    grace: str | None = None,
    stack: str | None = None,
    json_: bool = False,
    force: bool = False,
    all_projects: bool = False,
) -> None:
    """Restart a run on every node with the same RUN_ID and JOB_DIR (it resumes from its checkpoints).

    Without --run: the newest interrupted run (a finished one only when named). For a cluster one
    of whose nodes was preempted, or a run that failed for a reason now fixed (name it)."""
    o = ResumeOptions.read(run=run, grace=grace, stack=stack, as_json=bool(json_), force=bool(force), all_projects=bool(all_projects))
    resume_run(Environment.of(c), o)


def resume_run(env: Environment, o: ResumeOptions) -> None:
    """`resume`'s work for checked options: the named run, or this project's newest interrupted one."""
    from gpu_train.jobs import JobError, resumable

    run, grace, force, json_ = o.run, o.grace, o.force, o.as_json
    session = Session(env, o.stack)
    scope = env.scope(o.all_projects)
    if not run:
        try:
            run = resumable(scope.split(cluster_status(session)["runs"])[0], f"{CLI} resume --stack {session.target.stack}")
        except JobError as e:
            raise GpuTrainError(str(e)) from None
    sessions = session.nodes()
    args = ["resume", "--run", run, "--grace", str(float(grace)), *(["--force"] if force else []), *scope.agent_args()]
    docs = on_every_node(sessions, lambda s: s.call(*args))
    for s in sessions:
        s.close()
    if failures(docs):
        raise nodes_failed(docs)
    resumes = cast("Resumed", docs[0])["resumes"]  # (no node failed)
    run = cast("Resumed", docs[0])["runId"] or run  # the run's id, where --run gave a prefix or a name
    if json_:
        print(json.dumps({"runId": run, "nodes": len(sessions), "resumes": resumes}))
    else:
        print(f"{run}: restarted on {len(sessions)} node(s) (resume {resumes})")


@task(
    help={
        "run": "only this run (an id or a unique prefix)",
        "dry_run": "say what would go; remove nothing",
        "stack": STACK_HELP,
        "all_projects": "every project's finished runs on the host (default: this project's)",
    }
)
def prune(c: Context, run: str | None = None, dry_run: bool = False, stack: str | None = None, all_projects: bool = False) -> None:
    """Free the code copies of finished runs on the host (every node), keeping everything each job wrote.

    Each run keeps the code it was sent; this removes the files still exactly as sent from runs that
    succeeded, failed or were stopped. Outputs (what the job created or changed), running and
    interrupted runs, and the newest run of each name stay. A pruned run cannot be resumed.
    """
    from remote.transfer.codesize import human

    run = trust.run_option(run)
    env = Environment.of(c)
    args = ["prune", *(["--run", run] if run else env.scope(all_projects).agent_args()), *(["--dry-run"] if dry_run else [])]
    session = Session(env, stack)
    nodes = session.nodes()
    results = on_every_node(nodes, lambda s: s.call("prune", *args[1:]))
    for s, doc in zip(nodes, results, strict=True):
        where = f"node {s.node} ({s.target.host})" if len(nodes) > 1 else str(s.target.host)
        if isinstance(doc, GpuTrainError):
            continue
        answer = doc
        pruned, kept = answer["pruned"], answer["kept"]
        files = sum(p["files"] for p in pruned)
        freed = sum(p["freedBytes"] or 0 for p in pruned)
        verb = "would remove" if dry_run else "removed"
        print(
            f"{where}: {verb} the code of {len(pruned)} run(s), {files} file(s)"
            + ("" if dry_run else f", {human(freed)} freed (a file linked from a newer run's code frees nothing)")
            + "; what the jobs wrote stays"
        )
        for p in pruned:
            print(f"  {p['id']}")
        for k in kept:
            print(f"  kept {k['id']}: {k['why']}")
    if failures(results):
        raise nodes_failed(results)
