"""The agent as one zipapp: the same sources give the same bytes, and the bootstrap installs it once."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tokenize
import zipfile
from io import BytesIO
from pathlib import Path

import pytest

from agent import bundle


def test_the_zipapp_is_deterministic_and_holds_the_package() -> None:
    first = bundle.build({"b.py": b"B = 1\n", "a.py": b"A = 1\n"})
    assert first == bundle.build({"a.py": b"A = 1\n", "b.py": b"B = 1\n"})  # order of discovery does not matter
    names = zipfile.ZipFile(BytesIO(first)).namelist()
    assert (
        names
        == sorted(names)
        == [
            "__main__.py",
            "gpu_train/__init__.py",
            "gpu_train/answers.py",
            "gpu_train/atomic.py",
            "gpu_train/bucketdoc.py",
            "gpu_train/checksum.py",
            "gpu_train/codec.py",
            "gpu_train/containerspec.py",
            "gpu_train/contract.py",
            "gpu_train/data/uv-wheels.json",
            "gpu_train/fetchwire.py",
            "gpu_train/ownership.py",
            "gpu_train/recovery.py",
            "gpu_train/retry.py",
            "gpu_train/sweeps.py",
            f"{bundle.PACKAGE}/a.py",
            f"{bundle.PACKAGE}/b.py",
        ]
    )
    assert {i.date_time for i in zipfile.ZipFile(BytesIO(first)).infolist()} == {(1980, 1, 1, 0, 0, 0)}
    shipped = zipfile.ZipFile(BytesIO(bundle.payload())).namelist()
    assert "gpu_train/contract.py" in shipped and f"{bundle.PACKAGE}/bundle.py" not in shipped


def test_what_is_sent_is_built_once_per_checkout_and_is_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Building it tokenized every source (0.2 s of CPU a task): it is kept under a hash of its inputs."""
    sources = {p.name: p.read_bytes() for p in sorted(bundle.HERE.glob("*.py")) if p.name not in bundle.LAPTOP_ONLY}
    assert bundle.payload() == bundle.build(sources)  # as kept, what a fresh build gives
    assert bundle.lean((bundle.HERE / "guard.py").read_bytes()).decode() == bundle.GUARD
    made: list[str] = []

    def make() -> str:
        made.append("x")
        return f"made {len(made)}"

    monkeypatch.setattr(bundle, "CACHE", tmp_path / "cache")
    assert bundle.cached("t", [b"a", b"b"], make) == bundle.cached("t", [b"a", b"b"], make) == "made 1"
    assert bundle.cached("t", [b"a", b"c"], make) == "made 2"  # another input: built again
    assert len(list((tmp_path / "cache").glob("t-*.txt"))) == 2
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(bundle, "CACHE", tmp_path / "file")  # no folder to keep it in: built every time
    assert [bundle.cached("t", [b"a"], make) for _ in range(2)] == ["made 3", "made 4"]


def code_of(source: bytes) -> str:
    """The syntax tree with every node's line and column, its docstrings left out (and where a class's
    docstring was all its body, where the class ends)."""
    tree = bundle.parse_python(source)
    for node in ast.walk(tree):
        if bundle._docstring(node):
            node.body = node.body[1:]
            if isinstance(node, ast.stmt):  # (a module has no columns)
                node.end_col_offset = None
    return ast.dump(tree, include_attributes=True)


def test_the_agent_travels_without_comments_and_docstrings_each_line_where_it_was() -> None:
    """What runs on the host is the checkout's code: the same syntax tree, every node at its line and column."""
    sources = [*sorted(bundle.HERE.glob("*.py")), *(bundle.CORE / name for name in bundle.CARRIED)]
    sizes = [0, 0]  # shipped, source
    for path in sources:
        source = path.read_bytes()
        shipped = bundle.lean(source)
        sizes[0], sizes[1] = sizes[0] + len(shipped), sizes[1] + len(source)
        assert code_of(shipped) == code_of(source), path.name
        assert shipped.count(b"\n") == source.count(b"\n"), path.name
        assert not [t for t in tokenize.tokenize(BytesIO(shipped).readline) if t.type == tokenize.COMMENT], path.name
        assert all(not ast.get_docstring(n) for n in ast.walk(bundle.parse_python(shipped)) if bundle._docstring(n)), path.name
    assert bundle.lean(b"x = '# kept'  # gone\n") == b"x = '# kept'\n"
    assert (
        bundle.lean(b'def f():\n    """Why,\n    in two lines."""\n    return "kept"\n') == b'def f():\n    """\n"""\n    return "kept"\n'
    )
    assert bundle.lean(b"class E(Exception):\n    'one line'\n") == b'class E(Exception):\n    ""\n'
    assert sizes[0] < 0.8 * sizes[1]


