"""A run started: the sync and launch on every node, and the pieces every start shares.

`train` (remote/tasks/train.py) reads its flags into a `TrainOptions` (remote/tasks/trainoptions.py)
and hands it to `start_run`, which builds each node's JobSpec (gpu_train/jobs.py), sends the code (once
per cluster: node 0 passes it on) and launches the job through the agent; what it started comes back as a `Started`. Anything
that starts runs goes through here, so a run is started one way: a sweep (remote/tasks/sweep.py)
builds its trials' job with `job_for`, plans and sends its code with `plan_code`/`push_code` and places
each trial in the bucket with `in_bucket`, as `start_run` does for a run's nodes.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from gpu_train.environment import Environment
from gpu_train.errors import GpuTrainError, Interrupted, UsageError
from gpu_train.retry import Backoff
from remote.tasks import trust
from remote.tasks.localstate import PushedManifests, SaidBefore, run_time
from remote.tasks.outcomes import all_or_none, launch_outcome
from remote.tasks.session import CLI, Cancelled, Session, on_every_node, say
from remote.tasks.trainoptions import TrainOptions

if TYPE_CHECKING:
    from gpu_train.answers import Launched, Waiting
    from gpu_train.contract import JobSpec
    from remote.ssh.target import Target
    from remote.transfer.codehop import CodeFanout
    from remote.transfer.relay import ChannelRelay
    from remote.transfer.sync import CodePlan

A = TypeVar("A")  # an agent's answer (until_ready)


@dataclass(frozen=True)
class Started:
    """A run started on every node: the cluster, its sessions (closed) and each node's launch answer."""

    cluster: Target
    sessions: list[Session]
    answers: list[Launched]
    timeout: float  # the SSH wait the run was started with (a `--follow` reuses it)


def start_run(environment: Environment, opts: TrainOptions) -> Started:
    """Sync the code and launch ``opts`` on every node of its stack; every node started, or none."""
    from gpu_train import jobs, pooljobs
    from remote.ssh import early
    from remote.transfer import codehop

    session = Session(environment, opts.stack, opts.timeout)
    cluster = session.cluster  # the stack checked: nothing is written before it passed (a project's id included)
    opened = early.start_launches(cluster)  # each launch's channel and agent start while the code is planned
    base = jobs.base_name(opts.name, opts.script, opts.command)
    run = jobs.run_id(base, run_time(cluster.cache, datetime.now()))  # (a second later than the last, when that is now)
    spec = job_for(environment, cluster, opts, run=run, base=base, nodes=len(cluster.hosts))
    spec = dataclasses.replace(spec, nproc=opts.nproc or cluster.gpus_per_node)
    chosen = spec.launcher
    ps = jobs.parameter_servers(opts.ps, cluster.parameter_servers)
    specs = jobs.node_specs(spec, [h.host for h in cluster.hosts], cluster.master_addr, opts.port, ps)
    specs = pooljobs.apply(specs, opts.pools, ps)
    for line in pooljobs.describe(opts.pools):
        say(line)
    own = all(s.container and s.container.own_program for s in specs)  # only images' own programs: no code is sent
    specs = jobs.per_node_gpus(specs, list(cluster.node_gpus), chosen, bool(opts.nproc))
    specs = notifying_node0(in_bucket(environment, cluster, specs))
    # Ctrl-C: the syncs stop and no node is told "go". (In a fan-out, once node 0 has the code and
    # passes it on, the nodes go on their own word; those that started are stopped, as below.)
    cancel = threading.Event()
    with tempfile.TemporaryDirectory(prefix="gpu-train-") as scratch:
        try:
            if own:
                plan, unchanged, pushed, fanout, sessions = None, False, None, None, session.nodes()
                images = ", ".join(dict.fromkeys(s.container.image for s in specs if s.container))
                say(f"no code is sent: the image's own program runs ({images})")
            else:
                pushed = PushedManifests(cluster.cache)
                plan, unchanged = plan_code(environment, cluster, opts.code_dir, Path(scratch), pushed, base)
                sessions = session.nodes()
                # Several nodes and new code: the laptop sends it to node 0 only, node 0 passes it on.
                fanout = codehop.CodeFanout(cluster, run, base) if len(sessions) > 1 and not unchanged else None
        except KeyboardInterrupt:
            raise Interrupted("interrupted before the code sync: nothing was sent and nothing started") from None
        try:
            answers = on_every_node(
                sessions, lambda s: _launch(s, plan, specs[s.node], unchanged, fanout, cancel, follow=opts.follow and s.node == 0), cancel
            )
        except Cancelled as e:
            raise _interrupted(sessions, e.results, run) from None
        finally:
            early.end_unused(opened)  # (an image's own program took none)
    started = all_or_none(sessions, answers, lambda s: s.call("stop", "--grace", "5", "--run", run), run)
    if pushed is not None and plan is not None:  # (an image's own program sent no code)
        for h in cluster.hosts:
            pushed.set(h, base, plan.manifest)
    for s in sessions:
        s.close()
    return Started(cluster, sessions, started, session.timeout)


