"""`fab down` and the guards before anything is destroyed (every run of every node home, or a refusal
naming what would be lost): shared with `vm-stop`, kept apart from `fetch`, which they call."""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING, Any, cast

from invoke import Context, task

from gpu_train.contract import ACTIVE, INTERRUPTED
from gpu_train.environment import Environment
from gpu_train.errors import CommandFailed, GpuTrainError, UsageError
from remote.tasks.fetch import fetch_runs
from remote.tasks.frombucket import node_dir
from remote.tasks.session import CLI, STACK_HELP, Session, failures, on_every_node, say
from remote.tasks.taskoptions import DownOptions

if TYPE_CHECKING:
    from gpu_train.identity import Scope
    from remote.ssh.target import Target
from remote.transfer.fetch.generator import DEFAULT_STREAMS


def every_node_status(session: Session, bucket_record: bool = False) -> tuple[list[Session], list[object]]:
    """Every node's session and its status document with summaries (the error of a node that failed);
    ``bucket_record``: with what each run verified in its bucket (`down --no-fetch` checks the bucket for it)."""
    sessions = session.nodes()
    extra = ["--bucket-record"] if bucket_record else []
    return sessions, on_every_node(sessions, lambda s: s.call("status", "--summaries", *extra))


def guard_runs(sessions: list[Session], docs: list[object]) -> tuple[list[dict[str, Any]], list[str]]:
    """The cluster's runs (one state each) and the nodes that could not be asked, for the guards."""
    from gpu_train.jobs import aggregate_runs

    if len(docs) == 1 and not isinstance(docs[0], GpuTrainError):
        return cast(dict[str, Any], docs[0])["runs"], []
    doc = aggregate_runs([None if isinstance(d, GpuTrainError) else cast(dict[str, Any], d) for d in docs])
    return doc["runs"], failures(docs)


def fetch_every_node(sessions: list[Session], docs: list[object], streams: int = DEFAULT_STREAMS) -> list[str]:
    """Before anything is destroyed: every node's runs home (node N's in RUN/node-N/), strictly (a host's
    file the laptop kept its newer copy of counts as not home). What is not, one line each."""

    def one(s: Session) -> list[str]:
        runs = cast(dict[str, Any], docs[s.node])["runs"]
        lost = fetch_runs(s, runs, None, progress=False, subdir=node_dir(s.node), streams=streams, strict=True) if runs else []
        return [f"node {s.node}: {m}" for m in lost] if len(sessions) > 1 else lost

    results = on_every_node([s for s in sessions if not isinstance(docs[s.node], GpuTrainError)], one)
    return failures(results) + [m for r in results if isinstance(r, list) for m in r]


def keep_to(docs: list[object], scope: Scope) -> tuple[list[object], list[dict[str, Any]]]:
    """Each node's status document with only the scope's runs, and the other projects' runs (node 0's view:
    one per run) that were left out."""
    kept: list[object] = []
    others: dict[str, dict[str, Any]] = {}
    for d in docs:
        if isinstance(d, GpuTrainError):
            kept.append(d)
            continue
        mine, rest = scope.split(cast(dict[str, Any], d)["runs"])
        kept.append({**cast(dict[str, Any], d), "runs": mine})
        others.update({r["id"]: r for r in rest if r["id"] not in others})
    return kept, list(others.values())


def whose(runs: list[dict[str, Any]], limit: int = 8) -> str:
    """Runs with their projects, for a message: "RUN (PROJECT), ..."."""
    shown = ", ".join(f"{r['id']} ({r.get('project') or '?'})" for r in runs[:limit])
    return shown + (f" and {len(runs) - limit} more" if len(runs) > limit else "")


def refusal(problems: list[str], what: str, force_hint: str) -> str:
    """The guards' message: what would be lost, and the ways on."""
    shown = "\n  ".join(problems[:20]) + (f"\n  and {len(problems) - 20} more" if len(problems) > 20 else "")
    return (
        f"refusing: not everything is home; nothing was {what}. What would be lost:\n  {shown}\n"
        f"Fix what is named and run it again, or {force_hint} to lose them"
    )


def uncron(session: Session) -> None:
    """`down` on an SSH stack: each host's @reboot line (reboot-resume, from `setup`) goes too."""
    nodes = session.nodes()
    results = on_every_node(nodes, lambda s: s.call("uncron"))
    for s, r in zip(nodes, results, strict=True):
        if isinstance(r, dict) and r.get("removed"):
            say(f"{s.target.host}: took gpu-train's lines out of your crontab (reboots no longer resume runs there)")
    for line in failures(results):
        say(f"warning: {line}: gpu-train's crontab lines may still be there (`crontab -e` there to remove them)")


