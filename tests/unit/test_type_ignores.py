"""Every `# type: ignore` names its error codes and says why, in a comment after it on the same line
(CONTRIBUTING.md, "Types"): an ignore without its reason cannot be judged when the library or the code
under it changes, and a bare one hides every error of its line."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("agent", "bench", "examples", "gpu_train", "infra", "remote", "scripts", "stacks", "tests", "fabfile.py")
IGNORE = re.compile(r"#\s*type:\s*ignore\b")  # (what Python's parser takes for one: a comment that opens with it)
# `# type: ignore[code, ...]  # why`: the codes, then the reason as a comment of its own
WITH_REASON = re.compile(r"#\s*type:\s*ignore\[[a-z-]+(?:\s*,\s*[a-z-]+)*\]\s+#\s*\S")


def python_files() -> list[Path]:
    paths = [ROOT / t for t in TOPS]
    return sorted(f for p in paths for f in ([p] if p.is_file() else p.rglob("*.py")) if "__pycache__" not in f.parts)


def unexplained(source: str) -> list[tuple[int, str]]:
    """The lines whose comment holds a `type: ignore` without codes or without a reason (strings and
    docstrings that mention one are not comments)."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and IGNORE.match(token.string) and not WITH_REASON.match(token.string):
            found.append((token.start[0], token.string))
    return found


@pytest.mark.parametrize(
    ("line", "ok"),
    [
        ("x = f()  # type: ignore[arg-type]  # (the stub says str; bytes work)\n", True),
        ("x = f()  # type: ignore[union-attr,arg-type]  # (argparse's private fields)\n", True),
        ("x = f()  # type: ignore[arg-type]\n", False),  # no reason
        ("x = f()  # type: ignore\n", False),  # no code: every error of the line hidden
        ("x = f()  # type: ignore  # because\n", False),
        ("x = f()  # type: ignore[arg-type]  #\n", False),  # an empty reason
        ("x = f()  # type:ignore[misc]\n", False),
        ('x = "# type: ignore[arg-type]"\n', True),  # a string, not a comment
        ("x = f()  # noqa: E501\n", True),
        ("x = f()  # says `# type: ignore` in words\n", True),  # not one for the parser either
    ],
)
def test_the_rule(line: str, ok: bool) -> None:
    assert (unexplained(line) == []) is ok


def test_every_type_ignore_says_why() -> None:
    files = python_files()
    assert len(files) > 300, "the tree was not found"
    bad = [f"{f.relative_to(ROOT)}:{n}: {text}" for f in files for n, text in unexplained(f.read_text(encoding="utf-8"))]
    assert bad == [], "a type: ignore names its codes and then why, `# type: ignore[code]  # (why)`:\n" + "\n".join(bad)
