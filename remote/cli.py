"""The `gpu-train` command: Invoke's own program over the same tasks as `fab`, from any directory.

`fab` needs a fabfile in (or above) the current directory, so it only works inside this clone;
`gpu-train` bundles the task collection, so it runs in the researcher's own project, with the same
options, `--help`, `-l` and completion. What both add to Invoke's parsing is here once, shared with the
clone's `fab` (remote/fab.py: its executor, and ``TaskLine`` put under Fabric's program by fabfile.py):
``gpu-train ssh -- CMD`` hands CMD to the task (Fabric would run it on ``-H`` hosts, and with none
it crashes), ``train x.py --help`` is train's help (not a run of a script called --help), a script's own
flag after ``train`` is refused naming ``--args``, and a mistyped task or flag gets a "did you mean".

Invoke's program, not Fabric's: Fabric's adds only options for running shell commands on hosts named
on the command line (which gpu-train neither shows nor takes), and loading it loads paramiko, about
60 ms of every command's start. A task that logs in with paramiko (no shared connection yet, a port
forward) imports it then; one that rides on the shared OpenSSH connection never does.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from invoke import Argument, Call, Exit, ParseError, ParserContext, ParseResult, Program, Result, Task
from invoke import Config as InvokeConfig
from invoke import Executor as InvokeExecutor
from invoke.parser import Parser

from gpu_train.environment import CONFIG_KEY, Environment
from gpu_train.errors import UsageError
from gpu_train.stack.project import did_you_mean
from remote.errors import exit_for, stops_as_ctrl_c

UNKNOWN = re.compile(r"No idea what '(.+)' is!")


def suggest(error: ParseError, tasks: list[str], flags: list[str]) -> str:
    """Invoke's "No idea what 'X' is!" with close task names (or flags, for a '-X') added."""
    m = UNKNOWN.fullmatch(str(error))
    if not m:
        return str(error)
    word = m.group(1)
    pool = flags if word.startswith("-") else tasks
    close = did_you_mean(word, pool)
    if close:
        return f"{error} Did you mean {' or '.join(close)}?"
    if word.startswith("-"):
        return str(error)
    return f"{error} Tasks: {', '.join(tasks)}"


def script_flag(
    tokens: list[str],
    flags: dict[str, bool],
    tasks: set[str],
    cli: str = "gpu-train",
    task: str = "train",
    positional: Callable[[str], bool] = lambda word: True,
) -> str | None:
    """Why `train ... --max-steps 10` is refused, when a flag after ``task`` (train, sweep) is not one of its own
    ``flags`` (name -> takes a value): the script's flags go in --args. None when every flag is the task's
    (``cli``: the command the user typed, for the hint; ``positional``: which words the task's positional
    takes: train's any script, sweep's its actions)."""
    if task not in tokens:
        return None
    rest = tokens[tokens.index(task) + 1 :]
    i, script_given = 0, False
    while i < len(rest):
        word = rest[i]
        if word in ("--", "--help", "-h"):
            return None
        name = word.split("=", 1)[0]
        if name in flags:
            if (
                name in ("--args", "--resume-args")
                and "=" not in word
                and (why := unquoted(rest, i, flags, tasks, script_given, positional))
            ):
                return f"{why} ({task}'s own: {cli} --help {task})"
            script_given = script_given or name in ("--script", "--command", "-c")
            i += 2 if flags[name] and "=" not in word else 1
            continue
        if word.startswith("-") and word != "-":
            if close := difflib.get_close_matches(name, sorted(f for f in flags if f.startswith("--")), n=2, cutoff=0.8):  # a typo
                return f"No idea what '{name}' is! Did you mean {' or '.join(close)}?"
            value = rest[i + 1] if i + 1 < len(rest) and not rest[i + 1].startswith("-") and rest[i + 1] not in tasks else ""
            given = " ".join(filter(None, (word, value)))
            return (
                f"{name} is not an option of {task}: your script's own flags go in --args, as one quoted string: "
                f"--args '{given}' ({task}'s own: {cli} --help {task})"
            )
        if word in tasks:
            return None
        script_given = script_given or positional(word)  # (a word of its own: train's script, sweep's action)
        i += 1
    return None