def not_as_recorded(target: Target, bucket: str, docs: list[object]) -> list[str]:
    """`down --no-fetch`: the laptop lists the bucket itself and requires every file each host's uploader
    recorded, with its generation, size and CRC32C, under the run's prefix as this stack names it (its area,
    or for a run from before areas its name's folder); one line per run naming what differs (the host's word
    alone let a deleted run's VM be destroyed)."""

    from gpu_train.contract import is_run_id
    from gpu_train.stack.bucket import parse_bucket, run_prefix
    from remote.tasks.bucketguard import differs_in_bucket, expected_objects, recorded_prefix
    from remote.tasks.frombucket import areas_of
    from remote.transfer import bucketfetch

    place, lines = parse_bucket(bucket), []
    gcs = bucketfetch.client()
    for node, doc in enumerate(docs):
        if isinstance(doc, GpuTrainError) or doc is None:
            continue
        where = f"node {node}: " if len(docs) > 1 else ""
        for run in cast(dict[str, Any], doc).get("runs", []):
            if not run.get("bucket"):
                continue  # (not_in_bucket names it)
            rid = str(run.get("id"))
            if not is_run_id(rid) or not isinstance(run.get("bucketRecord"), dict):
                lines.append(f"{where}{rid!r}: the host did not say what it verified in the bucket")
                continue
            prefix = recorded_prefix([run_prefix(place, a, rid, node) for a in areas_of(target)], place.name, run["bucket"].get("url"))
            if prefix is None:
                lines.append(f"{where}{rid}: the host says it went to {str(run['bucket'].get('url'))[:200]}, no folder of this stack's")
                continue
            try:
                listed = {b.name: (int(b.generation), int(b.size), str(b.crc32c)) for b in gcs.list_blobs(place.name, prefix=prefix)}
            except Exception as e:  # credentials, the network: the bucket could not be checked, so nothing is destroyed
                lines.append(f"{where}{rid}: could not list {place.url(prefix[len(place.prefix) :])}: {e}")
                continue
            lines += differs_in_bucket(expected_objects(run["bucketRecord"], prefix), listed, f"{where}{rid}")
    return lines


@task(
    help={
        "force": "destroy even if a run is running or not everything could be fetched (naming what is lost)",
        "streams": f"parallel SSH streams for the fetch (default {DEFAULT_STREAMS})",
        "stack": STACK_HELP,
        "no_fetch": "with gpu-train:bucket: download nothing; refuses unless every run is verified in the bucket",
        "all_projects": "fetch every project's runs into this project's runs/ (default: this project's; on GCP another "
        "project's run on the VM refuses the destroy)",
    }
)
def down(
    c: Context,
    force: bool = False,
    streams: str | None = None,
    stack: str | None = None,
    no_fetch: bool = False,
    all_projects: bool = False,
) -> None:
    """Fetch every run from every node, then stop billing (`pulumi destroy --yes` on GCP stacks, the data disks too).

    Refuses, naming what would be lost, while a run is still running or anything of any node (a JOB_DIR,
    the outputs in a working directory) is not home, unless --force. The data disks are protected
    against a plain `pulumi destroy`; only here, after the fetch, are they released.
    """
    o = DownOptions.read(force=bool(force), streams=streams, stack=stack, no_fetch=bool(no_fetch), all_projects=bool(all_projects))
    take_down(Environment.of(c), o)