def run(cmd: str) -> dict:
    # As over SSH: none of the Python settings of the environment the tests run in.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_bootstrap_installs_the_zipapp_only_when_it_changed(tmp_path: Path) -> None:
    root = tmp_path / "gpu-train"
    doc = run(bundle.agent_command(str(root), "status", cli="gpu-train"))
    assert doc["root"] == str(root) and doc["runs"] == []
    installed = root / "bin" / "gpu-train-agent"
    assert installed.read_bytes() == bundle.payload() and os.access(installed, os.X_OK)
    before = installed.stat()
    run(bundle.agent_command(str(root), "status", cli="gpu-train"))
    assert installed.stat().st_ino == before.st_ino  # unchanged: not rewritten
    # The installed file runs on its own (as the job wrapper, cron and systemd run it).
    out = subprocess.run(["python3", str(installed), "--root", str(root), "status"], capture_output=True, text=True)
    assert json.loads(out.stdout)["root"] == str(root)
    installed.write_bytes(b"stale")
    run(bundle.agent_command(str(root), "status", cli="gpu-train"))
    assert installed.read_bytes() == bundle.payload()  # a different copy is replaced
    assert not list(installed.parent.glob("*.tmp.*"))
    # Imported from a folder unpacked once per version, where Python keeps the compiled modules.
    unpacked = list(installed.parent.glob(f"{bundle.UNPACKED}*"))
    assert len(unpacked) == 1 and (unpacked[0] / bundle.PACKAGE / "cli.py").is_file()
    assert list((unpacked[0] / bundle.PACKAGE / "__pycache__").glob("cli.*.pyc"))
    assert unpacked[0].stat().st_mode & 0o077 == 0


