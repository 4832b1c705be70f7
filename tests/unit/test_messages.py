"""What a new user reads: messages name the command they run, paths that work from where they are,
counts that agree with their lists, and whole sentences (a new user's first try, in tables)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path

import pytest

from agent import bundle
from agent.store import AgentError, find_run, listed, match_run
from gpu_train import jobs
from gpu_train.gcp import power
from gpu_train.stack import placeholders, project
from gpu_train.views import checkup, listing
from tests.conftest import ROOT, parse_source


@pytest.mark.parametrize(
    ("argv0", "name"),
    [
        ("/home/u/gpu-train/.venv/bin/gpu-train", "gpu-train"),
        ("gpu-train", "gpu-train"),
        ("/usr/local/bin/fab", "fab"),
        ("fab", "fab"),
        ("/x/site-packages/fabric/__main__.py", "fab"),  # python -m fabric
        ("/x/site-packages/pytest/__main__.py", "gpu-train"),
        ("/repo/infra/plan.py", "gpu-train"),
        ("", "gpu-train"),
    ],
)
def test_command_name(argv0: str, name: str) -> None:
    assert project.command_name(argv0) == name


def test_repo_script_works_from_where_the_user_is(tmp_path: Path) -> None:
    repo = tmp_path / "gpu-train"
    (repo / "infra").mkdir(parents=True)
    assert project.repo_script("plan", repo, repo) == "scripts/plan"
    assert project.repo_script("plan", repo / "infra", repo) == "../scripts/plan"
    assert project.repo_script("up", tmp_path, repo) == str(repo / "scripts" / "up")  # a project elsewhere


def test_no_stack_says_why_and_what_to_do(tmp_path: Path) -> None:
    what, fix = project.no_stack([], None, tmp_path, "gpu-train")
    assert f"no stacks/ directory or .git in {tmp_path} or any directory above it" in what
    assert "gpu-train init --host USER@HOST" in fix and "--stacks-dir DIR" in fix and "--stack NAME" in fix
    what, fix = project.no_stack(["a", "b"], tmp_path, tmp_path, "fab")
    assert "this project has a, b" in what and "`fab stack a`" in fix and "--stack NAME" in fix
    what, fix = project.no_stack([], tmp_path, tmp_path, "fab")
    assert "has no stack files" in what and "fab init" in fix
    (tmp_path / "p" / "stacks").mkdir(parents=True)
    (tmp_path / "p" / "src").mkdir()
    assert project.find_project(tmp_path / "p" / "src") == tmp_path / "p"


@pytest.mark.parametrize("count", [1, 4, 5, 8, 9, 30])
def test_a_count_and_its_list_agree(count: int) -> None:
    ids = [f"train_2026112{i % 10}_{i:06d}" for i in range(count)]
    text = listed(ids)
    shown = re.findall(r"train_\w+", text)
    more = int(m.group(1)) if (m := re.search(r" and (\d+) more$", text)) else 0
    assert len(shown) + more == count and len(set(shown)) == len(shown)
    if count > 1:
        with pytest.raises(AgentError) as e:
            match_run(ids, "train_2026112", {})
        said = str(e.value)
        assert f"matches {count} runs ({text})" in said


@pytest.mark.parametrize(
    ("sources", "words"),
    [
        (["compute api"], "VM states from the Compute API (s0)"),
        (["host answered", "not asked"], "VM states from the host's answer (s0); not asked (s1)"),
        (["not asked"], "VM states not asked (s0)"),
        (["last known outputs", "compute api", "compute api"], "VM states from the Compute API (s1, s2); from the last known"),
        (
            ["ssh", "stack file", "no outputs"],
            "VM states unknown (SSH failed) (s0); unknown (invalid stack file) (s1); none deployed (no stack outputs) (s2)",
        ),
    ],
)
def test_ls_footer_reads_as_english(sources: list[str], words: str) -> None:
    table = [listing.Row(f"s{i}", "gcp", "-", "-", "-", s, None, None, None, "-", False) for i, s in enumerate(sources)]
    assert words in listing.render(table)
    assert set(listing.SOURCE_WORDS) >= {
        "compute api",
        "host answered",
        "last known outputs",
        "ssh",
        "stack file",
        "not asked",
        "no outputs",
    }


def test_every_vm_state_source_has_words() -> None:
    """Every "how it is known" that vm_state can return is in SOURCE_WORDS (read from its source)."""
    source = Path(listing.__file__).read_text()
    body = source[source.index("def vm_state") : source.index("def _billing")]
    said = set(re.findall(r'"([a-z ]+)"\)?\s*$', body, re.M)) | set(re.findall(r', "([a-z ]+)"\)', body))
    assert said and said <= set(listing.SOURCE_WORDS), said - set(listing.SOURCE_WORDS)


def test_every_task_says_what_it_does_in_one_whole_sentence() -> None:
    """`gpu-train -l` shows each task's first docstring line: it must be a whole short sentence."""
    from remote.tasks import ns

    for name in sorted(ns.task_names):
        doc = (ns[name].__doc__ or "").strip()
        first = doc.splitlines()[0].strip() if doc else ""
        assert first and first[-1] in ".?!" and len(first) <= 120, f"{name}: {first!r}"
        rest = doc.splitlines()[1:2]
        assert not rest or not rest[0].strip(), f"{name}: the first line's sentence goes on: {rest[0].strip()!r}"


