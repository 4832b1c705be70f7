"""The recovery function as it runs in Google's cloud: the thin Compute API layer around ``recovery``.

``on_event`` is the Cloud Run function's entry point (a CloudEvent of Pub/Sub's messagePublished,
whose message is the log sink's LogEntry). It asks the Compute API about every node, does what
``recovery.plan`` says, keeps each node's record in its labels, tells the webhook, and raises when
the event should come again (the trigger's retry policy: exponential backoff, 10 s to 600 s, for up
to 24 hours; the stack's ``recoverHours`` ends it sooner, and it gives up before the window closes).
A call Google refuses raises too (an error to the trigger: delivered again), never passes as done.
The identity it runs as may get, start, stop and set the labels of the stack's instances only (labels
need no actAs on the VM's service account; metadata would). Standard library only.
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from gpu_train import recovery
from gpu_train.recovery import DONE, RETRY, Event

from . import notify

COMPUTE_URL = "https://compute.googleapis.com"
TOKEN_PATH = "instance/service-accounts/default/token"
METADATA_URL = "http://metadata.google.internal/computeMetadata/v1/"


class Retry(Exception):
    """The event is not settled yet: the trigger delivers it again later."""


class Compute:
    """The few Compute API calls the function makes, with a token from the metadata server."""

    def __init__(self, project: str, zone: str, base: str = COMPUTE_URL, metadata: str = METADATA_URL, poll_s: float = 1.0):
        self.prefix = f"{base.rstrip('/')}/compute/v1/projects/{project}/zones/{zone}"
        self.metadata = metadata if metadata.endswith("/") else metadata + "/"
        self.poll_s = poll_s
        self._token: tuple[str, float] | None = None

    def token(self) -> str:
        if self._token is None or self._token[1] < time.time() + 60:
            req = urllib.request.Request(self.metadata + TOKEN_PATH, headers={"Metadata-Flavor": "Google"})
            with urllib.request.urlopen(req, timeout=10) as r:
                doc = json.loads(r.read())
            self._token = (doc["access_token"], time.time() + float(doc.get("expires_in", 300)))
        return self._token[0]

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON document): Google's error documents come back, not raised."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.prefix + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token()}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            try:
                return e.code, json.loads(e.read() or b"{}")
            except ValueError:
                return e.code, {}

    def get(self, name: str) -> dict[str, Any] | None:
        status, doc = self.call("GET", f"/instances/{name}")
        if status == 404:
            return None
        if status >= 400:
            raise Retry(f"instances.get {name}: {status} {(doc.get('error') or {}).get('message', '')}")
        return doc

    def wait(self, operation: dict[str, Any], deadline: float) -> dict[str, Any]:
        """The operation as zoneOperations.get has it once DONE (or at ``deadline``)."""
        while operation.get("status") != "DONE" and time.time() < deadline:
            time.sleep(self.poll_s)
            status, doc = self.call("GET", f"/operations/{operation.get('name')}")
            if status < 400:
                operation = doc
        return operation

    def set_record(self, name: str, inst: dict[str, Any], record: dict[str, Any]) -> None:
        """Keep ``record`` in the instance's labels (every other label as it is; the label fingerprint
        guards against a concurrent change: read again on 412). Any other refusal raises ``Retry``."""
        for _ in range(3):
            labels = {k: v for k, v in (inst.get("labels") or {}).items() if not k.startswith(recovery.RECORD_PREFIX)}
            body = {"labels": {**labels, **recovery.record_labels(record)}, "labelFingerprint": inst.get("labelFingerprint", "")}
            status, doc = self.call("POST", f"/instances/{name}/setLabels", body)
            if status < 400:
                inst["labels"], inst["labelFingerprint"] = body["labels"], None  # a new fingerprint: read it again to write again
                return
            if status != 412:
                raise Retry(f"instances.setLabels {name}: {status} {(doc.get('error') or {}).get('message', '')}")
            inst = self.get(name) or {}
        raise Retry(f"instances.setLabels {name}: its labels kept changing (412 three times)")

    def stop(self, name: str, inst: dict[str, Any]) -> None:
        """instances.stop, discarding Local SSD where the VM has some (the API refuses a stop of such a VM
        that does not say); a refusal raises ``Retry``."""
        query = "?discardLocalSsd=true" if recovery.has_local_ssd(inst) else ""
        status, doc = self.call("POST", f"/instances/{name}/stop{query}")
        if status >= 400:
            raise Retry(f"instances.stop {name}: {status} {(doc.get('error') or {}).get('message', '')}")


def settings_from_env(env: dict[str, str]) -> dict[str, Any]:
    return {
        "stack": env.get(recovery.STACK_ENV, ""),
        "project": env.get(recovery.PROJECT_ENV) or None,
        "zone": env.get(recovery.ZONE_ENV) or None,
        "nodes": [n for n in env.get(recovery.NODES_ENV, "").split(",") if n],
        "hours": _number(env, recovery.HOURS_ENV, 24),
        "notify": env.get(recovery.NOTIFY_ENV) or None,
        "compute": env.get(recovery.COMPUTE_URL_ENV) or COMPUTE_URL,
        "metadata": env.get(recovery.METADATA_URL_ENV) or METADATA_URL,
        "opWaitS": _number(env, recovery.OP_WAIT_S_ENV, 150),
        "opPollS": _number(env, recovery.OP_POLL_S_ENV, 1),
    }


def _number(env: dict[str, str], name: str, default: float) -> float:
    value = env.get(name) or ""
    try:
        return float(value) if value else default
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number: set it to one (e.g. {default:g}), or unset it") from None


def recover(event: Event, conf: dict[str, Any], now: float | None = None, api: Compute | None = None) -> tuple[str, str]:
    """One invocation for ``event``: (DONE or RETRY, why)."""
    now = time.time() if now is None else now
    nodes, stack = conf["nodes"], conf["stack"]
    if (conf.get("project"), conf.get("zone")) != (event.project, event.zone):
        return DONE, f"{event.project}/{event.zone} is not stack {stack}'s project and zone: ignored"
    api = api or Compute(conf["project"], conf["zone"], conf["compute"], conf["metadata"], conf.get("opPollS", 1))
    if event.instance not in nodes:
        return DONE, f"{event.instance} is not a VM of stack {stack}"
    found = {n: api.get(n) for n in nodes}
    p = recovery.plan(event, nodes, found)

    def say(text: str) -> bool:
        return notify.send(conf["notify"], f"gpu-train {stack}: {text}")

    head = found.get(event.instance)
    record = recovery.record_of(head) if head else {}
    attempts = int(record.get("attempts", 0)) if recovery.of_event(record, event) else 0
    # Nodes this event took down that are up again (a start that finished after the last look).
    late = []
    for name in nodes:
        inst = found.get(name)
        rec = recovery.record_of(inst) if inst else {}
        if (
            inst
            and inst.get("status") == "RUNNING"
            and recovery.of_event(rec, event)
            and rec.get("state") != "resumed"
            and rec.get("state") != "stopping for the group"
        ):
            api.set_record(name, inst, recovery.updated_record(rec, event, "resumed", now))
            late.append(name)
    if late and not (p.start or p.stop or p.waiting):
        say(
            f"back: {', '.join(late)} started again after the {event.kind} at "
            f"{recovery.clock(event.at, local=False)} UTC (the runs resume at boot)"
        )
    todo = p.start or p.stop or p.waiting
    if not todo:
        return DONE, "; ".join(f"{n}: {w}" for n, w in p.why.items())
    if not recovery.of_event(record, event):
        say(f"{event.instance} {event.kind} at {recovery.clock(event.at, local=False)} UTC; bringing it back")
    reason = recovery.give_up_reason(event, now, conf["hours"], attempts)
    if reason:
        for name in sorted(set(p.start + p.stop + p.waiting + [event.instance])):
            if (doc := found.get(name)) is not None:
                api.set_record(name, doc, recovery.updated_record(recovery.record_of(doc), event, "gave up", now, reason))
        say(f"gave up bringing {event.instance} back: {reason}")
        return DONE, reason
    for name in p.stop:
        doc = found[name] or {}  # planned to stop: it exists
        api.stop(name, doc)
        api.set_record(name, doc, recovery.updated_record(recovery.record_of(doc), event, "stopping for the group", now, p.why[name]))
    if p.stop or p.waiting:
        return RETRY, "waiting for the cluster's other nodes to stop: " + ", ".join(p.stop + p.waiting)
    return start_all(api, event, p.start, found, conf, now, say)


def start_all(
    api: Compute, event: Event, names: list[str], found: dict[str, Any], conf: dict[str, Any], now: float, say: Callable[[str], bool]
) -> tuple[str, str]:
    """Start every node of ``names`` at once, then read each operation's end. The attempt is counted in
    each node's record before its start, so the VM that boots reads the attempt that brought it back."""
    for name in names:
        api.set_record(
            name, found[name], recovery.updated_record(recovery.record_of(found[name]), event, "coming back", now, "starting", attempt=True)
        )
    answers: dict[str, tuple[int, dict[str, Any]]] = {n: api.call("POST", f"/instances/{n}/start") for n in names}
    deadline = time.time() + conf["opWaitS"]
    verdicts = {}
    for name, (status, doc) in answers.items():
        operation = api.wait(doc, deadline) if status < 400 else None
        verdicts[name] = recovery.start_answer(status, operation, doc if status >= 400 else None)
    for name, (verdict, why) in verdicts.items():
        state = {"started": "resumed", "retry": "coming back", "give up": "gave up"}[verdict]
        inst = api.get(name) or found[name]  # a fresh fingerprint: the start and the record changed it
        api.set_record(
            name, inst, recovery.updated_record(recovery.record_of(inst), event, state, now, "" if verdict == "started" else why)
        )
    gave_up = [f"{n}: {w}" for n, (v, w) in verdicts.items() if v == "give up"]
    waiting = [f"{n}: {w}" for n, (v, w) in verdicts.items() if v == "retry"]
    if gave_up:
        say("gave up bringing the VMs back: " + "; ".join(gave_up))
        return DONE, "; ".join(gave_up)
    if waiting:
        return RETRY, "; ".join(waiting)
    say(
        f"back: {', '.join(names)} started again after the {event.kind} at "
        f"{recovery.clock(event.at, local=False)} UTC (the runs resume at boot)"
    )
    return DONE, "started " + ", ".join(names)


