"""The agent's command line: one subcommand per call, answering with one JSON document on stdout."""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from gpu_train.answers import Booted, SweepAdvanced, Ticked
from gpu_train.codec import answer
from gpu_train.contract import SCALAR_POINTS, UNPACKED

from .guard import UnsafeRoot, check_own_file, secure_root
from .store import AgentError, root_from_settings, use_settings_file

if TYPE_CHECKING:
    from .store import Scope

T = TypeVar("T")

# Each subcommand imports its own module when it runs: the agent starts on every call, from a
# zipapp (compiled anew each time: no .pyc is kept for a zip), and most calls need one module of ten.


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu-train-agent")
    p.add_argument("--root", help="REMOTE_ROOT (or from --settings)")
    p.add_argument(
        "--settings",
        dest="settings_file",
        help="root-owned settings to run with instead of REMOTE_ROOT/agent.json "
        "(the VM's units: /etc/gpu-train/agent.json, which also names the user and remoteRoot)",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    launching = sub.add_parser("launch")
    launching.add_argument(
        "spec",
        help="base64 JSON, or - to read it from the first line of stdin (kept off the "
        "command line, which every user of the host can read in /proc)",
    )
    launching.add_argument("--await-go", action="store_true")
    outcome = sub.add_parser("launch-outcome", help="whether a launch (or a sweep's start) whose answer the laptop lost started it (final)")
    outcome.add_argument("--run", required=True, help="the run's id (with --sweep: the name its code was staged under)")
    outcome.add_argument("--sweep", help="the start was this sweep's (`sweep-start`)")
    wrapping = sub.add_parser("wrap")
    wrapping.add_argument("run")

    def scoped(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """--project ID (repeatable) and --legacy NAME: the runs a default keeps to (none: every run)."""
        parser.add_argument("--project", action="append", default=[])
        parser.add_argument("--legacy")
        return parser

    reporting = scoped(sub.add_parser("status"))
    reporting.add_argument("--run")
    reporting.add_argument("--summaries", action="store_true", help="with each run's JOB_DIR and outputs summaries (for fetch)")
    reporting.add_argument("--bucket-record", action="store_true", help="with what each run verified in its bucket (down --no-fetch)")
    logging = scoped(sub.add_parser("logs"))
    logging.add_argument("--run")
    logging.add_argument("--offset", type=int, default=0)
    logging.add_argument("--lines", type=int)
    logging.add_argument("--follow", action="store_true")
    logging.add_argument("--await-run", action="store_true", help="--run is being launched: wait a moment for it to appear")
    scalars = sub.add_parser("scalars", help="runs' metrics from their event files and JSONL and CSV metrics files (contract.Scalars)")
    scalars.add_argument("--run", action="append", help="a run (repeat for more; default: every run)")
    scalars.add_argument("--tag", action="append", help="a tag, a glob of tags, or FOLDER/TAG (repeat for more; default: all)")
    scalars.add_argument("--points", type=int, default=SCALAR_POINTS, help="points per series at most (evenly thinned)")
    starting = sub.add_parser("sweep-start", help="keep a sweep (its record on stdin, the code staged) and start its first trials")
    starting.add_argument("--staged", required=True, help="the staging folder the laptop synced the code to")
    sub.add_parser("sweep-advance", help="start the next trials into free slots (boot, tick and each trial's end do it too)")
    sweeping = sub.add_parser("sweep-status", help="one row per trial: values, state, duration, a metric's last and best")
    sweeping.add_argument("--sweep", help="the sweep (default: the newest)")
    sweeping.add_argument("--metric", help="a tag, as `scalars --tag` takes it")
    sweeping.add_argument("--mode", choices=("min", "max"), default="min")
    halting = sub.add_parser("sweep-stop", help="start no more trials, stop those at work")
    halting.add_argument("--sweep", required=True)
    halting.add_argument("--grace", type=float, default=10.0)
    stopping = scoped(sub.add_parser("stop"))
    stopping.add_argument("--run")
    stopping.add_argument("--grace", type=float, default=10.0)
    booting = sub.add_parser("boot")
    booting.add_argument("--once-per-boot", action="store_true", help="do nothing if boot already ran in this boot")
    resuming = scoped(sub.add_parser("resume"))
    resuming.add_argument("--run")
    resuming.add_argument("--force", action="store_true", help="restart a single-node run even while it runs")
    resuming.add_argument("--grace", type=float, default=10.0)
    shutting = sub.add_parser("shutdown")
    shutting.add_argument("--grace", type=float, help="seconds a run under screen alone gets (default: shutdownGraceS)")
    sub.add_parser("tick")
    watching = sub.add_parser("watch", help="pass the metadata server's maintenance and preemption notices to the jobs")
    watching.add_argument("--rounds", type=int, help="stop after this many answers per value (tests)")
    sub.add_parser("fetch-serve", help="serve the laptop's fetch: JSON requests on stdin, framed answers on stdout")
    authorizing = sub.add_parser("authorize", help="let node 0 of a cluster pass the code on to this node")
    authorizing.add_argument("--key", required=True, help="the cluster's public key: ssh-ed25519 BASE64")
    authorizing.add_argument("--name", required=True, help="the stack's name (the line's comment)")
    authorizing.add_argument("--from", dest="source", help="node 0's address: the key works from there only")
    authorizing.add_argument("--run", help="the run whose code the key may receive (its forced command)")
    authorizing.add_argument("--base", help="the run's base name (its last code, for unchanged files)")
    unauthorizing = sub.add_parser("unauthorize", help="take a train's cluster key away again")
    unauthorizing.add_argument("--key", required=True, help="the cluster's public key: ssh-ed25519 BASE64")
    receiving = sub.add_parser("receive-code", help="a cluster key's forced command: receive one run's code")
    receiving.add_argument("--run", required=True)
    receiving.add_argument("--base", required=True)
    sub.add_parser("relay-code", help="node 0: rsync a run's staged code to the other nodes (request on stdin)")
    uploading = sub.add_parser("upload", help="a run's JOB_DIR to its bucket until stdin closes (the wrapper starts it)")
    uploading.add_argument("run")
    sub.add_parser("bucket-data", help="the project's data from the bucket into DATA_DIR (before a job)").add_argument("run")
    checking = sub.add_parser("bucket-check", help="can this host's uploader use the bucket (`check`)")
    checking.add_argument("--bucket", required=True)
    checking.add_argument("--prefix", default="", help="where the stack's runs go: PREFIX/.gpu-train-runs/STACK/")
    checking.add_argument("--python", help="the stack's gpu-train:python (default: detected as for a run)")
    probing = sub.add_parser("bucket-probe", help="(bucket-check's, under the job's Python)")
    probing.add_argument("bucket")
    probing.add_argument("name")
    configuring = sub.add_parser("configure")
    configuring.add_argument("settings", help="base64 JSON written to REMOTE_ROOT/agent.json")
    configuring.add_argument("--cron", action="store_true", help="install boot (and tick) in the user's crontab")
    sub.add_parser("uncron", help="take this root's lines out of the user's crontab (down)")
    pruning = scoped(sub.add_parser("prune", help="free finished runs' code copies (their outputs stay)"))
    pruning.add_argument("--run")
    pruning.add_argument("--dry-run", action="store_true")
    return p


def main(argv: list[str]) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        if args.settings_file:  # a VM's unit: root's own copy and settings name the user's REMOTE_ROOT
            root = root_from_settings(use_settings_file(args.settings_file))
        elif args.root:
            root = os.path.abspath(os.path.expanduser(args.root))
        else:
            p.error("--root or --settings is required")
        installed = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the zipapp, when run from one
        # Root's own copy on a VM (outside REMOTE_ROOT, root-owned) may read the login user's root, as root
        # or as the user (the units); anyone else runs only in a REMOTE_ROOT of their own, from an agent
        # file they wrote.
        outside = os.path.isfile(installed) and not installed.startswith(root + os.sep)
        elsewhere = outside and (os.geteuid() == 0 or (bool(args.settings_file) and os.stat(installed).st_uid == 0))
        root = secure_root(root, own=not elsewhere)  # umask 077; ours alone, or a refusal naming why
        if (os.path.isfile(installed) or os.path.basename(installed).startswith(UNPACKED)) and not elsewhere:
            check_own_file(installed)  # the zipapp, or the bootstrap's folder of it (agent/bundle.py)
    except (UnsafeRoot, AgentError, OSError, KeyError) as e:
        print(json.dumps({"error": str(e)}), file=sys.stderr if args.cmd == "logs" else sys.stdout)
        return 2
    try:
        result = run(root, args)
    except AgentError as e:  # `logs` streams the log on stdout, so its errors go to stderr
        print(json.dumps({"error": str(e)}), file=sys.stderr if args.cmd == "logs" else sys.stdout)
        return 2
    if isinstance(result, int):  # streamed its own output
        return result
    print(json.dumps(result))
    return 0


def scope_of(args: argparse.Namespace) -> Scope:
    """The command's scope, (ids, legacy), from --project and --legacy (store.EVERY_RUN when neither)."""
    return (tuple(getattr(args, "project", None) or ()), getattr(args, "legacy", None))


def run(root: str, args: argparse.Namespace) -> Mapping[str, Any] | int:
    """The subcommand: its JSON answer, or the exit status of one that writes its own output."""
    if args.cmd == "wrap":
        from .wrap import cmd_wrap

        return cmd_wrap(root, args.run)
    if args.cmd in ("upload", "bucket-data"):
        from .datapull import pull_data
        from .upload import serve

        return serve(root, args.run) if args.cmd == "upload" else pull_data(root, args.run)
    if args.cmd in ("bucket-check", "bucket-probe"):
        from .bucketcheck import cmd_bucket_check, probe

        if args.cmd == "bucket-probe":
            return probe(args.bucket, args.name)
        return dict(cmd_bucket_check(root, args.bucket, args.prefix, args.python))
    if args.cmd == "fetch-serve":
        from .fetchserve import cmd_fetch_serve

        return cmd_fetch_serve(root)
    if args.cmd in ("relay-code", "authorize", "unauthorize", "receive-code"):
        from . import cluster

        if args.cmd == "receive-code":
            return cluster.cmd_receive_code(root, args.run, args.base)
        if args.cmd == "unauthorize":
            return cluster.cmd_unauthorize(args.key)
        if args.cmd == "authorize":
            return cluster.cmd_authorize(args.key, args.name, args.source, root, args.run, args.base)
        return cluster.cmd_relay_code(root, cluster.read_doc())
    if args.cmd in ("logs", "status"):
        from .status import cmd_logs, cmd_status

        return (
            cmd_logs(root, args.run, args.offset, args.lines, args.follow, scope_of(args), args.await_run)
            if args.cmd == "logs"
            else cmd_status(root, args.run, args.summaries, args.bucket_record, scope_of(args))
        )
    if args.cmd == "scalars":
        from .metrics import cmd_scalars

        return cmd_scalars(root, args.run, args.tag, args.points)
    if args.cmd.startswith("sweep-"):
        from . import sweep

        if args.cmd == "sweep-start":
            return sweep.cmd_sweep_start(root, json.loads(sys.stdin.readline()), args.staged)
        if args.cmd == "sweep-status":
            return sweep.cmd_sweep_status(root, args.sweep, args.metric, args.mode)
        if args.cmd == "sweep-stop":
            return sweep.cmd_sweep_stop(root, args.sweep, args.grace)
        return answer(SweepAdvanced, started=[s["runId"] for s in sweep.advance(root)])
    if args.cmd == "launch":
        from .launch import cmd_launch

        sent = sys.stdin.readline() if args.spec == "-" else args.spec
        if not sent.strip():  # a launch opened early that the laptop never used (remote/ssh/early.py)
            raise AgentError("no job spec came: nothing was launched")
        return cmd_launch(root, json.loads(base64.b64decode(sent)), args.await_go)
    if args.cmd == "launch-outcome":
        if args.sweep is not None:
            from .sweep import cmd_sweep_outcome

            return cmd_sweep_outcome(root, args.sweep, args.run)
        from .outcome import cmd_launch_outcome

        return cmd_launch_outcome(root, args.run)
    if args.cmd == "watch":
        from .watch import cmd_watch

        return cmd_watch(root, args.rounds)
    from . import lifecycle

    if args.cmd == "stop":
        return lifecycle.cmd_stop(root, args.run, args.grace, scope_of(args))
    if args.cmd == "boot":  # interrupted trials resumed in their slots, then the queues go on
        return with_queue(root, Booted, lifecycle.cmd_boot(root, args.once_per_boot))
    if args.cmd == "resume":
        return lifecycle.cmd_resume(root, args.run, args.grace, scope_of(args), args.force)
    if args.cmd == "shutdown":
        return lifecycle.cmd_shutdown(root, args.grace)
    if args.cmd == "tick":
        return with_queue(root, Ticked, lifecycle.cmd_tick(root))
    if args.cmd == "uncron":
        return lifecycle.cmd_uncron(root)
    if args.cmd == "prune":
        from .prune import cmd_prune

        return cmd_prune(root, args.run, args.dry_run, scope_of(args))
    return lifecycle.cmd_configure(root, json.loads(base64.b64decode(args.settings)), args.cron)


def with_queue(root: str, kind: Callable[..., T], result: Mapping[str, Any]) -> T:
    """``result`` and the sweeps' queues advanced (a slot that freed while no trial's end could say so);
    not by the VM's root timer: trials run as the login user, whose boot unit and trials' ends advance them."""
    from .store import machine_mode
    from .sweep import advance

    if machine_mode() and os.geteuid() == 0:
        return answer(kind, **result)

    started = [s["runId"] for s in advance(root)]
    return answer(kind, **result, **({"sweepStarted": started} if started else {}))
