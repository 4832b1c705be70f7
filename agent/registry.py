"""Registry credentials for one pull, kept out of every command line and removed after it.

Artifact Registry on a VM: an access token of the VM's service account from the metadata server (the
stack grants it roles/artifactregistry.reader on each repository it names, not on the project).
Any other registry: a token the user gives as a secret in the run's environment (``--env-file`` with
GPU_TRAIN_REGISTRY_TOKEN, and GPU_TRAIN_REGISTRY_USER), never in the stack and never passed on to the
job. `launch` takes every GPU_TRAIN_REGISTRY_* out of the spec before it writes runs/RUN/spec.json (the
run's folder is mounted into its container) and keeps them as REMOTE_ROOT/secrets/RUN.json (0600, in no
folder a job is given), for the pulls of the run's later starts (its image pulled again by digest after a
reboot or a preemption); the file is removed when the run ends (succeeded, failed, stopped) or is pruned.
Either way the engine logs in with the token on stdin, into a config folder (0700) of this pull's
own, which is removed after it: no token is left in the user's ~/.docker/config.json (where a short-lived
one would only fail a later pull) or readable by another user.

Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator

from gpu_train.atomic import atomic_write

from .store import secrets_path

PREFIX = "GPU_TRAIN_REGISTRY_"  # the run's environment names for the pull's credentials (not the job's)
TOKEN_ENV, USER_ENV = f"{PREFIX}TOKEN", f"{PREFIX}USER"
GOOGLE_USER = "oauth2accesstoken"  # Artifact Registry's user name for an OAuth access token
TOKEN_PATH = "instance/service-accounts/default/token"


def split(env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the job's environment, the pull's credentials: every GPU_TRAIN_REGISTRY_*)."""
    return {k: v for k, v in env.items() if not k.startswith(PREFIX)}, {k: v for k, v in env.items() if k.startswith(PREFIX)}


def keep(root: str, run_id: str, secrets: dict[str, str]) -> None:
    """Keep a run's credentials as REMOTE_ROOT/secrets/RUN.json, 0600 from its first byte in a 0700
    folder (none: no file)."""
    path = secrets_path(root, run_id)
    if not secrets:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        return
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    atomic_write(path, json.dumps(secrets), 0o600, keep_mode=False)


def kept(root: str, run_id: str) -> dict[str, str]:
    """The run's kept credentials, only from the user's own file that no one else can read (else none)."""
    with contextlib.suppress(OSError, ValueError):
        fd = os.open(secrets_path(root, run_id), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd) as f:
            st = os.fstat(f.fileno())
            if stat.S_IMODE(st.st_mode) & 0o077 or st.st_uid != os.getuid():
                return {}
            doc = json.load(f)
        if isinstance(doc, dict):
            return {k: v for k, v in doc.items() if k.startswith(PREFIX) and isinstance(v, str)}
    return {}


def registry_host(ref: str) -> str:
    """The registry an image reference names (Docker's rule: a first part with '.' or ':', or localhost)."""
    first, sep, _ = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def google_registry(host: str) -> bool:
    """Artifact Registry (REGION-docker.pkg.dev) or Container Registry (gcr.io, its successor's domain too)."""
    return host.endswith("-docker.pkg.dev") or host == "gcr.io" or host.endswith(".gcr.io")


def login_argv(engine: str, host: str, user: str, folder: str) -> tuple[list[str], dict[str, str]]:
    """The engine's login with the secret on stdin, into ``folder``; and the variables that point the
    engine's pull at that folder."""
    if engine == "podman":
        auth = os.path.join(folder, "auth.json")
        return ["podman", "login", "--authfile", auth, "--username", user, "--password-stdin", host], {"REGISTRY_AUTH_FILE": auth}
    return ["docker", "login", "--username", user, "--password-stdin", host], {"DOCKER_CONFIG": folder}


def metadata_token(metadata_url: str | None) -> str | None:
    """The VM's service account's access token (None off GCP or without an answer)."""
    from gpu_train.contract import METADATA_URL, METADATA_URL_ENV

    from .watch import metadata_get

    base = metadata_url or os.environ.get(METADATA_URL_ENV) or METADATA_URL
    base = base if base.endswith("/") else base + "/"
    try:
        doc = json.loads(metadata_get(base + TOKEN_PATH, 5)[0])
    except (OSError, ValueError):
        return None
    token = doc.get("access_token") if isinstance(doc, dict) else None
    return token if isinstance(token, str) and token else None


@contextlib.contextmanager
def credentials(
    engine: str, ref: str, env: dict[str, str], say: Callable[[str], None], gcp: bool = False, metadata_url: str | None = None
) -> Iterator[dict[str, str]]:
    """The environment for one pull of ``ref``: the host's own when there is no token to log in with."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(PREFIX)}
    host = registry_host(ref)
    token, user = env.get(TOKEN_ENV), env.get(USER_ENV)
    if not token and gcp and google_registry(host):
        token, user = metadata_token(metadata_url), GOOGLE_USER
        if not token:
            say(f"no access token from the metadata server for {host}: pulling with this host's own credentials")
    if not token:
        yield base
        return
    folder = tempfile.mkdtemp(prefix="gpu-train-pull-")  # 0700
    try:
        argv, extra = login_argv(engine, host, user or GOOGLE_USER, folder)
        try:
            said = subprocess.run(argv, input=token, capture_output=True, text=True, timeout=60, env={**base, **extra})
        except (OSError, subprocess.SubprocessError) as e:
            said = subprocess.CompletedProcess(argv, 1, "", str(e))
        if said.returncode != 0:
            from .store import AgentError

            why = (said.stderr or said.stdout).strip().splitlines()[-1:] or ["no answer"]
            raise AgentError(f"{engine} login to {host} failed: {why[0]}")
        say(f"logged in to {host} as {user or GOOGLE_USER} for this pull only (the token is not kept)")
        yield {**base, **extra}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