FAB_WORD = re.compile(r"(?<![\w/-])fab (?=[a-z-])")
# A resource's input: changing it would change deployed data disks (their description).
FAB_ALLOWED = {("infra/gpu_vm.py", "`fab down` fetches them before it lets the disk go")}


def test_no_message_names_fab_outright() -> None:
    """Messages name the command that runs (``CLI``, ``cli_name()``, or a ``cli`` argument), never `fab` as such."""
    found = []
    for top in ("gpu_train", "remote", "infra"):
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = parse_source(path)
            docs = {
                id(n.body[0].value)
                for n in ast.walk(tree)
                if isinstance(n, ast.Module | ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
                and n.body
                and isinstance(n.body[0], ast.Expr)
                and isinstance(n.body[0].value, ast.Constant)
            }
            rel = path.relative_to(ROOT).as_posix()
            for n in ast.walk(tree):
                said = n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs else ""
                if FAB_WORD.search(said) and not any(rel == f and words in said for f, words in FAB_ALLOWED):
                    found.append(f"{rel}:{n.lineno}: {said[:80]!r}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("cli", ["fab", "gpu-train"])
def test_the_agent_names_the_laptops_command(tmp_path: Path, cli: str) -> None:
    cmd = bundle.agent_command(str(tmp_path / "root"), "logs", cli=cli)
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60)
    said = json.loads((out.stdout or out.stderr).strip().splitlines()[-1])
    assert f"start one with `{cli} train`" in said["error"]


def test_pure_fixes_name_the_command() -> None:
    assert "fab stop --stack t4" in power.refusal(["r"], [], False, "t4", "fab")
    assert "gpu-train vm-stop --force" in power.refusal([], ["x"], False, "t4", "gpu-train")
    bad = checkup.stack_file(
        "b",
        None,
        "stack 'b' is invalid (1 problem):\n  - gpu-train:zone: is required",
        None,
        "",
        "/home/u/gpu-train/scripts/plan",
        "/home/u/gpu-train/scripts/up",
    )
    assert bad.fix == "/home/u/gpu-train/scripts/plan --stack b lists every problem and its fix"
    assert "/x/scripts/up --stack t" in checkup.stack_file("t", "gcp", None, False, "backend", "/x/scripts/plan", "/x/scripts/up").detail


def test_missing_script_says_relative_to_what(tmp_path: Path) -> None:
    root = tmp_path / "myproj"
    (root / "src").mkdir(parents=True)
    (root / "train.py").write_text("")
    (root / "src" / "sub_train.py").write_text("")
    (root / ".venv" / "lib").mkdir(parents=True)
    (root / ".venv" / "lib" / "trian.py").write_text("")  # never suggested: not the project's code
    found = jobs.script_candidates(root)
    assert found == ["train.py", "src/sub_train.py"]

    def said(script: str, cwd: Path) -> str:
        with pytest.raises(jobs.JobError) as e:
            jobs.job_spec(
                run="r", base="r", script=script, command=None, args="", env=[], python=None, expect_gpus=0, code_dir=root, cwd=cwd
            )
        return str(e.value)

    from_src = said("sub_train.py", root / "src")
    assert f"no such file in {root}, the folder the job runs in (--script paths are relative to it)" in from_src
    assert "from here, use --script src/sub_train.py" in from_src
    assert "did you mean train.py?" in said("trian.py", root)
    assert "did you mean src/sub_train.py?" in said("sub_train.py", tmp_path)  # the same name elsewhere in the project
    (tmp_path / "outside.py").write_text("")
    assert "outside it" in said("outside.py", tmp_path)
    assert "did you mean" not in said("zzzz.py", root)


@pytest.mark.parametrize(
    ("text", "doc"),
    [
        ("203.0.113.7/32", True),
        ("203.0.113.0/24", True),
        ("198.51.100.9/32", True),
        ("192.0.2.0/25", True),
        ("2001:db8::1/128", True),
        ("203.0.114.7/32", False),
        ("198.51.0.0/16", False),
        ("10.1.2.3/32", False),
        ("0.0.0.0/0", False),
        ("not-a-cidr", False),
    ],
)
def test_documentation_ranges(text: str, doc: bool) -> None:
    assert placeholders.is_documentation_range(text) is doc


def test_placeholders_name_the_setting_and_the_fix() -> None:
    found = placeholders.check("my-proj", ("203.0.113.7/32",))
    assert [(p.key, p.severity) for p in found] == [("gcp:project", "warning"), ("sshSourceRanges", "warning")]
    assert "gcloud projects list" in found[0].fix and "curl -s ifconfig.me" in found[1].fix
    assert placeholders.check("proj-42", ("10.1.2.3/32",)) == []


@pytest.mark.parametrize(("argv0", "cli"), [("/venv/bin/fab", "fab"), ("/venv/bin/gpu-train", "gpu-train")])
def test_the_agent_is_told_the_command_the_user_typed(tmp_path: Path, argv0: str, cli: str) -> None:
    """The Environment's command name reaches the host through the stack's Target, on every node."""
    from gpu_train.environment import Environment
    from remote.ssh.target import resolve
    from remote.transfer.fetch.stream import host_command

    (tmp_path / "id").write_text("a key")
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "Pulumi.s.yaml").write_text(
        json.dumps(
            {
                "config": {
                    "gpu-train:target": "ssh",
                    "gpu-train:hosts": ["me@127.0.0.1", "me@127.0.0.2"],
                    "gpu-train:sshKey": str(tmp_path / "id"),
                }
            }
        )
    )
    env = Environment.from_os(
        {"GPU_TRAIN_STACKS_DIR": str(tmp_path / "stacks"), "GPU_TRAIN_HOME": str(tmp_path / "home")}, argv0=argv0, cwd=tmp_path
    )
    node = resolve(env, "s").for_node(1)
    assert node.cli == cli
    assert f"exec env GPU_TRAIN_CLI={cli} " in host_command(node)


