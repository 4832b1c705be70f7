"""`dashboard` and `report`: every stack, run and GPU of the project on one page, live or as one file.

The page is ``remote/dashboard/``'s; what it shows is ``gpu_train.views.board``'s, from the same
documents `ls`, `status` and `fetch` read.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from invoke import Context, task

from gpu_train.environment import Environment
from gpu_train.errors import GpuTrainError, UsageError
from remote.tasks.session import say
from remote.tasks.taskoptions import DASHBOARD_INTERVAL_S, DashboardOptions

if TYPE_CHECKING:
    from remote.dashboard.poll import Watch

REPORT_LOG_LINES = 200  # a run's last lines in a report
REPORT_LOG_RUNS = 40  # the newest runs whose logs a report carries
REPORT_LOG_BYTES = 1 << 20  # the most of one run's log a report keeps (its tail), whatever a host sends
REPORT_LOG_S = 30.0  # the longest one run's log is read for a report


class Tail:
    """The last ``limit`` bytes written, in memory bounded by twice that whatever is written."""

    def __init__(self, limit: int):
        self.limit, self._kept = limit, bytearray()

    def write(self, data: bytes) -> None:
        self._kept += data[-self.limit :]
        if len(self._kept) > 2 * self.limit:
            del self._kept[: -self.limit]

    def value(self) -> bytes:
        return bytes(self._kept[-self.limit :])


def can_open_browser(platform: str, environ: dict[str, str]) -> bool:
    """Whether a graphical browser can be opened here: macOS and Windows, or a desktop session. Elsewhere
    (a server over SSH) Python would start a text browser in the terminal: the URL is printed instead."""
    return platform in ("darwin", "win32") or bool(environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY"))


def opener_file(url: str) -> Path:
    """A file that sends the browser on to ``url``: the browser is started with this file's name, never the
    URL (a command line is readable by every local user; this file, in a 0700 folder, is this user's only)."""
    import html
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="gpu-train-dashboard-"))  # 0700
    path = folder / "open.html"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(
            f'<!doctype html><meta http-equiv="refresh" content="0;url={html.escape(url)}"><a href="{html.escape(url)}">the dashboard</a>\n'
        )
    return path


def _watch(env: Environment, interval: float) -> Watch:
    from gpu_train.catalog.loader import load_catalog
    from gpu_train.stack.project import project_name
    from remote.dashboard.poll import Watch

    return Watch(env, load_catalog(), interval, project_name(env.project_root), scope=env.scope())


@task(
    help={
        "interval": f"seconds between two looks at each stack (default {DASHBOARD_INTERVAL_S:g}; one agent call per node each)",
        "port": "local port (default: any free one)",
        "address": "the loopback address to listen on (default 127.0.0.1)",
        "no_browser": "print the URL only; do not open a browser",
        "json": 'print {"url": ...}',
    }
)
def dashboard(
    c: Context,
    interval: str | None = None,
    port: str | None = None,
    address: str = "127.0.0.1",
    no_browser: bool = False,
    json_: bool = False,
) -> None:
    """Every stack, run and GPU of this project in your browser, live: costs, warnings, logs and curves.

    A local page (a secret in its URL, made at each start, that opens one browser session once; another
    browser gets a fresh link printed here), opened in your browser; Ctrl-C stops it.
    Each stack is asked once per interval, however many tabs are open, and not at all while none looks.
    """
    o = DashboardOptions.read(interval=interval, port=port, address=address, no_browser=bool(no_browser), as_json=bool(json_))
    show_dashboard(Environment.of(c), o)


