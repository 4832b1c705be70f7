"""`bucket-check`: can this host's uploader use the stack's bucket? (`check` on an SSH stack with a bucket.)

Run as the uploader will be: by the job's Python (configured, else the one a run would detect), in the
login session's environment (the credentials it names: GOOGLE_APPLICATION_CREDENTIALS, gcloud's
well-known file, a VM's metadata server; STORAGE_EMULATOR_HOST). That Python runs ``probe`` (the agent's
`bucket-probe`): Google's client finds credentials as it would for an upload, then writes a small object,
reads it back and deletes it. Google's modules are imported in ``probe`` only: the agent stays stdlib.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import Any

from gpu_train.bucketdoc import BucketProbe
from gpu_train.codec import answer, check

from .procs import detect_python
from .store import agent_path

PROBE_TIMEOUT_S = 90  # the metadata server's probe alone may take a few seconds where there is none


def cmd_bucket_check(root: str, bucket: str, prefix: str, python: str | None) -> BucketProbe:
    """The probe's answer, from the job's Python; what stopped it where it could not answer."""
    job_python = detect_python(python)
    name = f"{prefix}.gpu-train-check-{socket.gethostname()}-{os.getpid()}"  # not a folder: never taken for a run
    argv = [job_python, agent_path(root), "--root", root, "bucket-probe", bucket, name]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return answer(BucketProbe, python=job_python, ok=False, step="client", detail=f"the probe did not finish: {e}")
    lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
    try:  # the probe's answer, with the Python it ran under
        return check(BucketProbe, {**json.loads(lines[-1]), "python": job_python}, "the probe's answer")
    except (ValueError, TypeError, IndexError):  # (no line; not JSON; not an object; not a probe's answer)
        said = (done.stderr or done.stdout).decode("utf-8", "replace").strip().splitlines()[-3:]
        return answer(
            BucketProbe,
            python=job_python,
            ok=False,
            step="client",
            detail=f"{job_python} could not run the probe (exit {done.returncode}): {' '.join(said)[:600]}",
        )


def step_of(error: BaseException) -> str:
    """Which step an exception of Google's client stops at, by its class (api_core's and google-auth's)."""
    kinds = [k.__name__ for k in type(error).__mro__]
    for kind, step in (
        ("NotFound", "bucket"),
        ("Forbidden", "access"),
        ("Unauthorized", "credentials"),
        ("RefreshError", "credentials"),
        ("DefaultCredentialsError", "credentials"),
    ):
        if kind in kinds:
            return step
    return "network"


def _who(creds: object) -> tuple[str, str]:
    """What the credentials are, and the IAM member they act as where it can be told."""
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return f"none needed: STORAGE_EMULATOR_HOST={os.environ['STORAGE_EMULATOR_HOST']}", ""
    email = getattr(creds, "service_account_email", None)
    source = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    kind = type(creds).__module__.replace("google.", "") + "." + type(creds).__name__
    where = f" from {source}" if source else ""
    if email and email != "default":
        return f"service account {email} ({kind}{where})", f"serviceAccount:{email}"
    return f"{kind}{where}", ""


def probe(bucket: str, name: str) -> dict[str, Any]:
    """`bucket-probe`: credentials found, then one object written, read back and deleted (under this Python)."""
    try:
        from google.cloud import storage
    except ImportError as e:
        return {"ok": False, "step": "client", "detail": f"{sys.executable} cannot import google-cloud-storage ({e})"}
    try:
        client = storage.Client()  # Application Default Credentials, as the uploader's; none for an emulator
    except Exception as e:  # DefaultCredentialsError: none found
        return {"ok": False, "step": step_of(e), "detail": str(e).strip().splitlines()[0][:600]}
    out: dict[str, object] = {"object": f"gs://{bucket}/{name}"}
    blob = client.bucket(bucket).blob(name)
    data = os.urandom(32).hex().encode()
    step = "write"
    try:
        blob.upload_from_string(data)
        step = "read"
        if blob.download_as_bytes() != data:
            out.update(ok=False, step="read", detail="the object read back is not the one written")
        step = "delete"
        blob.delete()
        out.setdefault("ok", True)
    except Exception as e:  # a bucket, a permission, the network: its step
        out.update(ok=False, step=step_of(e), detail=f"{step}: {str(e).strip().splitlines()[0][:600]}")
    out["credentials"], out["member"] = _who(client._credentials)
    return out
