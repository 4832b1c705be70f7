"""The job's Python environment on the host: which Python runs it, the project's venv (rebuilt when
it is gone or no longer matches its base), and its dependencies installed with uv, or with pip
where uv cannot be had (uv itself: ``uvfetch.py``).

uv's cache lives at REMOTE_ROOT/cache/uv (on GCP the data disk), beside the venvs, so a rebuilt venv
or a new VM links what was downloaded before instead of downloading it again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable

from .store import AgentError, write_json

VENV_STAMP = ".gpu-train-venv.json"  # in a venv gpu-train made: the base Python and its version
VERSION_PROBE = "import sys;print('%d.%d' % sys.version_info[:2])"


def cache_dirs(root: str) -> dict[str, str]:
    """Where uv and pip keep downloads and built wheels: on REMOTE_ROOT, shared by every project."""
    return {"UV_CACHE_DIR": os.path.join(root, "cache", "uv"), "PIP_CACHE_DIR": os.path.join(root, "cache", "pip")}


def is_venv_python(python: str) -> bool:
    """A venv's own interpreter (VENV/bin/python beside VENV/pyvenv.cfg): used as it is, since a venv
    made from it would not see its packages."""
    path = python if os.sep in python else (shutil.which(python) or python)
    return os.path.isfile(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(path))), "pyvenv.cfg"))


def run_env(root_env_dir: str, python: str, venv: bool, externally_managed: bool, installs: bool = True) -> str | None:
    """The venv the job runs in, or None for ``python`` itself.

    A venv's interpreter is used as it is; otherwise the project's venv when the stack asks for one
    (gpu-train:venv), or when ``python`` refuses installs (PEP 668: Ubuntu 24.04, Debian 12) and the
    code has something to install (``installs``): a venv with the system site packages is the way to
    add packages and still see what it has (torch). With nothing to install, such a Python runs the
    job as it is (no venv to make: a host may lack python3-venv).
    """
    if is_venv_python(python):
        return None
    return root_env_dir if venv or (externally_managed and installs) else None


def venv_python(env_dir: str) -> str:
    return os.path.join(env_dir, "bin", "python")


def fingerprint(path: str | None) -> list[int] | None:
    """What says a file is the same one: inode, size and modification time (None: not there)."""
    try:
        st = os.stat(path) if path else None
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns] if st else None


def interpreter(python: str) -> list[int] | None:
    """The fingerprint of the interpreter ``python`` names (through PATH and symlinks), or None where it is
    not one but a script that picks one as it runs (a pyenv or asdf shim, a wrapper): never taken as known."""
    found = shutil.which(python)
    real = os.path.realpath(found) if found else None
    try:
        with open(real or "", "rb") as f:
            if f.read(4) != b"\x7fELF":
                return None
    except OSError:
        return None
    return fingerprint(real)


def probe_version(python: str) -> str | None:
    try:
        done = subprocess.run([python, "-I", "-S", "-c", VERSION_PROBE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def venv_problem(env_dir: str, base: str) -> str | None:
    """Why the project's venv cannot be trusted (so it is made anew), or None when it is sound:
    missing, half made, made from another Python, or its interpreter gone or of another version."""
    if not os.path.isdir(env_dir):
        return "it does not exist yet"
    try:
        with open(os.path.join(env_dir, VENV_STAMP)) as f:
            stamp = json.load(f)
    except (OSError, ValueError):
        return "it is not one gpu-train finished making"
    if stamp.get("base") != base:
        return f"it was made from {stamp.get('base')}, and the job's Python is now {base}"
    seen = interpreter(venv_python(env_dir))
    if seen is not None and seen == stamp.get("interpreter"):
        return None  # the very interpreter it was made with (its file unchanged): no Python started to ask
    now = probe_version(venv_python(env_dir))
    if now is None:
        return f"its interpreter {venv_python(env_dir)} no longer runs (its base Python changed or is gone)"
    if now != stamp.get("version"):
        return f"its Python is now {now}, it was made with {stamp.get('version')}"
    # Known now (an update of the same version): the next train starts nothing. A stamp that cannot be written
    # (a full disk, a home over its quota) is only asked again: the venv is sound all the same.
    with contextlib.suppress(OSError):
        write_json(os.path.join(env_dir, VENV_STAMP), {**stamp, "interpreter": seen})
    return None


def make_venv(env_dir: str, base: str, uv: str | None, env: dict[str, str], say: Callable[[str], None]) -> None:
    """A venv with the system site packages (a torch on the host is used as it is), made by uv when
    there is one (no python3-venv package needed), else by ``base -m venv``."""
    shutil.rmtree(env_dir, ignore_errors=True)
    if uv:
        argv = [uv, "venv", "--quiet", "--system-site-packages", "--python", base, env_dir]
        fix = ""
    else:
        argv = [base, "-m", "venv", "--system-site-packages", env_dir]
        fix = ": on Debian/Ubuntu install python3-venv (sudo apt install python3-venv)"
    say(f"creating the project's virtual environment {env_dir} from {base} with {'uv' if uv else 'venv'} (with the system site packages)")
    made = subprocess.run(argv, capture_output=True, text=True, env=env)
    version = probe_version(venv_python(env_dir)) if made.returncode == 0 else None
    if version is None:
        shutil.rmtree(env_dir, ignore_errors=True)
        why = (made.stderr or made.stdout).strip().splitlines()[-1:] or [f"exit {made.returncode}"]
        raise AgentError(
            f"{' '.join(argv[:3])} failed to make {env_dir} ({why[0]}){fix}, or set gpu-train:venv: false to run with {base} itself"
        )
    # Written last (a half-made venv has none), with its interpreter's file as it is now: while that
    # stays, the venv is known sound without starting it (venv_problem).
    write_json(os.path.join(env_dir, VENV_STAMP), {"base": base, "version": version, "interpreter": interpreter(venv_python(env_dir))})


# -- what to install -------------------------------------------------------------------------------
PROJECT_DEPS_RE = re.compile(r"^\[project\][^\[]*^dependencies\s*=", re.M | re.S)


def install_plan(files: dict[str, str], have_uv: bool) -> tuple[str | None, str]:
    """(what to install from, why) for the code's dependency files (name -> text):

    requirements.txt when there is one; else uv.lock (the versions it pins) with its pyproject.toml;
    else pyproject.toml's [project] dependencies (the project itself is not installed: the job runs in
    its folder). Without uv only requirements.txt can be installed, with pip.
    """
    if "requirements.txt" in files:
        return ("requirements.txt" if lists_anything(files["requirements.txt"]) else None), ""
    if "pyproject.toml" in files and ("uv.lock" in files or PROJECT_DEPS_RE.search(files["pyproject.toml"])):
        source = "uv.lock" if "uv.lock" in files else "pyproject.toml"
        if have_uv:
            return source, ""
        return None, f"{source} is not installed without uv (pip cannot install only its dependencies): list them in requirements.txt"
    return None, ""


def lists_anything(requirements: str) -> bool:
    """Whether a requirements file has a line that is more than a comment (a file of comments is
    installed by no tool at all)."""
    return any(line.split("#", 1)[0].strip() for line in requirements.splitlines())


def dependency_files(code_dir: str) -> dict[str, str]:
    out = {}
    for name in ("requirements.txt", "pyproject.toml", "uv.lock"):
        try:
            with open(os.path.join(code_dir, name), encoding="utf-8", errors="replace") as f:
                out[name] = f.read()
        except OSError:
            pass
    return out


def env_identity(python: str) -> str:
    """What changes when the environment is made anew or its Python replaced: a stale install stamp
    must not survive a rebuilt venv (its pyvenv.cfg is a new file) or an upgraded interpreter."""
    parts = []
    for path in (os.path.realpath(python), os.path.join(os.path.dirname(os.path.dirname(python)), "pyvenv.cfg")):
        try:
            st = os.stat(path)
            parts.append(f"{path}:{st.st_ino}:{st.st_mtime_ns}:{st.st_size}")
        except OSError:
            parts.append(f"{path}:-")
    return "|".join(parts)


def install_digest(source: str, files: dict[str, str], python: str) -> str:
    h = hashlib.sha256(json.dumps([source, files, env_identity(python)], sort_keys=True).encode())
    return h.hexdigest()


def failure_reason(lines: list[str]) -> str:
    """What says why an install failed: uv's last ``error:`` with its innermost ``cause:`` and the
    ``hint:`` after them (the hint alone, uv's last line, had stood for the failure), pip's last
    ``ERROR:``; else the last line there is."""
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i].strip()
        if line.lower().startswith("error:"):
            error, causes = line.split(":", 1)[1].strip(), []
            for follow in lines[i + 1 :]:
                if not follow.strip().startswith("cause:"):
                    break
                causes.append(follow.strip().split(":", 1)[1].strip())
            hint = next((ln.strip() for ln in lines[i + 1 :] if ln.strip().startswith("hint:")), "")
            return (f"{error} ({causes[-1]})" if causes else error) + (f"; {hint}" if hint else "")
    return next((ln.strip() for ln in reversed(lines) if ln.strip()), "")


def files_digest(source: str, files: dict[str, str]) -> str:
    """The dependency files alone: the same ones reinstalled into a rebuilt venv may come from the cache."""
    return hashlib.sha256(json.dumps([source, files], sort_keys=True).encode()).hexdigest()


def install_argv(source: str, python: str, uv: str | None, code_dir: str, scratch: str, offline: bool = False) -> list[list[str]]:
    """The commands that install ``source`` into ``python``'s environment, in order (``offline``:
    from uv's cache alone)."""
    if uv is None:
        return [[python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-r", "requirements.txt"]]
    install = [uv, "pip", "install", "--python", python, *(["--offline"] if offline else [])]
    if source == "uv.lock":
        pinned = os.path.join(scratch, "uv-lock-requirements.txt")
        return [
            [
                uv,
                "export",
                "--frozen",
                "--no-emit-project",
                "--quiet",
                "--format",
                "requirements-txt",
                "--output-file",
                pinned,
            ],
            [*install, "-r", pinned],
        ]
    return [[*install, "-r", source]]