def test_an_unknown_run_lists_this_projects_runs(tmp_path) -> None:
    """`logs --run nope` in a project listed the host's first run names in sorted order: another project's
    nine sweep trials, not this project's two runs. A "did you mean" or a prefix's matches still win."""
    runs = [("fit_20261128_082539", "a-1"), ("fit_20261128_082825", "a-1")]
    runs += [(f"svm_t{k}_20261128_0841{k:02d}", "b-2") for k in range(9)]
    for created, (rid, owner) in enumerate(runs):
        (tmp_path / "runs" / rid).mkdir(parents=True)
        (tmp_path / "runs" / rid / "state.json").write_text(json.dumps({"project": owner, "created": created}))
    scope = (("a-1",), None)

    def said(wanted: str) -> str:
        with pytest.raises(AgentError) as e:
            find_run(str(tmp_path), wanted, scope)
        return str(e.value)

    assert said("nope") == "no run 'nope' on this host; runs here: fit_20261128_082539, fit_20261128_082825"
    assert said("svm_t").startswith("'svm_t' matches 9 runs (svm_t")  # another project's, by a prefix
    assert "did you mean svm_t3_20261128_084103" in said("svn_t3_20261128_084103")  # (a typo)
    assert find_run(str(tmp_path), "svm_t4", scope).endswith("svm_t4_20261128_084104")
    assert "runs here: svm_t" in said_everywhere(tmp_path, "nope")


def said_everywhere(root, wanted: str) -> str:
    """--all-projects: every run is the scope's."""
    with pytest.raises(AgentError) as e:
        find_run(str(root), wanted)
    return str(e.value)
