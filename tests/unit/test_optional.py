"""Optional positionals (`gpus [NAME]`) through Invoke's parser: what they rely on of Invoke is pinned here,
so an Invoke that moves it fails this test instead of every `gpus` call."""

from __future__ import annotations

import inspect
from importlib.metadata import version

import pytest
from invoke import Collection, ParseError, task
from invoke.parser import Parser, ParserContext
from invoke.parser.parser import ParseMachine

from remote.tasks.optional import optional_positional
from tests.conftest import ROOT


@task(positional=["name"])
def look(c: object, name: str | None = None, kind: str | None = None) -> None:
    pass


optional_positional(look, "name")


@task(positional=["name"])
def need(c: object, name: str) -> None:
    pass


def parse(*argv: str) -> dict:
    parser = Parser(contexts=Collection(look, need).to_contexts())
    result = parser.parse_argv(list(argv))
    return {ctx.name: ctx.as_kwargs for ctx in result}


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["look"], {"look": {"name": None, "kind": None}}),
        (["look", "T4"], {"look": {"name": "T4", "kind": None}}),
        (["look", "--kind", "x", "T4"], {"look": {"name": "T4", "kind": "x"}}),
        (["look", "need"], {"look": {"name": "need", "kind": None}}),  # a value first, as Invoke eats it
        (["need", "n", "look"], {"need": {"name": "n"}, "look": {"name": None, "kind": None}}),
    ],
)
def test_an_optional_positional_takes_a_value_or_its_default(argv: list[str], want: dict) -> None:
    assert parse(*argv) == want


def test_a_required_positional_is_still_required() -> None:
    with pytest.raises(ParseError, match="'need' did not receive required positional arguments: 'name'"):
        parse("need")


def test_what_it_relies_on_of_invoke_is_where_it_was() -> None:
    pinned = [line for line in (ROOT / "requirements.txt").read_text().splitlines() if line.startswith("invoke==")]
    assert pinned == [f"invoke=={version('invoke')}"], "requirements.txt pins the Invoke this was checked against"
    assert list(inspect.signature(ParseMachine.complete_context).parameters) == ["self"]
    assert isinstance(inspect.getattr_static(ParserContext, "missing_positional_args"), property)
    assert isinstance(ParserContext(name="x").positional_args, list)