def job_for(environment: Environment, cluster: Target, opts: TrainOptions, *, run: str, base: str, nodes: int) -> JobSpec:
    """The job every start sends, `train`'s and each sweep's: ``opts`` checked against its code folder,
    with the stack's Python, image (unless --image), venv and webhook, and the project's id (made only
    now: the stack passed and the options were checked). ``nodes``: how many the run spans (a sweep's
    trial: 1). A node's part (rank, GPUs, the bucket's place) is added per node, or per trial."""
    from gpu_train import jobs
    from gpu_train.identity import ProjectIds

    spec = jobs.job_spec(
        run=run,
        base=base,
        script=opts.script,
        command=opts.command,
        args=opts.args,
        env=list(opts.env),
        python=cluster.python,
        expect_gpus=cluster.expect_gpus,
        code_dir=opts.code_dir,
        cwd=environment.cwd,
        environ=os.environ,
        env_files=opts.env_files,
        pass_job_dir=opts.pass_job_dir,
        resume_args=opts.resume_args,
        resume_if=opts.resume_if,
        image=opts.image or cluster.image,
        entrypoint=opts.entrypoint,
    )
    launcher = jobs.choose_launcher(opts.launcher, nodes, opts.script)
    return dataclasses.replace(
        spec,
        launcher=launcher,
        project=opts.project or ProjectIds(environment.state_home).id_for(opts.project_folder or opts.code_dir),
        venv=cluster.venv,
        notify=notify_url(cluster.stack, cluster.notify),
        needs_torch=jobs.needs_torch(opts.code_dir, spec.script, launcher) and not spec.container,
    )


def in_bucket(environment: Environment, cluster: Target, specs: list[JobSpec], each_a_run: bool = False) -> list[JobSpec]:
    """With gpu-train:bucket, each spec's place in it (jobs.in_bucket: by its run id and node) and the
    project's pushed data. ``specs``: one run's nodes, in order; ``each_a_run``: each a run of one node (a
    sweep's trials)."""
    from gpu_train import jobs

    area, data = bucket_area(environment, cluster), pushed_data(environment, cluster.bucket, specs[0].project if specs else None)
    if each_a_run:
        return [jobs.in_bucket([s], area, cluster.bucket, data)[0] for s in specs]
    return jobs.in_bucket(specs, area, cluster.bucket, data)


def plan_code(
    environment: Environment, cluster: Target, code_dir: Path, scratch: Path, pushed: PushedManifests | None, base: str
) -> tuple[CodePlan, bool]:
    """(what the code sync sends, whether every host has it already: the manifests ``pushed`` records for
    ``base``; None: a sweep's, always sent), said, with what is left out (when that changed) and code that
    looks too heavy."""
    from remote.errors import RemoteError
    from remote.tasks import datanotes
    from remote.transfer import codesize, ignores, sync

    try:
        plan = sync.plan_code(code_dir, scratch, ((environment.project_root / "runs", "fetched results"), (environment.state_home, None)))
    except RemoteError as e:
        raise UsageError(str(e)) from None
    unchanged = pushed is not None and all(pushed.get(h, base) == plan.manifest for h in cluster.hosts)
    where = f" to {len(cluster.hosts)} nodes (once: node 0 passes it on)" if len(cluster.hosts) > 1 else ""
    say(("unchanged since the last run: " if unchanged else f"syncing{where} ") + plan.describe())
    if plan.left_out:  # said again only when it changed
        where = os.path.relpath(code_dir, environment.cwd) if code_dir != environment.cwd.resolve() else ""
        sent = datanotes.pushed_folders(environment, cluster, code_dir, plan.left_out)
        line = ignores.left_out_summary(list(plan.left_out), CLI, where=where, pushed=sent)
        if SaidBefore(cluster.cache).first_time(f"left out {code_dir}", line):
            say(line)
    if heavy := codesize.heavy_code(plan.files, plan.bytes, plan.folders, ignores.IGNORE_FILE, CLI):
        say(heavy)
    return plan, unchanged


