"""The e2e tier of tests/unit/test_pyenv.py (the same subject; its helpers are there)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from agent import uvfetch
from remote.loopback import Sshd
from tests.conftest import FAB, ROOT, fab_env, project_id, run_fab
from tests.pyindex import OFFLINE_INDEX, PackageIndex, make_wheel, uv_wheel

LAB_ADDRESS = "127.0.23.1"


SYSTEM_PYTHON = "/usr/bin/python3"


JOB = "import sys, tinypkg\nprint('tiny', tinypkg.VALUE, 'in', sys.prefix, flush=True)\n"


def uv_binary() -> Path:
    found = shutil.which("uv", path=os.path.dirname(sys.executable))
    if not found:
        pytest.skip("uv is not installed in the test environment (requirements-test.txt)")
    return Path(found)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("wheels")
    return {
        "uv": uv_wheel(folder),
        "tinypkg": make_wheel(folder, "tinypkg", "1.0", {"tinypkg.py": "VALUE = 42\n"}),
        "tensorboard": make_wheel(
            folder,
            "tensorboard",
            "0.0.1",
            {"tensorboard/__init__.py": "", "tensorboard/main.py": "", "tensorboard/program.py": FAKE_TENSORBOARD},
        ),
    }


# A stand-in for TensorBoard's server in the project's venv: it answers HTTP on --port (what the
# tunnel needs); the real one is tested in test_alias_tunnel.py.
FAKE_TENSORBOARD = """import argparse, http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'tensorboard from the project venv')
class TensorBoard:
    def configure(self, argv):
        p = argparse.ArgumentParser()
        for flag in ('--logdir', '--host', '--port', '--path_prefix'):
            p.add_argument(flag)
        self.args = p.parse_args(argv[1:])
    def main(self):
        http.server.HTTPServer((self.args.host, int(self.args.port)), H).serve_forever()
