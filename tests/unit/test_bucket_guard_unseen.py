"""`down --no-fetch` trusts the host's word that the bucket holds everything: what the host cannot read
(a root-owned folder a container wrote, a file of mode 000) is named as only on the host, never left out."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv (util-linux)")
def test_what_the_host_cannot_read_is_only_on_the_host(tmp_path: Path) -> None:
    run_dir = tmp_path / "root" / "runs" / "r_20260101_000000"
    (run_dir / "job" / "ckpts").mkdir(parents=True)
    (run_dir / "job" / "ckpts" / "step1.pt").write_bytes(b"x")
    (run_dir / "job" / "model.tmp.pt").write_bytes(b"y")  # a finished file with ".tmp." in its name
    (run_dir / "job" / "ok.txt").write_bytes(b"z")
    (run_dir / "code").mkdir()
    (run_dir / "job" / "ckpts").chmod(0)
    record = {"files": {"ok.txt": {"size": 1, "mtimeNs": (run_dir / "job" / "ok.txt").stat().st_mtime_ns}}}
    try:
        # as the host's login user, not root: root reads mode 000 (the sshd of tests/e2e/test_outputs' blind_lab)
        out = subprocess.run(
            [
                "setpriv",
                "--bounding-set",
                "-dac_override,-dac_read_search",
                "--",
                sys.executable,
                "-c",
                "import json,sys; from agent import upload; "
                f"print(json.dumps(upload.only_on_host({str(run_dir)!r}, json.loads(sys.argv[1]))))",
                json.dumps(record),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    finally:
        (run_dir / "job" / "ckpts").chmod(0o755)
    assert out.returncode == 0, out.stderr
    only = json.loads(out.stdout)
    assert "model.tmp.pt" in only and "ok.txt" not in only
    assert any(line.startswith("ckpts (unreadable on the host") for line in only), only
