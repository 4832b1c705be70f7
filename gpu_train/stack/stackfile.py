"""Stack files on disk: where they are found, reading one safely, and the files a stack names.

``config`` turns the settings into a ``StackConfig``; this module finds ``Pulumi.NAME.yaml`` along
the project's search path (``project``), reads its ``config:`` mapping with every way a file can
be wrong said as a ``ConfigError`` (missing, a directory, not UTF-8, not YAML, aliases, too big),
and reads the SSH public key a stack points to.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gpu_train.stack import project
from gpu_train.stack.config import parse
from gpu_train.stack.problems import ConfigError, Problem
from gpu_train.stack.settings import NAMESPACE, StackConfig, looks_like_key_text

if TYPE_CHECKING:
    from gpu_train.catalog.model import Catalog


def stack_file(stack: str, dirs: list[Path], cli: str) -> Path:
    """A stack's file: the first along ``dirs``, the search path (``Environment.stack_file``); ConfigError
    naming the places looked, close names and the fix (``cli``: the command the user runs) when none."""
    found = project.stack_path(stack, dirs)
    if found is not None:
        return found
    close = project.did_you_mean(stack, project.stack_names(dirs))
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise ConfigError(
        [
            Problem(
                "stack",
                f"no stack named {stack!r} (looked for Pulumi.{stack}.yaml in {', '.join(str(d) for d in dirs)})",
                f"{hint}`{cli} init --stack {stack}` writes one into {dirs[0]}",
            )
        ]
    )


MAX_STACK_FILE_BYTES = 1 << 20


class _StackLoader(yaml.SafeLoader):
    """YAML without aliases: a 1 KB file of nested aliases ("billion laughs") expands to gigabytes."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed in a stack file; write the value out", mark)
        return super().compose_node(parent, index)


def read_stack_file(path: Path) -> dict[str, Any]:
    """The ``config:`` mapping of a Pulumi stack file (a directory, unreadable bytes or aliases: ConfigError)."""
    fix = "create it with `pulumi stack init NAME`, or copy one from stacks/"
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_STACK_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError([Problem("stack", f"no stack file at {path}", fix)]) from None
    except IsADirectoryError:
        raise ConfigError([Problem("stack", f"{path} is a directory, not a stack file", fix)]) from None
    except OSError as e:
        raise ConfigError([Problem("stack", f"cannot read {path}: {e.strerror}", "check its permissions")]) from None
    if len(data) > MAX_STACK_FILE_BYTES:
        raise ConfigError([Problem("stack", f"{path} is over {MAX_STACK_FILE_BYTES >> 20} MiB", "is it a stack file?")])
    try:
        doc = yaml.load(data.decode("utf-8"), Loader=_StackLoader) or {}
    except UnicodeDecodeError as e:
        raise ConfigError([Problem("stack", f"{path} is not UTF-8 text (byte {e.start})", "save it as UTF-8")]) from None
    except yaml.YAMLError as e:
        raise ConfigError([Problem("stack", f"{path} is not valid YAML: {shown_text(str(e), 400)}", "fix the file's syntax")]) from None
    except RecursionError:
        raise ConfigError([Problem("stack", f"{path} nests too deeply", "fix the file's syntax")]) from None
    config = doc.get("config", {}) if isinstance(doc, dict) else None
    if not isinstance(config, dict):
        raise ConfigError([Problem("stack", f"{path} has no `config:` mapping", "see stacks/ for examples")])
    return config


def shown_text(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def stack_name_from_path(path: Path) -> str:
    name = path.name
    if name.startswith("Pulumi.") and name.endswith((".yaml", ".yml")):
        return name.removeprefix("Pulumi.").rsplit(".", 1)[0]
    return path.stem


def load_file(path: Path, catalog: Catalog) -> StackConfig:
    return parse(read_stack_file(path), stack_name_from_path(path), catalog)


def load_stack(stack: str, catalog: Catalog, dirs: list[Path], cli: str) -> StackConfig:
    return parse(read_stack_file(stack_file(stack, dirs, cli)), stack, catalog)


# -- local files a stack refers to ------------------------------------------------------------
def read_public_key(cfg: StackConfig) -> tuple[str | None, Problem | None]:
    """The SSH public key's text: given inline, or read from the path given."""
    value = cfg.ssh_public_key
    if looks_like_key_text(value):
        return value.strip(), None
    path = Path(value).expanduser()
    fix = f"create a key with `ssh-keygen -t ed25519`, or set {NAMESPACE}:sshPublicKey to your public key or its path"
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None, Problem("sshPublicKey", f"no readable public key at {path}", fix, value)
    if not looks_like_key_text(text):
        return None, Problem("sshPublicKey", f"{path} does not hold an OpenSSH public key", fix, value)
    return text, None