"""


class Host:
    """An SSH stack on a loopback sshd whose sessions use ``index``; jobs run with the system Python."""

    def __init__(self, tmp: Path, index: str, python: str = SYSTEM_PYTHON, venv: bool = True):
        self.sshd = Sshd(tmp / "sshd", LAB_ADDRESS, setenv=f"PIP_INDEX_URL={index}", log_level="INFO").start()
        self.remote, self.stacks, self.home, self.project = tmp / "remote", tmp / "stacks", tmp / "home", tmp / "proj"
        self.project.mkdir()
        self.sshd.stack_file(self.stacks, "lab", self.remote, python)
        path = self.stacks / "Pulumi.lab.yaml"
        path.write_text(path.read_text().replace("gpu-train:venv: false", f"gpu-train:venv: {str(venv).lower()}"))
        self.env = fab_env(self.stacks, self.home, "lab", self.project)

    def fab(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run_fab(self.env, self.project, *args, check=check, timeout=240)

    def train(self, script: str = JOB, requirements: str | None = "tinypkg==1.0\n") -> subprocess.CompletedProcess:
        (self.project / "job.py").write_text(script)
        if requirements is not None:
            (self.project / "requirements.txt").write_text(requirements)
        return self.fab("train", "--script", "job.py", "--follow", check=False)

    @property
    def venv(self) -> Path:
        return self.remote / "envs" / project_id(self.home, self.project)

    def logins(self) -> int:
        return (self.sshd.dir / "sshd.log").read_text().count("Accepted publickey")


@pytest.fixture
def lab_host(tmp_path: Path):
    made: list[Host] = []

    def start(index: str, **kw) -> Host:
        made.append(Host(tmp_path, index, **kw))
        return made[-1]

    yield start
    for h in made:
        h.sshd.stop()
        subprocess.run(["pkill", "-f", str(h.remote)], check=False)


@pytest.mark.e2e
def test_uv_makes_the_venv_caches_on_remote_root_and_a_deleted_venv_is_rebuilt(lab_host, wheels, tmp_path) -> None:
    index = PackageIndex(LAB_ADDRESS, [wheels["uv"], wheels["tinypkg"]])
    try:
        host = lab_host(index.url)
        first = host.train()
        assert first.returncode == 0, first.stdout + first.stderr
        assert f"tiny 42 in {host.venv}" in first.stdout  # the project's venv, with the package uv installed
        assert f"uv {uvfetch.UV_VERSION}, fetched now from {index.url}" in first.stdout
        assert (host.remote / "tools" / f"uv-{uvfetch.UV_VERSION}" / "uv").is_file()
        cache = host.remote / "cache" / "uv"
        assert f"cache {cache}" in first.stdout and any(cache.rglob("tinypkg*"))
        downloads = index.sent.count(wheels["tinypkg"].name)  # (uv may read a wheel's metadata first)
        assert downloads and index.sent.count(wheels["uv"].name) == 1

        shutil.rmtree(host.venv)  # as when a base Python changes under it, or someone cleans up
        again = host.train()
        assert again.returncode == 0, again.stdout + again.stderr
        assert f"tiny 42 in {host.venv}" in again.stdout and "creating the project's virtual environment" in again.stdout
        assert "offline" in again.stdout and "from the index then" not in again.stdout  # the same files: cache alone
        assert index.sent.count(wheels["tinypkg"].name) == downloads  # from uv's cache on REMOTE_ROOT, not downloaded again
        assert index.sent.count(wheels["uv"].name) == 1

        (host.venv / "bin" / "python").unlink()  # its interpreter gone: a broken venv, whatever the stamps say
        (host.venv / "bin" / "python").symlink_to("/nonexistent/python3")
        broken = host.train()
        assert broken.returncode == 0, broken.stdout + broken.stderr
        assert "rebuilding the project's virtual environment" in broken.stdout and "no longer runs" in broken.stdout
        assert f"tiny 42 in {host.venv}" in broken.stdout

        unchanged = host.train()
        assert "unchanged since the last install" in unchanged.stdout and "creating" not in unchanged.stdout
    finally:
        index.close()


@pytest.mark.e2e
def test_pip_is_the_fallback_where_uv_cannot_be_had_and_says_so(lab_host, wheels) -> None:
    index = PackageIndex(LAB_ADDRESS, [wheels["tinypkg"]])  # an index without uv
    try:
        host = lab_host(index.url)
        result = host.train()
        assert result.returncode == 0, result.stdout + result.stderr
        assert "uv is not available (uv " in result.stdout and "using venv and pip instead" in result.stdout
        assert f"-m pip into {host.venv}/bin/python" in result.stdout
        assert f"tiny 42 in {host.venv}" in result.stdout
    finally:
        index.close()


@pytest.mark.e2e
def test_a_python_that_is_a_venv_is_used_as_it_is(lab_host, wheels, tmp_path: Path) -> None:
    own = tmp_path / "users-own-venv"  # made by the user, with their packages in it
    subprocess.run([str(uv_binary()), "venv", "--quiet", "--python", SYSTEM_PYTHON, str(own)], check=True)
    subprocess.run(
        [str(uv_binary()), "pip", "install", "--quiet", "--python", str(own / "bin" / "python"), str(wheels["tinypkg"])],
        check=True,
        env={**os.environ, "UV_CACHE_DIR": str(tmp_path / "uvcache")},
    )
    host = lab_host(OFFLINE_INDEX, python=str(own / "bin" / "python"))
    result = host.train(requirements=None)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"tiny 42 in {own}" in result.stdout and "is a virtual environment's own Python" in result.stdout
    assert not host.venv.exists()


@pytest.mark.e2e
def test_tensorboard_is_found_in_the_project_venv(lab_host, wheels) -> None:
    index = PackageIndex(LAB_ADDRESS, [wheels["uv"], wheels["tensorboard"]])
    try:
        host = lab_host(index.url)
        missing = host.fab("tensorboard", "--json", check=False)  # no venv yet: the advice names where it goes
        assert missing.returncode != 0 and f"the next train installs it into {host.venv}/bin/python" in missing.stderr
        result = host.train("print('ok')\n", "tensorboard==0.0.1\n")  # the advice, followed
        assert result.returncode == 0, result.stdout + result.stderr
        served = subprocess.Popen(
            [FAB, "--search-root", str(ROOT), "tensorboard", "--json"],
            env=host.env,
            cwd=host.project,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            line = served.stdout.readline()  # type: ignore[union-attr]  # (a PIPE: never None)
            assert line, served.communicate(timeout=30)
            url = json.loads(line)["url"]
            with urllib.request.urlopen(url, timeout=30) as page:
                assert page.read() == b"tensorboard from the project venv"
        finally:
            served.terminate()
            served.wait(30)
    finally:
        index.close()
