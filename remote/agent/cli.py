"""The agent's command line: one subcommand per call, answering with one JSON document on stdout."""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys

from .fetchserve import cmd_fetch_serve
from .guard import UnsafeRoot, check_own_file, secure_root
from .launch import cmd_launch
from .lifecycle import cmd_boot, cmd_configure, cmd_resume, cmd_shutdown, cmd_stop, cmd_tick
from .status import cmd_logs, cmd_status
from .store import AgentError
from .wrap import cmd_wrap


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpu-train-agent")
    p.add_argument("--root", required=True)
    sub = p.add_subparsers(dest="cmd", required=True)
    launching = sub.add_parser("launch")
    launching.add_argument("spec", help="base64 JSON, or - to read it from the first line of stdin (kept off the "
                           "command line, which every user of the host can read in /proc)")
    launching.add_argument("--await-go", action="store_true")
    wrapping = sub.add_parser("wrap")
    wrapping.add_argument("run")
    reporting = sub.add_parser("status")
    reporting.add_argument("--run")
    reporting.add_argument("--summaries", action="store_true", help="with each run's JOB_DIR summary (for fetch)")
    logging = sub.add_parser("logs")
    logging.add_argument("--run")
    logging.add_argument("--offset", type=int, default=0)
    logging.add_argument("--lines", type=int)
    logging.add_argument("--follow", action="store_true")
    stopping = sub.add_parser("stop")
    stopping.add_argument("--run")
    stopping.add_argument("--grace", type=float, default=10.0)
    sub.add_parser("boot")
    resuming = sub.add_parser("resume")
    resuming.add_argument("--run")
    resuming.add_argument("--grace", type=float, default=10.0)
    shutting = sub.add_parser("shutdown")
    shutting.add_argument("--grace", type=float, default=25.0)
    sub.add_parser("tick")
    sub.add_parser("fetch-serve", help="serve `fab fetch`: JSON requests on stdin, framed answers on stdout")
    configuring = sub.add_parser("configure")
    configuring.add_argument("settings", help="base64 JSON written to REMOTE_ROOT/agent.json")
    configuring.add_argument("--cron", action="store_true", help="install boot (and tick) in the user's crontab")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        installed = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the zipapp, when run from one
        root = os.path.abspath(os.path.expanduser(args.root))
        # Root's own copy on a VM (outside REMOTE_ROOT) may read the login user's root; anyone else runs
        # only in a REMOTE_ROOT of their own, from an agent file they wrote.
        elsewhere = os.geteuid() == 0 and os.path.isfile(installed) and not installed.startswith(root + os.sep)
        root = secure_root(root, own=not elsewhere)  # umask 077; ours alone, or a refusal naming why
        if os.path.isfile(installed) and not elsewhere:
            check_own_file(installed)
    except (UnsafeRoot, OSError) as e:
        print(json.dumps({"error": str(e)}), file=sys.stderr if args.cmd == "logs" else sys.stdout)
        return 2
    try:
        if args.cmd == "wrap":
            return cmd_wrap(root, args.run)
        if args.cmd == "fetch-serve":
            return cmd_fetch_serve(root)
        if args.cmd == "logs":
            return cmd_logs(root, args.run, args.offset, args.lines, args.follow)
        if args.cmd == "launch":
            spec = sys.stdin.readline() if args.spec == "-" else args.spec
            result = cmd_launch(root, json.loads(base64.b64decode(spec)), args.await_go)
        elif args.cmd == "status":
            result = cmd_status(root, args.run, args.summaries)
        elif args.cmd == "stop":
            result = cmd_stop(root, args.run, args.grace)
        elif args.cmd == "boot":
            result = cmd_boot(root)
        elif args.cmd == "resume":
            result = cmd_resume(root, args.run, args.grace)
        elif args.cmd == "shutdown":
            result = cmd_shutdown(root, args.grace)
        elif args.cmd == "tick":
            result = cmd_tick(root)
        else:
            result = cmd_configure(root, json.loads(base64.b64decode(args.settings)), args.cron)
    except AgentError as e:  # `logs` streams the log on stdout, so its errors go to stderr
        print(json.dumps({"error": str(e)}), file=sys.stderr if args.cmd == "logs" else sys.stdout)
        return 2
    print(json.dumps(result))
    return 0