def unquoted(
    rest: list[str], i: int, flags: dict[str, bool], tasks: set[str], script_given: bool, positional: Callable[[str], bool]
) -> str | None:
    """Why `train x.py --args --epochs 3` is refused: ``rest[i]`` (--args or --resume-args) took only the
    script's first flag, and the words after it that are no task and no flag of train's would be read as
    tasks. None when its value is one word or the words after it are train's."""
    if i + 1 >= len(rest) or not rest[i + 1].startswith("-"):
        return None
    j = i + 2
    while j < len(rest) and rest[j] != "--" and rest[j] not in tasks and rest[j].split("=", 1)[0] not in flags:
        j += 1
    words = rest[i + 1 : j]
    if not script_given and len(words) > 1 and not words[-1].startswith("-") and positional(words[-1]):
        words = words[:-1]  # the last bare word is the script: `train --args --epochs 3 x.py`
    if len(words) < 2:
        return None
    import shlex

    return f"{rest[i]} takes your script's arguments as one quoted string: {rest[i]} {shlex.quote(' '.join(words))}"


def task_start(tokens: list[str], wanted: str, contexts: Mapping[str, ParserContext]) -> int | None:
    """Where the task ``wanted`` starts in the task part of a command line, as Invoke's parser reads it; None
    when it is not there. A task's name is a word of its own only where it is no value of the task before it:
    `logs --run train` names a run (the newest of train.py's), `sweep --name train` a sweep."""
    current: ParserContext | None = None
    missing: list[str] = []  # the current task's positionals still unset
    i = 0
    while i < len(tokens):
        word = tokens[i]
        if word == "--":
            return None
        name = word.split("=", 1)[0]
        if current is not None and name in current.flags:  # (its short flags too)
            argument = current.flags[name]
            missing = [m for m in missing if m != argument.name]
            i += 2 if argument.takes_value and "=" not in word else 1
            continue
        if current is not None and missing:  # (Invoke fills a positional before it looks for a task)
            missing.pop(0)
        elif word in contexts:
            if word == wanted:
                return i
            current = contexts[word]
            missing = [a.name for a in current.positional_args if a.name]
        i += 1
    return None


def help_asked(tokens: list[str], tasks: set[str]) -> str | None:
    """The task whose help the task part of a command line asks for (`train x.py --help`, `gpus -h`): a task
    whose first positional is still unset would otherwise take `--help` as its value, and run. None when no
    --help or -h follows a task (before ``--``)."""
    end = tokens.index("--") if "--" in tokens else len(tokens)
    first = next((w for w in tokens[:end] if w in tasks), None)
    if first is not None and any(w in ("--help", "-h") for w in tokens[tokens.index(first) + 1 : end]):
        return first
    return None


def hand_remainder(core: ParseResult, calls: list[Call]) -> None:
    """Text after ``--`` goes to the one task that asks for it (its ``remainder_kwarg``), not to ``-H`` hosts."""
    takers = [c for c in calls if getattr(getattr(c, "task", c), "remainder_kwarg", None)]
    if len(takers) != 1 or len(calls) != 1:
        raise exit_for(UsageError("`-- COMMAND` goes with one task that runs a command, e.g. `gpu-train ssh -- nvidia-smi`"))
    call = takers[0]
    taker: str = getattr(call.task, "remainder_kwarg")  # noqa: B009 (gpu-train's own attribute: shell, import)
    call.kwargs[taker] = core.remainder


