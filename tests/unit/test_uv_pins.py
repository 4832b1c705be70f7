"""A project's uv.lock is installed with its hashes, by the real uv against a loopback index
(agent/pyenv.py::install_argv)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agent import pyenv
from tests.pyindex import PackageIndex, make_wheel

UV = str(Path(sys.executable).parent / "uv")


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_a_uv_lock_is_installed_with_its_hashes(tmp_path: Path) -> None:
    """uv.lock was exported with --no-hashes: an index (or a proxy) that served other bytes under the
    locked version's name was installed as if locked."""
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    wheel = make_wheel(good, "tinypkg", "1.0", {"tinypkg.py": "WHO = 'the locked one'\n"})
    project = tmp_path / "proj"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "proj"\nversion = "0"\nrequires-python = ">=3.8"\ndependencies = ["tinypkg"]\n'
    )
    env = {**os.environ, "UV_CACHE_DIR": str(tmp_path / "cache"), "UV_NO_CONFIG": "1"}
    index = PackageIndex("127.0.0.1", [wheel])
    try:
        locked = run([UV, "lock", "--default-index", index.url], project, env)
        assert locked.returncode == 0, locked.stderr
        assert "sha256:" in (project / "uv.lock").read_text()
    finally:
        index.close()
    swapped = make_wheel(bad, "tinypkg", "1.0", {"tinypkg.py": "WHO = 'a substitute'\n"})  # same name, other bytes
    index = PackageIndex("127.0.0.1", [swapped])
    venv = tmp_path / "venv"
    assert run([UV, "venv", "--quiet", str(venv)], tmp_path, env).returncode == 0
    python = str(venv / "bin" / "python")
    try:
        installed = None
        for argv in pyenv.install_argv("uv.lock", python, UV, str(project), str(tmp_path), offline=False):
            installed = run(argv, project, {**env, "UV_DEFAULT_INDEX": index.url, "UV_NO_CACHE": "1"})
            if installed.returncode != 0:
                break
    finally:
        index.close()
    assert installed is not None and installed.returncode != 0, "the substitute was installed"
    assert "hash" in installed.stderr.lower(), installed.stderr
    assert run([python, "-c", "import tinypkg"], tmp_path, env).returncode != 0
