"""The job's own Python environment, over a real sshd on loopback: uv fetched from the host's index
and used with its cache on REMOTE_ROOT, pip where uv cannot be had, a deleted or broken venv rebuilt,
a Python that is itself a venv used as it is, tensorboard found in the project's venv.

The host's index is a loopback one (tests/pyindex.py) serving uv's real binary and a small wheel; the
host's Python is the system's /usr/bin/python3 (Debian's, marked externally managed: PEP 668). This
suite's loopback addresses are 127.0.23.x.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent import pyenv, uvfetch


# -- decisions, by table -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("files", "have_uv", "expected"),
    [
        ({}, True, (None, "")),
        ({"requirements.txt": "# nothing yet\n\n"}, True, (None, "")),
        ({"requirements.txt": "numpy\n", "pyproject.toml": "[project]\ndependencies = ['x']\n"}, False, ("requirements.txt", "")),
        ({"pyproject.toml": "[tool.ruff]\nline-length = 100\n"}, True, (None, "")),
        ({"pyproject.toml": "[project]\nname = 'p'\ndependencies = ['x']\n"}, True, ("pyproject.toml", "")),
        ({"pyproject.toml": "[project]\nname = 'p'\n", "uv.lock": "version = 1\n"}, True, ("uv.lock", "")),
    ],
)
def test_install_plan(files: dict, have_uv: bool, expected: tuple) -> None:
    assert pyenv.install_plan(files, have_uv) == expected


def test_install_plan_without_uv_says_what_is_left_out() -> None:
    source, why = pyenv.install_plan({"pyproject.toml": "[project]\ndependencies = ['x']\n"}, False)
    assert source is None and "pyproject.toml is not installed without uv" in why and "requirements.txt" in why


def test_pip_index_as_pip_reads_it() -> None:
    conf = "[global]\nindex-url = https://mirror/simple\nextra-index-url = https://a/simple https://b/simple\n"
    assert uvfetch.pip_index({}, []) == {"index": "https://pypi.org/simple", "extra": [], "findLinks": [], "cert": None}
    assert uvfetch.uv_index_env(uvfetch.pip_index({}, ["[global]\ncert = /etc/ca.pem\n"]))["SSL_CERT_FILE"] == "/etc/ca.pem"
    assert uvfetch.pip_index({}, [conf])["extra"] == ["https://a/simple", "https://b/simple"]
    assert uvfetch.pip_index({"PIP_INDEX_URL": "http://x/simple"}, [conf])["index"] == "http://x/simple"
    env = uvfetch.uv_index_env(uvfetch.pip_index({}, [conf, "[install]\nfind-links = /nonexistent/wheels\n"]))
    assert env == {
        "UV_DEFAULT_INDEX": "https://mirror/simple",
        "UV_INDEX": "https://a/simple https://b/simple",
        "UV_INDEX_STRATEGY": "unsafe-best-match",
    }  # a local folder that is not there is left out, as pip does


def test_pick_wheel_for_the_platform() -> None:
    v = uvfetch.UV_VERSION
    links = [
        (f"uv-{v}-py3-none-macosx_11_0_arm64.whl", "a"),
        (f"uv-{v}-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.whl", "b"),
        (f"uv-{v}-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "c"),
        (f"uv-{v}-py3-none-musllinux_1_1_x86_64.whl", "d"),
        (f"uv-{v}.tar.gz", "e"),
        ("uv-0.0.1-py3-none-manylinux_2_17_x86_64.whl", "f"),
    ]
    assert uvfetch.pick_wheel(links, v, uvfetch.platform_tags("x86_64", True))[1] == "c"
    assert uvfetch.pick_wheel(links, v, uvfetch.platform_tags("arm64", True))[1] == "b"
    assert uvfetch.pick_wheel(links, v, uvfetch.platform_tags("x86_64", False))[1] == "d"
    assert uvfetch.pick_wheel(links, "9.9.9", uvfetch.platform_tags("x86_64", True)) is None


def test_run_env(tmp_path: Path) -> None:
    own = tmp_path / "v"
    (own / "bin").mkdir(parents=True)
    (own / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert pyenv.run_env("/r/envs/p", str(own / "bin" / "python"), True, False) is None  # a venv's Python: as it is
    assert pyenv.run_env("/r/envs/p", "/usr/bin/python3", True, False) == "/r/envs/p"
    assert pyenv.run_env("/r/envs/p", "/usr/bin/python3", False, False) is None  # gpu-train:venv false: the Python itself
    assert pyenv.run_env("/r/envs/p", "/usr/bin/python3", False, True) == "/r/envs/p"  # unless it refuses installs (PEP 668)
    # ... and there is something to install: with nothing, it runs as it is (a host may lack python3-venv)
    assert pyenv.run_env("/r/envs/p", "/usr/bin/python3", False, True, installs=False) is None


UV_UNTRUSTED_CA = """Using Python 3.11.7 environment at: /srv/envs/proj
error: Failed to fetch: https://pypi.org/simple/torch/
  cause: error sending request for url (https://pypi.org/simple/torch/)
  cause: client error (Connect)
  cause: invalid peer certificate: UnknownIssuer

hint: Consider enabling use of system TLS certificates with the `--system-certs` command-line flag"""
UV_NO_SOLUTION = """Using Python 3.11.7 environment at: /srv/envs/proj
error: No solution found when resolving dependencies
  cause: Because not-a-real-pkg-xyz was not found in the cache and you require not-a-real-pkg-xyz, we can conclude \
that your requirements are unsatisfiable.

hint: Packages were unavailable because the network was disabled. When the network is disabled, registry packages \
may only be read from the cache."""
PIP_NO_MATCH = """Requirement already satisfied: numpy in /srv/envs/proj/lib/python3.11/site-packages (2.4.6)
ERROR: Could not find a version that satisfies the requirement not-a-real-pkg-xyz (from versions: none)
ERROR: No matching distribution found for not-a-real-pkg-xyz
"""


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        # uv 0.13.9's and pip 23's own words (behind a TLS-inspecting proxy whose CA uv was not given; --offline
        # and a package that does not exist)
        (
            UV_UNTRUSTED_CA,
            "Failed to fetch: https://pypi.org/simple/torch/ (invalid peer certificate: UnknownIssuer); "
            "hint: Consider enabling use of system TLS certificates with the `--system-certs` command-line flag",
        ),
        (
            UV_NO_SOLUTION,
            "No solution found when resolving dependencies (Because not-a-real-pkg-xyz was not found in "
            "the cache and you require not-a-real-pkg-xyz, we can conclude that your requirements are "
            "unsatisfiable.); hint: Packages were unavailable because the network was disabled. When the "
            "network is disabled, registry packages may only be read from the cache.",
        ),
        (PIP_NO_MATCH, "No matching distribution found for not-a-real-pkg-xyz"),
        ("Killed\n\n", "Killed"),
        ("", ""),
    ],
)
def test_an_install_failure_names_the_error_not_the_closing_hint(output: str, reason: str) -> None:
    """The run's reason (status, the log) had been uv's last line, its hint, without the error it is about."""
    assert pyenv.failure_reason(output.splitlines()) == reason


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("https://pypi.org/simple/uv/", True),
        ("http://127.0.0.1:9/simple/uv/", True),  # the host's own proxy or index
        ("http://localhost/simple/uv/", True),
        ("http://pypi.example.com/simple/uv/", False),  # rewritable on the way
        ("http://127.evil.example/simple/uv/", False),
        ("ftp://mirror/uv/", False),
    ],
)
def test_uv_travels_over_https_only(url: str, ok: bool) -> None:
    assert (uvfetch.transport_problem(url) is None) == ok


class _Index:
    """An index on loopback serving one wheel under ``name``, its link with ``fragment`` (a hostile
    index's own "#sha256=" of what it serves, or none)."""

    def __init__(self, name: str, body: bytes, fragment: str) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler

        from tests.loopback_http import LoopbackServer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                page = f'<a href="/files/{name}{fragment}">{name}</a>'.encode()
                data = page if self.path.startswith("/simple") else body
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = LoopbackServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    def __enter__(self) -> str:
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_substitute_uv_with_its_own_hash_is_refused(tmp_path: Path) -> None:
    """A hostile configured index gives its substitute under uv's own wheel name with the substitute's
    own #sha256=: the hash the page gave matched, and the substitute ran on the host. Now only the
    table's hash (PyPI's, gpu_train/data/uv-wheels.json) is believed."""
    import hashlib

    from tests.pyindex import UV_WHEEL, rebuilt_wheel

    fake = tmp_path / "uv"
    fake.write_bytes(b"#!/bin/sh\necho substitute\n")
    body = rebuilt_wheel(tmp_path, UV_WHEEL, fake).read_bytes()
    for fragment in (f"#sha256={hashlib.sha256(body).hexdigest()}", ""):
        with _Index(UV_WHEEL, body, fragment) as index, pytest.raises(ValueError, match="not the pinned one"):
            uvfetch.fetch_uv(str(tmp_path / "root"), index)
        assert not (tmp_path / "root" / "tools").exists()


def test_a_uv_wheel_the_table_does_not_name_is_not_taken(tmp_path: Path) -> None:
    """A name uv never published (an index may list anything) is not a candidate at all."""
    from tests.pyindex import rebuilt_wheel

    fake = tmp_path / "uv"
    fake.write_bytes(b"#!/bin/sh\necho substitute\n")
    name = f"uv-{uvfetch.UV_VERSION}-py3-none-manylinux_2_5_x86_64.whl"
    with _Index(name, rebuilt_wheel(tmp_path, name, fake).read_bytes(), "") as index, pytest.raises(ValueError, match="pinned wheels"):
        uvfetch.fetch_uv(str(tmp_path / "root"), index)


def test_pypis_uv_wheel_is_taken_with_or_without_a_page_hash(tmp_path: Path) -> None:
    """The real wheel (PyPI's bytes) is taken even from a mirror whose page gives no hash: the table
    is the check. It had been refused for want of a #sha256=."""
    import subprocess

    from tests.pyindex import uv_wheel

    wheel = uv_wheel(tmp_path)
    with _Index(wheel.name, wheel.read_bytes(), "") as index:
        binary = uvfetch.fetch_uv(str(tmp_path / "root"), index)
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith(f"uv {uvfetch.UV_VERSION}")


def test_the_pinned_table_covers_every_linux_host_and_the_tests_uv() -> None:
    """One version, every glibc and musl host on the architectures a GPU VM has, and the same uv the
    tests install (requirements-test.txt): a bump is scripts/dev/uv-pins VERSION plus that line."""
    import re

    names = [(n, n) for n in uvfetch.PINS["wheels"]]
    for machine, glibc in [("x86_64", True), ("aarch64", True), ("x86_64", False), ("aarch64", False)]:
        assert uvfetch.pick_wheel(names, uvfetch.UV_VERSION, uvfetch.platform_tags(machine, glibc)) is not None
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in uvfetch.PINS["wheels"].values())
    pinned = re.search(r"^uv==(\S+)$", (Path(__file__).parents[2] / "requirements-test.txt").read_text(), re.M)
    assert pinned is not None and pinned.group(1) == uvfetch.UV_VERSION


def test_the_zipapp_carries_the_pinned_table() -> None:
    import io
    import json
    import zipfile

    from agent import bundle

    with zipfile.ZipFile(io.BytesIO(bundle.payload())) as z:
        assert json.loads(z.read("gpu_train/data/uv-wheels.json")) == uvfetch.PINS


def test_a_uv_an_earlier_gpu_train_fetched_unpinned_is_not_used(tmp_path: Path) -> None:
    """REMOTE_ROOT/tools/uv-VERSION/uv, fetched before the pins with whatever hash the index page gave,
    was used as it was on every later run: it is fetched again instead (here: no index, so none)."""
    home = Path(uvfetch.uv_home(str(tmp_path)))
    home.mkdir(parents=True)
    (home / "uv").write_text("#!/bin/sh\necho substitute\n")
    (home / "uv").chmod(0o755)
    name = f"uv-{uvfetch.UV_VERSION}-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    (home / "source.json").write_text(f'{{"wheel": "{name}", "index": "https://mirror/simple"}}')  # an older copy's
    env = {"PATH": str(tmp_path / "nothing"), "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_CONFIG_FILE": "/dev/null"}
    found, why = uvfetch.find_uv(str(tmp_path), env)
    assert found is None and "could not be fetched" in why
    (home / "source.json").write_text(f'{{"wheel": "{name}", "index": "https://x", "sha256": "{uvfetch.PINS["wheels"][name]}"}}')
    assert uvfetch.find_uv(str(tmp_path), env)[0] == str(home / "uv")  # one this code verified


# -- the venv known sound without starting it ------------------------------------------------------
# A project's venv is known sound at each train without starting its Python while its interpreter's
# file is the one it was made with (venv_problem); else it is asked, as before.
def _venv(tmp_path: Path, stamp: dict[str, object]) -> Path:
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    (env / pyenv.VENV_STAMP).write_text(json.dumps(stamp))
    return env


def test_the_interpreter_it_was_made_with_is_not_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = pyenv.interpreter(os.path.realpath(sys.executable))
    assert made is not None
    env = _venv(tmp_path, {"base": "/usr/bin/python3", "version": "3.11", "interpreter": made})
    monkeypatch.setattr(pyenv, "probe_version", lambda python: pytest.fail(f"{python} was started"))
    assert pyenv.venv_problem(str(env), "/usr/bin/python3") is None


@pytest.mark.parametrize(
    ("stamp", "answer", "problem"),
    [
        ({"version": "3.11"}, "3.11", None),  # a stamp of before: asked, and its interpreter recorded
        ({"version": "3.11", "interpreter": [1, 2, 3]}, "3.11", None),  # its file changed (a patch release): asked
        ({"version": "3.11", "interpreter": [1, 2, 3]}, "3.12", "its Python is now 3.12, it was made with 3.11"),
        ({"version": "3.11"}, None, "no longer runs"),
    ],
)
def test_an_interpreter_not_known_the_same_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stamp: dict[str, object], answer: str | None, problem: str | None
) -> None:
    env = _venv(tmp_path, {"base": "/usr/bin/python3", **stamp})
    asked: list[str] = []

    def probe(python: str) -> str | None:
        asked.append(python)
        return answer

    monkeypatch.setattr(pyenv, "probe_version", probe)
    said = pyenv.venv_problem(str(env), "/usr/bin/python3")
    assert asked == [str(env / "bin" / "python")]
    assert (said is None) if problem is None else (said is not None and problem in said)
    kept = json.loads((env / pyenv.VENV_STAMP).read_text())
    if problem is None:  # known now: the next train starts nothing
        assert kept["interpreter"] == pyenv.interpreter(str(env / "bin" / "python")) and kept["version"] == "3.11"
    else:
        assert kept.get("interpreter") == stamp.get("interpreter")


def test_a_stamp_that_cannot_be_written_again_leaves_the_venv_sound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stamp of before (no interpreter recorded: every venv after the upgrade) is asked, and its interpreter
    recorded; where the venv's folder takes no file (a full disk, a home over its quota; here immutable), the
    venv is sound all the same, and the job runs (it was 'the wrapper failed before the job started')."""
    env = _venv(tmp_path, {"base": "/usr/bin/python3", "version": "3.11"})
    monkeypatch.setattr(pyenv, "probe_version", lambda python: "3.11")
    if os.geteuid() != 0 or subprocess.run(["chattr", "+i", str(env)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i (root, on a file system that has it) makes the folder take no file")
    try:
        with pytest.raises(OSError):
            (env / "probe").write_text("")  # (immutable indeed)
        assert pyenv.venv_problem(str(env), "/usr/bin/python3") is None
    finally:
        subprocess.run(["chattr", "-i", str(env)], check=True)