class Executor(InvokeExecutor):
    """Text after ``--`` goes to the task that asks for it (``hand_remainder``); Ctrl-C that a task does
    not handle itself ends it with "interrupted" and exit status 130 (Invoke's own program would exit 1
    and say nothing); SIGTERM and SIGHUP are Ctrl-C (``stops_as_ctrl_c``)."""

    def execute(self, *tasks: str | tuple[str, dict[str, Any]] | ParserContext) -> dict[Task[Any], Result]:
        try:
            with stops_as_ctrl_c():
                return super().execute(*tasks)
        except KeyboardInterrupt as e:
            raise exit_for(e) from None

    def expand_calls(self, calls: list[Call]) -> list[Call]:
        if self.core is not None and self.core.remainder:
            hand_remainder(self.core, calls)
            self.core.remainder = ""  # handed once: the expansion of pre- and post-tasks (recursive) sees none
        return super().expand_calls(calls)


class TaskLine(Program):
    """The task part of a command line as `gpu-train` and the clone's `fab` both parse it, over Invoke's
    (or Fabric's) Program: ``TASK ... --help`` is that task's help, a script's flag after ``train`` is refused
    naming ``--args``, a mistyped task or flag gets a "did you mean", and every such error is bad input
    (exit 2, Invoke's own is 1). `gpu-train`'s program is one (``GpuTrain``); Fabric's, which `fab` runs, is
    made one by the clone's fabfile (``remote.fab.adopt``)."""

    _parser: tuple[object, Parser] | None = None

    def _make_parser(self) -> Parser:
        """The collection's parser, made once: Invoke's ``Task.get_arguments`` hands each option's help text out
        once (it pops it from ``task.help``), so a second parser (``script_flag``'s, then Invoke's own) would
        show a help page without them. (`fab`'s tasks are deep copies whose ``get_arguments`` still pops the
        original's: putting the texts back on the task is not enough.)"""
        if self._parser is None or self._parser[0] is not self.collection:
            self._parser = (self.collection, super()._make_parser())
        return self._parser[1]

    def parse_tasks(self) -> None:
        tokens, names = list(self.core.unparsed), set(self.collection.task_names)
        if (task := help_asked(tokens, names)) is not None:
            self.core.unparsed = []  # (parse_cleanup prints the task's help, as for `--help TASK`)
            self.args.help.value = task
            return super().parse_tasks()
        contexts = self._make_parser().contexts
        from remote.tasks.sweepoptions import ACTIONS

        for task, positional in (("train", lambda word: True), ("sweep", lambda word: word in ACTIONS)):
            start = task_start(tokens, task, contexts)
            if start is not None and (
                why := script_flag(tokens[start:], _flags(contexts[task]), names, self.binary_names[0], task, positional)
            ):
                raise exit_for(UsageError(why))
        try:
            super().parse_tasks()
        except ParseError as e:
            tasks = sorted(names)
            flags = sorted(e.context.flags) if e.context is not None else []  # the task being parsed
            raise exit_for(UsageError(suggest(e, tasks, flags))) from None

    def parse_cleanup(self) -> None:
        if self.args.complete.value:  # a --stack or --run value: the stacks and run ids this project knows
            import shlex

            from remote.tasks.completion import values

            words = shlex.split(self.core.remainder)
            env = getattr(self, "environment", None) or Environment.from_os()
            found = values(words[1:] if words and words[0] in self.binary_names else words, env)
            if found is not None:
                print("\n".join(found))
                raise Exit
        try:
            super().parse_cleanup()
        except ParseError as e:  # `--help TASK` of a task there is not
            raise exit_for(UsageError(suggest(e, sorted(self.collection.task_names), []))) from None


class Config(InvokeConfig):
    """Invoke's configuration under Fabric's name, as before: the files and variables `fab` reads
    (/etc/fabric.yaml, ~/.fabric.yaml, FABRIC_*). Without Fabric's SSH-config loading: a stack's SSH
    settings are gpu-train's own (remote/ssh/config.py)."""

    prefix = "fabric"


