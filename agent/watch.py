"""The early warning: Compute Engine's metadata server announces a host maintenance (about an hour
ahead on GPU VMs: ``instance/maintenance-event`` becomes ``TERMINATE_ON_HOST_MAINTENANCE``) and a
preemption (``instance/preempted`` becomes ``TRUE``; with ``scheduling.preemptionNoticeDuration``
before the shutdown starts); and, from its own clock, the stop maxRunHours brings (Flex-start's end
among them): RUN_LIMIT_NOTICE_S before boot + maxRunHours. `watch` (the VM's gpu-train-watch.service) follows both with the
server's hanging GETs and tells each running job: the file ``runs/RUN/notice`` (the job's
``$GPU_TRAIN_NOTICE``) exists while a warning stands, with the event in it, and the run's log says
so. The SIGTERM comes later, at the shutdown, as always. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from gpu_train.contract import (
    ACTIVE,
    METADATA_URL,
    METADATA_URL_ENV,
    NOTICE,
    RUN_LIMIT,
    RUN_LIMIT_NOTICE_S,
    AgentSettings,
    run_limit_at,
)
from gpu_train.recovery import COMPUTE_URL_ENV

from .procs import uptime_s
from .status import effective_state
from .store import agent_log, now, read_json, read_state, run_dirs, settings, write_json

WATCHED = {"instance/maintenance-event": "NONE", "instance/preempted": "FALSE"}
PREEMPTED = "PREEMPTED"  # the event a notice names for ``instance/preempted`` = TRUE
RUN_LIMIT_KEY = "gpu-train/run-limit"  # not a metadata path: the stop time, once its warning is due


COMPUTE_URL = "https://compute.googleapis.com"


def metadata_base(conf: AgentSettings) -> str:
    """The metadata server's base URL: the setting, else $GPU_TRAIN_METADATA_URL, else Compute Engine's."""
    base = conf.metadata_url or os.environ.get(METADATA_URL_ENV) or METADATA_URL
    return base if base.endswith("/") else base + "/"


def metadata_get(url: str, timeout: float, wait_etag: str | None = None, wait_s: int = 60) -> tuple[str, str]:
    """(value, etag); with ``wait_etag`` the server holds the request until the value changes from it."""
    if wait_etag is not None:
        query = urllib.parse.urlencode({"wait_for_change": "true", "last_etag": wait_etag, "timeout_sec": wait_s})
        url = f"{url}?{query}"
    req = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode().strip(), r.headers.get("ETag", "")


def metadata_value(conf: AgentSettings, path: str, timeout: float = 2) -> str:
    """One value, or '' when there is no metadata server (off GCP) or it does not answer."""
    try:
        return metadata_get(metadata_base(conf) + path, timeout)[0]
    except (OSError, ValueError):
        return ""


def own_instance(conf: AgentSettings, timeout: float = 5) -> dict[str, Any] | None:
    """This VM's labels as the Compute API has them (instances.get with ``fields=labels``, the VM's own token
    and its compute.readonly scope; the stack grants its account compute.instances.get on this instance
    only where a recovery function writes there), or None when it cannot be asked."""
    import json

    project, zone, name = (metadata_value(conf, p) for p in ("project/project-id", "instance/zone", "instance/name"))
    try:
        token = json.loads(metadata_value(conf, "instance/service-accounts/default/token") or "{}").get("access_token")
    except ValueError:
        return None
    if not (project and zone and name and token):
        return None
    base = (os.environ.get(COMPUTE_URL_ENV) or COMPUTE_URL).rstrip("/")
    url = f"{base}/compute/v1/projects/{project}/zones/{zone.rsplit('/', 1)[-1]}/instances/{name}?fields=labels"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"}), timeout=timeout) as r:
            doc = json.loads(r.read() or b"{}")
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def notice_for(values: dict[str, str]) -> dict[str, Any] | None:
    """The warning the metadata values amount to (None: no warning stands)."""
    events = []
    maintenance = values.get("instance/maintenance-event", "NONE").strip()
    if maintenance and maintenance.upper() != "NONE":
        events.append(maintenance)
    if values.get("instance/preempted", "FALSE").strip().upper() == "TRUE":
        events.append(PREEMPTED)
    stops_at = values.get(RUN_LIMIT_KEY)
    if stops_at:
        events.append(RUN_LIMIT)
    if not events:
        return None
    return {"event": events[0], "events": events, **({"stopsAt": float(stops_at)} if stops_at else {})}


def run_limit_warning(conf: AgentSettings, at: float, uptime: float | None) -> tuple[float, float] | None:
    """(when to warn, when the VM stops) for a VM with maxRunHours; None for none (or off GCP)."""
    stop = run_limit_at(at, uptime, conf.max_run_hours) if conf.gcp else None
    return None if stop is None else (stop - RUN_LIMIT_NOTICE_S, stop)


def told_preempted(run_dir: str) -> bool:
    """This run was told of a preemption (its notice, which a relaunch removes, names it)."""
    notice = read_json(os.path.join(run_dir, NOTICE)) or {}
    return PREEMPTED in (notice.get("events") or [])


def publish(root: str, notice: dict[str, Any] | None) -> list[str]:
    """Give (or take back) the warning to every running run; the runs newly told."""
    told = []
    for run_dir in run_dirs(root):
        path = os.path.join(run_dir, NOTICE)
        if notice is None:
            with contextlib.suppress(OSError):
                os.remove(path)
            continue
        if effective_state(read_state(run_dir)) not in ACTIVE:
            continue
        current = read_json(path)
        if current and current.get("events") == notice["events"]:
            continue
        write_json(path, {**notice, "at": now()})
        with contextlib.suppress(OSError), open(os.path.join(run_dir, "log"), "ab") as log:
            log.write(f"[gpu-train] early warning: {', '.join(notice['events'])} ($GPU_TRAIN_NOTICE)\n".encode())
        told.append(os.path.basename(run_dir))
    if told and notice is not None:  # (told is only ever filled with a notice)
        agent_log(root, f"early warning {', '.join(notice['events'])}: told {', '.join(told)}")
    return told


def cmd_watch(root: str, rounds: int | None = None) -> dict[str, Any]:
    """Follow the watched values (each in a thread holding a hanging GET) and publish on each answer;
    a held request times out after a minute and is made again, so a run started later is told too."""
    conf = settings(root)
    base = metadata_base(conf)
    values = dict(WATCHED)
    lock = threading.Lock()
    done = threading.Event()

    def follow(path: str) -> None:
        etag: str | None = None
        count = 0
        while not done.is_set():
            try:
                value, etag = metadata_get(base + path, timeout=75, wait_etag=etag, wait_s=60)
            except (OSError, ValueError):
                etag = None
                time.sleep(5)
                continue
            with lock:
                values[path] = value
                publish(root, notice_for(values))
            count += 1
            if rounds is not None and count >= rounds:
                return

    def run_limit(warn_at: float, stop: float) -> None:
        if done.wait(max(0.0, warn_at - time.time())):
            return
        with lock:
            values[RUN_LIMIT_KEY] = repr(stop)
            publish(root, notice_for(values))

    limit = run_limit_warning(conf, time.time(), uptime_s())
    if limit is not None and limit[0] <= time.time():  # due already (a watcher started late): now
        values[RUN_LIMIT_KEY] = repr(limit[1])
        publish(root, notice_for(values))
    elif limit is not None:
        threading.Thread(target=run_limit, args=limit, daemon=True).start()
    threads = [threading.Thread(target=follow, args=(p,), daemon=True) for p in WATCHED]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    return {"values": values}