def test_a_call_of_the_installed_version_does_not_decode_what_it_carries(tmp_path: Path) -> None:
    """Every call carries the agent, but only a new version's first call decodes and installs it: the
    others find this version installed and unpacked (about 11 ms of each call, issue 36)."""
    root = tmp_path / "gpu-train"
    command = bundle.agent_command(str(root), "status", cli="gpu-train")
    garbled = command.replace(bundle.packed_payload(), "~")  # not base85: decoding it fails
    assert garbled != command
    run(command)
    assert run(garbled)["root"] == str(root)
    (root / "bin" / "gpu-train-agent").write_bytes(b"another version")  # installed by another laptop since
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    out = subprocess.run(["bash", "-c", garbled], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode != 0 and "b85decode" in out.stderr  # it decoded what it carries, to install it again
    assert run(command)["root"] == str(root)
    assert (root / "bin" / "gpu-train-agent").read_bytes() == bundle.payload()


def versions() -> tuple[bytes, bytes]:
    sources = {p.name: p.read_bytes() for p in sorted(bundle.HERE.glob("*.py")) if p.name not in bundle.LAPTOP_ONLY}
    return bundle.build({**sources, "zz_one.py": b"X = 1\n"}), bundle.build({**sources, "zz_two.py": b"X = 2\n"})


def test_the_zipapp_imports_nothing_it_does_not_carry() -> None:
    """What is left out of the zipapp (bundle.LAPTOP_ONLY) is never imported by what goes in."""
    import ast

    shipped = {p.stem for p in bundle.HERE.glob("*.py") if p.name not in bundle.LAPTOP_ONLY}
    left_out = {name.removesuffix(".py") for name in bundle.LAPTOP_ONLY}
    for name in shipped:
        tree = bundle.parse_python((bundle.HERE / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                assert node.module not in left_out, f"{name}.py imports .{node.module}, which the zipapp leaves out"


def test_the_bootstrap_is_a_module_sent_with_its_imports_inlined() -> None:
    """agent/bootstrap.py is real code (linted, typed); what travels is its lean text with the two imports
    that cannot run on a host yet replaced by their values, after guard.py's source."""
    from agent import bootstrap

    assert bootstrap.PACKAGE == bundle.PACKAGE
    sent = bundle.BOOTSTRAP[len(bundle.GUARD) :]
    assert "import" not in "".join(line for line in sent.splitlines() if "agent.guard" in line or "gpu_train" in line)
    assert f"UNPACKED = {bundle.UNPACKED!r}" in sent
    compile(bundle.BOOTSTRAP, "<bootstrap>", "exec")  # one program, guard first


def test_the_unpacked_folder_is_on_disk_before_its_name_says_it_is_complete(tmp_path: Path) -> None:
    """A later call trusts the folder by its name alone. Unpacked without fsync, a machine reset soon after
    (ext4 may write the rename before the files' blocks) left the version's folder holding empty files,
    and every call of that version failed on them. Seen in the real bootstrap's system calls."""
    if not shutil.which("strace"):
        pytest.skip("needs strace")
    root, trace = tmp_path / "gpu-train", tmp_path / "trace"
    command = bundle.agent_command(str(root), "status", cli="gpu-train")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    traced = subprocess.run(
        ["strace", "-f", "-qq", "-y", "-e", "trace=fsync,rename", "-o", str(trace), "bash", "-c", command],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    if traced.returncode != 0 and "ptrace" in traced.stderr:
        pytest.skip(f"strace cannot trace here: {traced.stderr.strip()[:200]}")
    assert json.loads(traced.stdout)["root"] == str(root), traced.stderr
    calls = trace.read_text().splitlines()
    [folder] = (root / "bin").glob(f"{bundle.UNPACKED}*")
    renamed = next(i for i, c in enumerate(calls) if "rename(" in c and f'"{folder}"' in c)
    synced = {m.group(1) for c in calls[:renamed] if (m := re.search(r"fsync\(\d+<(.*)>\)", c))}
    [tmp] = re.findall(r'rename\("([^"]+)"', calls[renamed])
    made = {str(p).replace(str(folder), tmp) for p in [folder, *folder.rglob("*")] if "__pycache__" not in p.parts}
    assert made <= synced, sorted(made - synced)[:5]
    assert any("fsync(" in c and f"<{root / 'bin'}>" in c for c in calls[renamed:])  # the rename itself
    installed = re.escape(str(root / "bin" / "gpu-train-agent"))  # the zipapp a reboot's resume runs, likewise
    assert any(re.search(rf"fsync\(\d+<{installed}\.tmp\.\d+>\)", c) for c in calls), calls


def test_a_python_without_lzma_is_said_where_the_call_reads_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`logs` streams the log on stdout, so its errors go to stderr, the bootstrap's own refusals too: a host
    whose python3 lacks lzma (built without liblzma) says so there, not as a line of the run's log. The
    bootstrap as the host runs it (``python3 -c``), in this process with lzma made unimportable."""
    root = tmp_path / "gpu-train"
    code = compile(bundle.BOOTSTRAP, "<string>", "exec")
    monkeypatch.setitem(sys.modules, "lzma", None)  # `import lzma` raises ImportError, as where it is missing
    for args, stream in ((("logs", "--run", "r_20250101_000000"), "err"), (("status",), "out")):
        monkeypatch.setattr(sys, "argv", ["-c", bundle.payload_version(), bundle.packed_payload(), "--root", str(root), *args])
        with pytest.raises(SystemExit) as exited:
            exec(code, {"__name__": "__main__"})
        assert exited.value.code == 2
        said = capsys.readouterr()
        assert "lacks the standard library's lzma module" in json.loads(getattr(said, stream))["error"], (args, said)