def take_down(env: Environment, o: DownOptions) -> None:
    """`down`'s work for checked options: the guards, every run home (or verified in the bucket), then the
    GCP stack destroyed (an SSH host's crontab line gone, nothing else)."""
    session = Session(env, o.stack)
    sessions, docs = every_node_status(session, bucket_record=o.no_fetch)
    if len(docs) == 1 and isinstance(docs[0], GpuTrainError):
        raise docs[0]
    gcp = session.target.is_gcp
    docs, others = keep_to(docs, env.scope(o.all_projects))  # this project's runs come home here, others' stay theirs
    runs, unreachable = guard_runs(sessions, docs)
    others_running = [r for r in others if r["state"] in ACTIVE]
    running = [r["id"] for r in runs if r["state"] in ACTIVE] + [f"{r['id']} ({r.get('project') or '?'})" for r in others_running if gcp]
    if running and not o.force:
        raise GpuTrainError(f"refusing: still running: {', '.join(running)} ({CLI} stop, or {CLI} down --force)")
    if others and gcp and not o.force:  # the VM and its disk go: every project's runs count
        raise GpuTrainError(
            f"refusing: the VM holds {len(others)} run(s) of other projects, which its destroy would lose: {whose(others)}; "
            f"fetch them from their projects' folders ({CLI} fetch --run RUN there), or {CLI} down --all-projects to fetch "
            f"them here too, or {CLI} down --force to lose them; nothing was destroyed"
        )
    if unreachable and not o.force:
        raise GpuTrainError(f"refusing: cannot check every node ({'; '.join(unreachable)}); {CLI} down --force to go on")
    bucket = session.target.bucket
    if o.no_fetch:
        from remote.tasks.bucketguard import not_in_bucket

        if not bucket:
            raise UsageError(f"--no-fetch: stack {session.target.stack} has no gpu-train:bucket to keep its runs (docs/bucket.md)")
        problems = not_in_bucket([None if isinstance(d, GpuTrainError) else cast(dict[str, Any], d) for d in docs])
        problems += not_as_recorded(session.target, bucket, docs)
    else:
        problems = [f"{u} (not fetched)" for u in unreachable] + fetch_every_node(sessions, docs, o.streams)
    for s in sessions:
        s.close()
    if problems and not o.force:
        raise GpuTrainError(
            refusal(problems, "destroyed", f"{CLI} down --force") + (f" (or {CLI} down, which downloads them)" if o.no_fetch else "")
        )
    if problems:
        say("--force: going on; lost with the host:\n  " + "\n  ".join(problems))
    say(
        f"every run is verified in {bucket}; nothing downloaded"
        if o.no_fetch
        else f"fetched {len(runs)} run(s) into runs/{session.target.stack}/"
    )
    if bucket:
        say(f"the bucket {bucket} and the runs in it stay (`{CLI} fetch --from bucket` brings one home)")
    if gcp:
        destroy(session, str(bucket) if o.no_fetch else f"runs/{session.target.stack}/")
    else:
        leave_host(session, others)


def leave_host(session: Session, others: list[dict[str, Any]]) -> None:
    """`down` on an SSH stack, its runs home: nothing destroyed; what stays on the host said, and the
    @reboot line gone unless other projects' runs need it (running or interrupted: a finished one does not)."""
    print(f"stack {session.target.stack} is an SSH stack: nothing to destroy")
    root = session.target.remote_root
    stays = f"{len(others)} run(s) of other projects ({whose(others, 4)}), " if others else ""
    print(
        f"  stays on {session.target.host}: {stays}this project's runs under {root}/runs (fetched), the projects' "
        f"venvs ({root}/envs) and pushed data ({root}/data); see what they take: {CLI} ssh -- du -sh '{root}'/*"
    )
    resumable = [r for r in others if r["state"] in ACTIVE or r["state"] == INTERRUPTED]  # (what `boot` relaunches)
    if resumable:
        say(f"the @reboot line in your crontab there stays: other projects' runs resume with it ({whose(resumable, 4)})")
    else:  # other projects' finished runs need no boot step
        uncron(session)


def destroy(session: Session, kept_in: str) -> None:
    """`down` on a GCP stack, its runs home (in ``kept_in``): the data disks released, `pulumi destroy`."""
    from infra.ops import pulumi_cli
    from remote.ssh import target as targets

    try:  # the data disks are protected against a plain `pulumi destroy`; their runs are home now
        released = pulumi_cli.release_data_disks(session.target.stack)
    except RuntimeError as e:
        raise GpuTrainError(f"{e}; nothing was destroyed") from None
    if released:
        say(f"data disk(s) {', '.join(released)} released: their runs are in {kept_in}")
    from gpu_train.stack.project import pulumi_config_args

    where = pulumi_config_args(session.env.stack_file(session.target.stack))  # a stack file in the user's project
    result = subprocess.run(
        ["pulumi", "destroy", "--yes", "--stack", session.target.stack, *where],
        cwd=targets.REPO,
        env={**os.environ, **session.env.exported()},
    )
    if result.returncode != 0:
        raise CommandFailed(
            "pulumi destroy failed: the VM may still be billing; run `pulumi destroy` yourself",
            command="pulumi destroy",
            exited=result.returncode,
        )
    (session.target.cache / "outputs.json").unlink(missing_ok=True)
