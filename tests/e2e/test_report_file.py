"""`gpu-train report`'s file, where it goes by default: the project's runs/ (real sshd, real sync). The page
itself in a browser is tests/e2e/test_dashboard.py's."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import Lab

LAB_ADDRESS = "127.0.47.2"


def test_a_report_stays_out_of_the_next_runs_code(lab: Lab) -> None:
    (lab.cwd / "train.py").write_text("print('hi')\n")
    first = lab.train("--command", "true")
    lab.wait(first)
    out = lab.fab("report", "--json", check=True)
    path = Path(json.loads(out.stdout)["path"])
    # beside the fetched runs (runs/STACK/RUN), not among the code
    assert path.parent == lab.cwd / "runs" and path.name.endswith(".html") and "-report-" in path.name, path
    assert first in path.read_text()
    run = lab.train("--command", "true")
    lab.wait(run)
    sent = sorted(p.relative_to(lab.remote / "runs" / run / "code").as_posix() for p in (lab.remote / "runs" / run / "code").rglob("*"))
    assert sent == ["train.py"], sent
    # --output still writes where it is told
    asked = lab.cwd / "notes" / "appendix.html"
    assert lab.fab("report", "--output", str(asked), check=True).stdout.strip() == str(asked) and asked.is_file()
