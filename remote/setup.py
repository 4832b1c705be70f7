"""``scripts/setup``'s last step: the `gpu-train` command on PATH, and what is still missing.

The venv is made by scripts/_venv.sh. Here: a symlink ``~/.local/bin/gpu-train`` to the venv's
console script (so it runs from any project), and a short check: what SSH stacks need on this
machine (ssh, rsync 3.4+, git), then what the GCP path needs (the Pulumi CLI, a state backend,
Application Default Credentials), each missing piece with its fix. Exit 0 even when GCP pieces
are missing: SSH stacks work without them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from gpu_train.errors import ExitStatus
from gpu_train.views import checkup
from infra.ops import probes

REPO = Path(__file__).resolve().parents[1]


def link_command(bin_dir: Path, console_script: Path) -> str:
    """Make ``bin_dir/gpu-train`` point at the venv's script; what was done, in words."""
    link = bin_dir / "gpu-train"
    if link.is_symlink() and Path(os.readlink(link)) == console_script:
        return f"{link} -> {console_script} (already)"
    if link.exists() or link.is_symlink():
        if not link.is_symlink():
            return f"{link} exists and is not our link: left alone (run {console_script} directly)"
        link.unlink()  # our own older link (another clone): point it here
    bin_dir.mkdir(parents=True, exist_ok=True)
    link.symlink_to(console_script)
    return f"{link} -> {console_script}"


def ssh_findings() -> list[checkup.Finding]:
    from remote.transfer import sync

    found = [
        checkup.Finding("ssh (OpenSSH client)", bool(shutil.which("ssh")), shutil.which("ssh") or "not found", "install openssh-client")
    ]
    why = sync.local_rsync_problem()
    found.append(checkup.Finding("rsync 3.4+", why is None, "ok" if why is None else why.split(":")[0], "" if why is None else why))
    found.append(
        checkup.Finding(
            "git (to honour .gitignore)",
            bool(shutil.which("git")) or None,
            shutil.which("git") or "not found: rsync reads .gitignore files itself",
            "",
        )
    )
    return found


def gcp_findings() -> list[checkup.Finding]:
    version = probes.pulumi_version()
    found = [checkup.pulumi_cli(version)]
    found.append(checkup.backend(version is not None, probes.pulumi_whoami() if version is not None else None))
    adc, _ = probes.read_adc()
    found.append(checkup.credentials(adc))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/setup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-link", action="store_true", help="do not put gpu-train in ~/.local/bin")
    args = parser.parse_args(argv)
    console = Path(sys.executable).parent / "gpu-train"
    print(f"installed: {REPO / '.venv'} (gpu-train and its dependencies; tests and torch come with scripts/test)")
    if not args.no_link:
        bin_dir = Path.home() / ".local" / "bin"
        print(f"command: {link_command(bin_dir, console)}")
        if str(bin_dir) not in os.environ.get("PATH", "").split(os.pathsep):
            print(f'  {bin_dir} is not on your PATH: add  export PATH="{bin_dir}:$PATH"  to your shell\'s profile')
    print("\nSSH hosts (any machine you reach over SSH):")
    print(checkup.render(ssh_findings()).rsplit("\n\n", 1)[0])
    print("\nGoogle Cloud (GCP stacks only):")
    print(checkup.render(gcp_findings()))
    print("\nnext, in your project: gpu-train init --host USER@HOST   (or --gcp-project ID)")
    return ExitStatus.OK


if __name__ == "__main__":
    sys.exit(main())
