"""The job's own Python environment, over a real sshd on loopback: uv fetched from the host's index
and used with its cache on REMOTE_ROOT, pip where uv cannot be had, a deleted or broken venv rebuilt,
a Python that is itself a venv used as it is, tensorboard found in the project's venv.

The host's index is a loopback one (tests/pyindex.py) serving uv's real binary and a small wheel; the
host's Python is the system's /usr/bin/python3 (Debian's, marked externally managed: PEP 668). This
suite's loopback addresses are 127.0.23.x.
"""

from __future__ import annotations

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


def test_a_uv_link_without_a_hash_is_refused(tmp_path: Path) -> None:
    """A link without a #sha256= was not checked at all: a substitute uv ran on the host."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.pyindex import uv_wheel

    fake = tmp_path / "uv"
    fake.write_bytes(b"#!/bin/sh\necho substitute\n")
    wheel = uv_wheel(tmp_path, fake)

    class Index(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = f'<a href="/files/{wheel.name}">{wheel.name}</a>'.encode() if self.path.startswith("/simple") else wheel.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    try:
        with pytest.raises(ValueError, match="gives no sha256"):
            uvfetch.fetch_uv(str(tmp_path / "root"), f"http://127.0.0.1:{server.server_address[1]}/simple")
        assert not (tmp_path / "root" / "tools").exists()
    finally:
        server.shutdown()
        server.server_close()