def push_code(session: Session, relay: ChannelRelay, plan: CodePlan, staged: str, base: str, cancel: threading.Event | None = None) -> None:
    """The planned code to the node's staging area ``staged``, over the node's own connection."""
    from remote.transfer import sync

    target = session.target
    sync.push_code(target, target.host, plan, staged, base, rsh=relay.rsh(), cancel=cancel)


def node_push(
    session: Session,
    relay: ChannelRelay,
    plan: CodePlan,
    staged: str,
    base: str,
    fanout: CodeFanout | None,
    cancel: threading.Event | None = None,
) -> Callable[[], None]:
    """How the planned code reaches this node's staging area ``staged``, `train`'s and a sweep's: over
    the node's own connection; in a fan-out (several nodes, code to send), node 0 that way and then
    passing it on, the other nodes from node 0 (the laptop's push only where the hop could not)."""

    def sync_code() -> None:
        push_code(session, relay, plan, staged, base, cancel)

    if fanout is None:
        return sync_code
    if session.node == 0:
        return functools.partial(fanout.node0_sync, sync_code, relay.transport.open_session)
    threading.Thread(target=fanout.authorize, args=(session.node, session.call), daemon=True).start()
    return functools.partial(fanout.node_sync, session.node, sync_code, say)


def notifying_node0(specs: list[JobSpec]) -> list[JobSpec]:
    """The webhook (a secret) in node 0's spec only: node 0 announces the run, and the other nodes' hosts
    (and whoever controls one) never hold the URL."""
    return [s if i == 0 else dataclasses.replace(s, notify=None) for i, s in enumerate(specs)]


def notify_url(stack: str, setting: str | None) -> str | None:
    """gpu-train:notify for the host: as written, or decrypted by Pulumi when it is stored as a secret
    (`pulumi config get`); a secret that cannot be read costs the notifications, never the run."""
    from gpu_train.stack.config import SECRET_VALUE

    if setting != SECRET_VALUE:
        return setting
    from infra.ops import pulumi_cli

    try:
        code, out = pulumi_cli.run(["config", "get", "gpu-train:notify", "--stack", stack], echo=False)
    except OSError:
        code, out = 1, ""
    if code != 0 or not out.strip().startswith(("https://", "http://")):
        say(
            "notify: the webhook is a Pulumi secret this machine cannot read (pulumi config get gpu-train:notify "
            f"--stack {stack}); this run's end is not announced"
        )
        return None
    return out.strip()


def bucket_area(environment: Environment, cluster: Target) -> str:
    """The folder of the stack's bucket its runs go to (gpu_train.stack.bucket.area_of). An SSH stack with a
    bucket and no ``bucketArea`` gets one now, written into its stack file (said): two stacks of one name on
    one bucket never share runs. A GCP stack's is made by `up`, as its VM may write only where its grant
    says: until then it keeps the area its VM was granted (its name)."""
    from gpu_train.stack.bucket import AREA_KEY, area_of, new_area
    from gpu_train.stack.stackedit import add_setting

    if not cluster.bucket or cluster.bucket_area or cluster.is_gcp:
        return area_of(cluster.stack, cluster.bucket_area)
    path = environment.stack_file(cluster.stack)
    area = add_setting(path, AREA_KEY, new_area(cluster.stack))
    say(
        f"this stack's runs go to their own folder of the bucket, {area}: wrote gpu-train:{AREA_KEY}: {area} into {path} "
        "(commit it: it is how this stack finds its runs there from any clone; runs from before stay where they were)"
    )
    return area


def pushed_data(environment: Environment, bucket: str | None, project: str | None) -> tuple[dict[str, Any], ...]:
    """The manifests of what `push --to bucket` sent for this project (the user's own records)."""
    if not bucket:
        return ()
    from gpu_train.stack.bucket import data_prefix, parse_bucket
    from remote.transfer import datapush

    place = parse_bucket(bucket)
    return tuple(dict(m) for _, m in sorted(datapush.load(environment.user_home, place, data_prefix(place, project)).items()))


