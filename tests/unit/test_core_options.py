"""`gpu-train --help` shows gpu-train's own core options, not Fabric's (-H hosts, --hide, --prompt-for-...,
--ssh-config: for shell commands on hosts named on the command line, which no task of gpu-train runs),
and refuses them like any unknown flag. The real entry point, as a user runs it; `fab` keeps Fabric's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import FAB, ROOT

GPU_TRAIN = str(Path(sys.executable).parent / "gpu-train")
OWN = ("--complete", "--print-completion-script", "--stacks-dir", "--debug", "--help", "--list", "--version")
FABRICS = (
    "--hide",
    "--prompt-for-login-password",
    "--prompt-for-passphrase",
    "--prompt-for-sudo-password",
    "--ssh-config",
    "--hosts",
    "--identity",
    "--list-agent-keys",
    "--connect-timeout",
    "--command-timeout",
    "--write-pyc",
    "--warn-only",
    "--echo",
    "--dry",
    "--pty",
    "--config",
    "--list-format",
    "--list-depth",
)


def gpu_train(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [GPU_TRAIN, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(ROOT), "HOME": str(cwd)},
    )


def test_help_shows_only_gpu_trains_own_core_options(tmp_path: Path) -> None:
    shown = gpu_train("--help", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    core = shown.stdout.split("Core options:")[1].split("Subcommands:")[0]
    assert [o for o in OWN if o not in core] == []
    assert [o for o in FABRICS if o in core] == [], core
    assert "train" in shown.stdout.split("Subcommands:")[1]
    completion = gpu_train("--complete", "--", "gpu-train", "--", cwd=tmp_path)
    assert sorted(completion.stdout.split()) == sorted(OWN)


def test_fabrics_core_options_are_refused_and_gpu_trains_work(tmp_path: Path) -> None:
    for argv in (["--hide", "both", "stack"], ["-H", "somehost", "stack"], ["--prompt-for-passphrase", "stack"]):
        refused = gpu_train(*argv, cwd=tmp_path)
        assert refused.returncode == 2 and f"No idea what '{argv[0]}' is!" in refused.stderr, (argv, refused.stderr)
    assert gpu_train("-d", "stack", cwd=tmp_path).returncode == 0
    assert gpu_train("--version", cwd=tmp_path).stdout.startswith("gpu-train ")
    assert (
        "--hide"
        in subprocess.run([FAB, "--search-root", str(ROOT), "--help"], capture_output=True, text=True, timeout=60, cwd=tmp_path).stdout
    )  # the clone's `fab` is Fabric's own


def test_train_help_shows_each_options_help(tmp_path: Path) -> None:
    """gpu-train's and the clone's fab: train's flag check (`script_flag`) reads train's options before Invoke
    parses the line; Invoke hands each option's help text out once (it pops it), so the help page must come
    from the same parser."""
    fab = [FAB, "--search-root", str(ROOT)]
    for argv in (["--help", "train"], ["train", "--help"], [*fab, "--help", "train"], [*fab, "train", "--help"]):
        if argv[0] == FAB:
            shown = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path, stdin=subprocess.DEVNULL)
        else:
            shown = gpu_train(*argv, cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        options = shown.stdout.split("Options:")[1]
        assert "arguments for --script, as one quoted string" in options, options
        assert "stream the log until the job ends" in options, options
