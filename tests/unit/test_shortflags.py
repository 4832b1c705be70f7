"""One meaning per short flag across every task (``-s`` is ``--stack`` everywhere), long names unchanged."""

from __future__ import annotations

from collections import defaultdict

import pytest
from invoke import ParseError
from invoke.parser import Parser, ParserContext

from remote.tasks import ns
from remote.tasks.shortflags import SHORT


def context(name: str) -> ParserContext:
    return ParserContext(name=name, args=ns[name].get_arguments())


def parse(argv: list[str]) -> dict:
    contexts = [context(name) for name in sorted(ns.task_names)]
    result = Parser(contexts=contexts).parse_argv(argv)
    return {k: a.value for k, a in result[0].args.items()}


def test_each_letter_means_one_option_in_every_task() -> None:
    meanings = defaultdict(set)
    for name in ns.task_names:
        for arg in context(name).args.values():
            for letter in (n for n in arg.names if len(n) == 1):
                meanings[letter].add(arg.names[0])
    assert {letter: names for letter, names in meanings.items() if len(names) > 1} == {}
    assert all(names == {next(k for k, v in SHORT.items() if v == letter)} for letter, names in meanings.items())


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["train", "-s", "lab", "--script", "t.py", "-f"], {"stack": "lab", "script": "t.py", "follow": True}),
        (["fetch", "-s", "lab", "-r", "r1", "-a"], {"stack": "lab", "run": "r1", "all": True}),
        (["down", "-s", "lab", "--streams", "2"], {"stack": "lab", "streams": "2"}),
        (["import", "job.yaml", "-s", "aip", "-j"], {"stack": "aip", "source": "job.yaml", "json": True}),
        (["logs", "-s", "lab", "-f", "-r", "r1"], {"stack": "lab", "follow": True, "run": "r1"}),
    ],
)
def test_short_flags_parse_as_their_one_meaning(argv: list[str], expected: dict) -> None:
    values = parse(argv)
    assert {k: values[k] for k in expected} == expected


def test_a_task_without_the_option_refuses_its_letter() -> None:
    with pytest.raises(ParseError, match="'-s'"):  # check has no --stack, and no other option takes -s
        parse(["check", "-s", "x"])


def test_destructive_flags_have_no_short_form() -> None:
    for name in ("down", "vm-stop", "import"):
        assert context(name).args["force"].names == ("force",)