def _interrupted(sessions: list[Session], results: Sequence[object], run: str) -> Interrupted:
    """What Ctrl-C during the sync and launch left behind, said as it is (every node's work has ended)."""
    started = [s for s, a in zip(sessions, results, strict=True) if isinstance(a, dict)]
    if not started:
        return Interrupted(
            f"interrupted during the code sync: nothing was started ({run} was not launched; what was sent "
            "waits in the host's staging area, which a later train clears)"
        )
    if len(started) == len(sessions):
        return Interrupted(
            f"interrupted, but {run} had already started and goes on ({CLI} logs --follow --run {run} to "
            f"watch it, {CLI} stop --run {run} to stop it)"
        )
    on_every_node(started, lambda s: s.call("stop", "--grace", "5", "--run", run))  # no half a cluster
    nodes = ", ".join(str(s.node) for s in started)
    return Interrupted(f"interrupted during the launch: {run} had started on node {nodes} only and was stopped there; nothing is running")


def _launch(
    session: Session,
    plan: CodePlan | None,
    spec: JobSpec,
    unchanged: bool,
    fanout: CodeFanout | None,
    cancel: threading.Event,
    follow: bool = False,
) -> Launched:
    """Sync (over the node's own connection, or from node 0) and launch one node's part; waits for
    the driver on GCP. ``follow``: the run's log is asked for as the launch's answer comes (train --follow)."""
    try:
        return _launch_node(session, plan, spec, unchanged, fanout, cancel, follow)
    finally:
        if fanout is not None:  # a node that failed before its part of the fan-out holds no one up
            fanout.settle(session.node, "that node failed")


def _launch_node(
    session: Session,
    plan: CodePlan | None,
    spec: JobSpec,
    unchanged: bool,
    fanout: CodeFanout | None,
    cancel: threading.Event,
    follow: bool = False,
) -> Launched:
    from gpu_train import jobs
    from gpu_train.stack.agentdoc import settings_part
    from remote.ssh import agentcall, early
    from remote.transfer.relay import ChannelRelay

    target = session.target
    spec = dataclasses.replace(
        spec,
        code_manifest=plan.manifest if plan else None,
        reuse_code=unchanged,
        agent_settings=settings_part(target.agent_settings),
        go_when=fanout.go_when(session.node) if fanout is not None else None,
    )
    conn = session.connect()
    with ChannelRelay(conn.transport) as relay:
        push = node_push(session, relay, plan, spec.run_id, spec.base, fanout, cancel) if plan else None  # (none: an image's own program)

        def attempt() -> Launched | Waiting:
            nonlocal push
            asked = (lambda: early.start_follow(target, spec.run_id)) if follow else None
            try:
                answer = agentcall.launch(conn, target, jobs.encode_spec(spec), push, reuse=unchanged, launching=asked)
            except agentcall.AnswerLost as lost:
                return launch_outcome(session, spec.run_id, lost)
            if not unchanged:  # the code is staged on the host; only the launch is retried
                push = None  # (unchanged code was neither reused nor sent: "waiting" came first, so again)
            return answer

        launched = cast("Launched", until_ready(session, attempt, cancel))
        trust.host_run_id(launched["runId"], target.host)
        return launched


def until_ready(session: Session, attempt: Callable[[], A], cancel: threading.Event | None = None) -> A:
    """``attempt()``'s answer, asked again while the host answers that it waits ({"waiting": WHAT}: the NVIDIA
    driver on a GCP VM's first boot), said, with backoff, within the session's timeout: a launch's, and a
    sweep's start. Ctrl-C (``cancel``) ends the wait at once."""
    backoff = Backoff.within(session.timeout, first=5.0, cap=30, factor=1.5)
    pause = cancel or threading.Event()
    while True:
        answer = attempt()
        waiting = cast("dict[str, object]", answer).get("waiting")
        if waiting is None:
            return answer
        if pause.is_set():
            raise Interrupted("interrupted while waiting for the host")
        if backoff.left() < 0:
            raise GpuTrainError(f"gave up after {session.timeout:g} s waiting for {waiting}")
        say(f"{session.target.host}: waiting for {waiting} (the driver installs on first boot, 3-5 minutes)")
        pause.wait(backoff.next())