def show_dashboard(env: Environment, o: DashboardOptions) -> None:
    """`dashboard`'s work for checked options: the page served on o.address until Ctrl-C, a browser opened
    on it where there is a desktop."""
    from remote.dashboard.server import Dashboard

    try:
        board = Dashboard(_watch(env, o.interval), o.address, o.port, tell=say).start()
    except OSError as e:
        raise GpuTrainError(f"the dashboard cannot listen on {o.address}:{o.port}: {e.strerror or e}") from None
    print(json.dumps({"url": board.url}) if o.as_json else board.url, flush=True)
    stacks = len(board.watch.pollers)
    say(f"dashboard of {stacks} stack(s), each asked every {o.interval:g} s while a page is open; Ctrl-C stops it")
    opener = None
    if not o.no_browser:
        if can_open_browser(sys.platform, dict(os.environ)):
            import webbrowser

            opener = opener_file(board.url)
            webbrowser.open(opener.as_uri())
        else:
            say(f"no desktop here: open the URL in your browser (from another machine: ssh -L {board.port}:{o.address}:{board.port} HOST)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        board.stop()
        if opener is not None:
            shutil.rmtree(opener.parent, ignore_errors=True)
    say("dashboard stopped")


@task(
    help={
        "output": "the HTML file to write (default: runs/PROJECT-report-YYYYmmdd-HHMM.html in the project, beside fetched runs)",
        "json": 'print {"path": ...}',
    }
)
def report(c: Context, output: str | None = None, json_: bool = False) -> None:
    """The dashboard as one self-contained HTML file (no network needed to open it): for a lab notebook.

    Every stack asked once; each run's last log lines and its curves, a sweep's best trial."""
    from gpu_train.atomic import atomic_write
    from remote.dashboard import page

    env = Environment.of(c)
    watch = _watch(env, 0)
    doc = snapshot(env, watch)
    stamp = time.strftime("%Y%m%d-%H%M", time.localtime(doc["at"]))
    path = Path(output) if output else report_path(env.project_root, doc["project"], stamp)
    if path.is_dir():
        raise UsageError(f"--output {path}: a folder; name a file (e.g. {path / 'report.html'})")
    try:
        if not output:
            path.parent.mkdir(parents=True, exist_ok=True)  # runs/, as fetch makes it
        atomic_write(path, page.report(doc))
    except OSError as e:
        raise GpuTrainError(f"cannot write {path}: {e.strerror or e}") from None
    print(json.dumps({"path": str(path)}) if json_ else path, flush=True)
    say(f"{len(doc['stacks'])} stack(s), {len(doc['runs'])} run(s); open it in any browser, offline")


def report_path(project_root: Path, project: str, stamp: str) -> Path:
    """Where a report goes unless --output says: the project's runs/, beside the fetched runs (runs/STACK/RUN),
    which the code sync never sends (launching.plan_code): a report holds every stack's runs and logs, and
    in the project's root it went to the host with every later `train`."""
    return project_root / "runs" / f"{project}-report-{stamp}.html"


def snapshot(env: Environment, watch: Watch) -> dict[str, Any]:
    """One look at every stack, with the newest runs' last log lines, every run's curves, each sweep's best."""
    from gpu_train.views.board import best_trial, sweep_of
    from remote.dashboard.curves import Curves
    from remote.tasks.runlogs import _stream_log
    from remote.tasks.session import Session

    doc = {**watch.look_once(), "actions": [], "live": False, "logs": {}, "curves": {}, "best": {}}
    curves = Curves(env)
    for stack in {r["stack"] for r in doc["runs"]}:
        runs = watch.host_runs(stack)
        for run_id, series in curves.of(stack, runs)["runs"].items():
            doc["curves"][f"{stack}/{run_id}"] = series
        for sweep in {sweep_of(r) for r in runs} - {None}:
            trials = {r["id"]: doc["curves"].get(f"{stack}/{r['id']}", []) for r in runs if sweep_of(r) == sweep}
            doc["best"][f"{stack}/{sweep}"] = best_trial(trials)
    for r in doc["runs"][:REPORT_LOG_RUNS]:
        kept = Tail(REPORT_LOG_BYTES)
        session = Session(env, r["stack"])
        try:
            _stream_log(session, r["id"], REPORT_LOG_LINES, False, kept.write, lambda: None, deadline=time.monotonic() + REPORT_LOG_S)
        except GpuTrainError as e:
            kept.write(f"\n(the log could not be read: {e})".encode())
        finally:
            session.close()
        from remote.dashboard.logs import plain

        doc["logs"][f"{r['stack']}/{r['id']}"] = plain(kept.value().decode("utf-8", "replace"))
    return doc