# The core options `gpu-train --help` shows and takes: its own, and Invoke's help, listing, version, debug
# and shell completion. Invoke's others (--hide, --prompt-for-sudo-password, --write-pyc, --echo, ...) are
# for running shell commands, which gpu-train's tasks never do: neither shown nor accepted; each keeps its
# default. (`fab` in the clone keeps them all, and Fabric's -H hosts, -i, --ssh-config, ...)
OWN_CORE = ("complete", "debug", "help", "list", "print-completion-script", "stacks-dir", "version")


class GpuTrain(TaskLine):
    def every_core_arg(self) -> list[Argument]:
        return [
            *super().core_args(),
            Argument(names=("stacks-dir",), help="another directory of stack files (after the project's stacks/)"),
        ]

    def core_args(self) -> list[Argument]:
        return [a for a in self.every_core_arg() if a.name in OWN_CORE]

    def parse_core_args(self) -> None:
        """The options gpu-train does not take are there for Invoke's own code, at their defaults, once
        the command line is parsed without them."""
        super().parse_core_args()
        for arg in self.every_core_arg():
            if arg.name not in OWN_CORE:
                self.core[0].add_arg(arg)

    def parse_core(self, argv: list[str] | None) -> None:
        try:
            super().parse_core(argv)
        except ParseError as e:  # Invoke exits 1 on a parse error, as a failed job would: it is bad input
            raise exit_for(UsageError(str(e))) from None

    def print_version(self) -> None:
        """As Fabric's program said it (its version, then Paramiko's and Invoke's), without loading paramiko."""
        from importlib.metadata import version

        from invoke import __version__ as invoke

        super().print_version()
        print(f"Paramiko {version('paramiko')}")
        print(f"Invoke {invoke}")

    environment: Environment | None = None  # the one main() built; else built from this process

    def update_config(self, merge: bool = True) -> None:
        """The tasks' Environment goes into their Context (``Environment.of(c)``), --stacks-dir in it."""
        super().update_config(merge)
        env = self.environment or Environment.from_os()
        if self.args["stacks-dir"].value:
            env = env.replace(stacks_dir=Path(self.args["stacks-dir"].value).expanduser().absolute())
        self.config[CONFIG_KEY] = env  # type: ignore[assignment]  # (Invoke's annotation says str; any value is kept)


def _flags(context: ParserContext) -> dict[str, bool]:
    """A task's flags as typed (--name, -n) -> whether each takes a value, from its parser context."""
    flags = context.flags
    return {name: flags[name].takes_value for name in (*flags.keys(), *flags.aliases.keys())}


def program(env: Environment | None = None) -> GpuTrain:
    from importlib.metadata import PackageNotFoundError, version

    from remote.tasks import ns

    try:
        own = version("gpu-train")
    except PackageNotFoundError:
        own = "unknown"
    gpu_train = GpuTrain(
        name="gpu-train",
        version=own,
        binary="gpu-train",
        binary_names=["gpu-train"],
        namespace=ns,
        executor_class=Executor,
        config_class=Config,
    )
    gpu_train.environment = env
    return gpu_train


# This clone's scripts, as subcommands: `gpu-train plan --stack t4` is `~/gpu-train/scripts/plan --stack t4`,
# run from the user's project (their options are the scripts' own: `gpu-train plan --help`).
SCRIPTS = ("plan", "preflight", "up")


def script_argv(argv: list[str]) -> list[str] | None:
    """The script's command line when ``argv`` (the process's) names one of SCRIPTS first; else None."""
    if len(argv) > 1 and argv[1] in SCRIPTS:
        from gpu_train.stack.project import REPO

        return [str(REPO / "scripts" / argv[1]), *argv[2:]]
    return None


def main() -> None:
    import os

    from remote import errors

    if (script := script_argv(sys.argv)) is not None:
        os.execv(script[0], script)  # the script, in this process: its output, exit status and Ctrl-C are the user's

    env = errors.install()  # as fabfile.py does for `fab`: an error is a message and an exit code
    program(env).run(sys.argv)