def entry_of(data: dict[str, Any]) -> dict[str, Any]:
    """The LogEntry inside a messagePublished CloudEvent's data ({"message": {"data": base64}})."""
    message = data.get("message") or {}
    entry: dict[str, Any] = json.loads(base64.b64decode(message.get("data") or b"e30="))
    return entry


def on_event(cloud_event: Any) -> str:  # (functions-framework's CloudEvent, or its data as a dict)
    """The function's entry point. Raises ``Retry`` (an error to the trigger) to be called again."""
    return on_event_with(getattr(cloud_event, "data", cloud_event), settings_from_env(dict(os.environ)))


def on_event_with(data: dict[str, Any], conf: dict[str, Any], now: float | None = None) -> str:
    event = recovery.event_of(entry_of(data))
    if event is None:
        return "not a preemption, host error or host maintenance"
    try:
        outcome, why = recover(event, conf, now)
    except Exception as e:  # Google's API or the token failing: again later, but not past the stack's bound
        reason = recovery.give_up_reason(event, time.time() if now is None else now, conf["hours"], 0)
        if reason is None:
            raise
        outcome, why = DONE, f"gave up after an error ({e}): {reason}"
        notify.send(conf["notify"], f"gpu-train {conf['stack']}: gave up bringing {event.instance} back: {why}")
    print(json.dumps({"event": event.kind, "instance": event.instance, "outcome": outcome, "why": why}), flush=True)
    if outcome == RETRY:
        raise Retry(why)
    return why
