"""The contract's one wire codec, for both sides: documents kept on the host (dataclasses) and the
agent's answers (TypedDicts).

A kept document (``Document``: the job spec, a run's record, the settings) travels with each field under
its camelCase name and the contract's version; reading checks each value against the field's declared
type and names what is wrong, gives a missing field its default and ignores a key of no field, so a
document an older agent wrote still reads. An answer (``StatusDoc``, ``Stopped``, ...) is built by the
agent through ``answer`` and read by the laptop through ``check``: both hold it to its declaration, every
key, no other, each value of its declared type (the two sides are always the same contract: the laptop
sends its agent with every call), so a renamed field fails on each side. Standard library only,
Python 3.8+: the agent's zipapp carries it beside the contract (gpu_train/contract.py).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import MISSING, fields
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar, cast

if TYPE_CHECKING:  # (an alias of a generic: Python 3.8, the agent's, cannot subscript collections.abc's at run time)
    Reader = Callable[[Any], Any]  # a declared type's reading: the value as declared, or a _Misfit

CONTRACT_VERSION = 1  # raised when a field changes meaning; a new field with a default needs no new version
OMITTED_WHEN_UNSET = ("notify", "path", "user", "remote_root")  # a secret, and what only one side sets: out while None
D = TypeVar("D", bound="Document")
T = TypeVar("T")


class Document:
    """A document of the contract (a dataclass): its JSON through the one codec, ``encode``/``decode``."""

    WHAT = "the document"  # its name in messages
    REQUIRED: tuple[str, ...] = ()  # fields without which it means nothing

    def to_json(self, only: tuple[str, ...] | None = None) -> dict[str, Any]:
        return encode(self, only)

    @classmethod
    def from_json(cls: type[D], doc: dict[str, Any], what: str | None = None) -> D:
        """From its JSON: a bad value named with ``what`` (default: WHAT), see ``decode``."""
        return cast(D, decode(cls, doc, what or cls.WHAT, cls.REQUIRED))


def wire_name(name: str) -> str:
    """A field's name on the wire: ``expect_gpus`` -> ``expectGpus`` (one rule, so the two sides cannot differ)."""
    first, *rest = name.split("_")
    return first + "".join(w[:1].upper() + w[1:] for w in rest)


def encode(obj: Any, only: tuple[str, ...] | None = None) -> dict[str, Any]:
    """A contract dataclass as its JSON document: each field under its wire name, and the contract's version;
    with ``only`` (field names), the part of it those fields are, without a version (a part is merged into a
    whole document, which has one: the agent's settings from the stack into agent.json)."""
    unknown = set(only or ()) - {f.name for f in fields(obj)}
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no field {', '.join(sorted(unknown))}")
    doc = {
        wire_name(f.name): _plain(getattr(obj, f.name))
        for f in fields(obj)
        if not (f.name in OMITTED_WHEN_UNSET and getattr(obj, f.name) is None) and (only is None or f.name in only)
    }
    return doc if only is not None else {"version": CONTRACT_VERSION, **doc}


def decode(cls: Any, doc: Any, what: str, required: tuple[str, ...] = ()) -> Any:
    """``cls`` from its JSON, each field checked against its declared type (a ValueError naming the key), a
    missing one defaulted, a key of no field ignored (an older document reads); a newer contract's refused."""
    if not isinstance(doc, dict):
        raise ValueError(f"{what} is {type(doc).__name__}, not a JSON object")
    version = doc.get("version", 1)
    if not isinstance(version, int) or version > CONTRACT_VERSION:
        raise ValueError(
            f"{what} is of contract version {version!r}, newer than this agent's "
            f"{CONTRACT_VERSION}: run the task again from the laptop to update the host's agent"
        )
    kwargs = {
        f.name: _typed(doc[wire_name(f.name)], f, f"{what}'s {wire_name(f.name)}", cls) for f in fields(cls) if wire_name(f.name) in doc
    }
    kwargs = {k: v for k, v in kwargs.items() if v is not MISSING}  # null for a field with no default
    missing = [wire_name(n) for n in required if kwargs.get(n) is None]
    if missing:
        raise ValueError(f"{what} has no {', '.join(missing)}")
    return cls(**kwargs)


def _plain(value: Any) -> Any:
    if isinstance(value, Document):  # a document inside a document (JobSpec.container)
        return {k: v for k, v in encode(value).items() if k != "version"}
    return value.value if isinstance(value, Enum) else list(value) if isinstance(value, tuple) else value


def _typed(value: Any, f: Any, where: str, cls: Any) -> Any:
    """``value`` as field ``f`` declares it (its annotation read as text: Python 3.8 cannot evaluate
    ``str | None``); null stays None where the field may be None, else gives its default."""
    declared = str(f.type)
    if value is None:
        return None if "None" in declared else f.default_factory() if f.default_factory is not MISSING else f.default
    name = declared.split("|")[0].split("[")[0].strip()
    kind: Any = {"str": str, "int": int, "float": float, "bool": bool, "tuple": tuple, "list": list, "dict": dict}.get(name) or vars(
        sys.modules[cls.__module__]
    )[name]  # an Enum beside the document (contract.RunState)
    inner = declared.split("|")[0].strip()[len(name) + 1 : -1] if "[" in declared.split("|")[0] else ""
    strings = kind in (tuple, list) and _split(inner, ",")[0] == "str"  # tuple[str, ...], list[str]
    wanted = "a list of strings" if strings else f"a{'n' * (name[0] in 'aeiou')} {name}"
    if isinstance(kind, type) and issubclass(kind, Document):  # a document inside (JobSpec.container)
        return decode(kind, value, where, kind.REQUIRED)
    if issubclass(kind, Enum):
        ok, wanted = value in {k.value for k in kind}, "one of " + ", ".join(str(k.value) for k in kind)
    elif kind in (int, float):
        whole = isinstance(value, int) or (isinstance(value, float) and (kind is float or value.is_integer()))
        ok = whole and not isinstance(value, bool)
    elif kind in (tuple, list):
        ok = isinstance(value, (list, tuple)) and (not strings or all(isinstance(v, str) for v in value))
    else:
        ok = isinstance(value, kind)  # a bool is True or False, never 0 or "false"
    if not ok:
        raise ValueError(f"{where} is {value!r}, not {wanted}")
    return value if kind is float else kind(value)  # a float field's 20 stays 20 (in JSON, in messages)


# -- answers: what the agent says back, TypedDicts of the contract ------------------------------------
def answer(kind: Callable[..., T], **values: Any) -> T:
    """The agent's one way to build an answer of ``kind`` (a TypedDict of the contract): every key it
    declares but a ``NotRequired`` one, no other, each value as declared; a TypeError otherwise (a bug
    of the agent's, which its tests find, never a document the laptop would refuse)."""
    try:
        return cast(T, _read(kind, values, getattr(kind, "__name__", "the answer")))
    except ValueError as e:
        raise TypeError(str(e)) from None


def check(kind: Callable[..., T], doc: object, what: str) -> T:
    """The laptop's reading of an agent's answer: ``doc`` as ``kind`` declares it (see ``answer``), or a
    ValueError naming ``what`` and the key that is missing, unknown or of the wrong type. An answer that is
    a Document (contract.Scalars) is held to the same: every field there (but one left out while unset),
    no other key but the version; it comes back decoded."""
    if isinstance(kind, type) and issubclass(kind, Document):
        if not isinstance(doc, dict):
            raise ValueError(f"{what} is {_shown(doc)}, not a JSON object")
        names = {wire_name(f.name): f.name for f in fields(cast(Any, kind))}
        unknown = sorted(k for k in doc if k not in names and k != "version")
        if unknown:
            named = ", ".join("'" + str(k) + "'" for k in unknown)
            raise ValueError(f"{what} has {named}, which {kind.__name__} does not declare")
        missing = [k for k, name in names.items() if k not in doc and name not in OMITTED_WHEN_UNSET]
        if missing:
            raise ValueError(f"{what} has no {', '.join(missing)}")
        return cast(T, kind.from_json(doc, what))  # (kind is T: a Document's from_json makes its own class)
    return cast(T, _read(kind, doc, what))


def _read(kind: Any, doc: object, where: str) -> Any:
    """``doc`` as the TypedDict ``kind`` declares it (a RunState's word as a RunState, a tuple as a list), or
    a ValueError naming ``where`` and the place inside it."""
    try:
        return _reader(kind)(doc)
    except _Misfit as e:
        raise ValueError(e.said(where)) from None


def _keys(kind: Any) -> dict[str, tuple[str, bool]]:
    """A TypedDict's keys: (its type as text, required?). Its annotations are read as text (the contract
    postpones them: Python 3.8 cannot evaluate ``str | None``), ``NotRequired[...]`` and ``Required[...]``
    unwrapped."""
    keys = {}
    for key, hint in kind.__annotations__.items():
        text = str(getattr(hint, "__forward_arg__", hint)).strip()
        required = bool(getattr(kind, "__total__", True))
        for wrapper, means in (("NotRequired[", False), ("Required[", True)):
            if text.startswith(wrapper):
                text, required = text[len(wrapper) : -1], means
        keys[key] = (text, required)
    return keys


class _Misfit(Exception):
    """A value that is not what its declaration says: ``say`` words it, given the place; ``places`` are the
    steps down to it, the innermost first (added as the misfit rises, so a good document builds no names)."""

    def __init__(self, say: Callable[[str], str], inside: bool = False) -> None:
        super().__init__()
        self.say, self.inside = say, inside
        self.places: list[str] = []

    def at(self, place: str) -> _Misfit:
        """The misfit one step up (``place``: how the step is named); below the value it is inside of."""
        self.places.append(place)
        self.inside = True
        return self

    def said(self, where: str) -> str:
        return self.say(where + "".join(reversed(self.places)))


@functools.lru_cache(maxsize=None)  # noqa: UP033 (Python 3.8 has no functools.cache)
def _reader(kind: Any) -> Reader:
    """A TypedDict's reading, made once: every key it declares but a NotRequired one, no other, each value
    as declared."""
    declared = _keys(kind)
    readers = {key: _compiled(text, kind.__module__) for key, (text, _) in declared.items()}
    required = [key for key, (_, needed) in declared.items() if needed]

    def read(doc: Any) -> Any:
        if not isinstance(doc, dict):
            raise _Misfit(lambda where: f"{where} is {_shown(doc)}, not a JSON object")
        unknown = sorted(k for k in doc if k not in readers)
        if unknown:  # (each key as it came: the laptop's documents are written out already, agentcall.printable_doc)
            named = ", ".join("'" + str(k) + "'" for k in unknown)
            raise _Misfit(lambda where: f"{where} has {named}, which {kind.__name__} does not declare", inside=True)
        missing = [k for k in required if k not in doc]
        if missing:
            raise _Misfit(lambda where: f"{where} has no {', '.join(missing)}", inside=True)
        out = {}
        for key, value in doc.items():
            try:
                out[key] = readers[key](value)
            except _Misfit as e:
                raise e.at(f"'s {key}") from None
        return out

    return read


@functools.lru_cache(maxsize=None)  # noqa: UP033 (Python 3.8 has no functools.cache)
def _compiled(text: str, module: str) -> Reader:
    """The reading of the type ``text`` (a contract annotation) in ``module``. Of several options, the first
    that fits; where one was the right kind with something wrong inside, that is what is said."""
    scope = vars(sys.modules[module])
    texts = _split(text, "|")
    wanted = " or ".join(_wanted(option, scope) for option in texts)
    options = [_compiled_one(option, scope, wanted) for option in texts]
    alone = scope.get(texts[0]) if len(texts) == 1 else None
    if len(texts) == 1 and not (isinstance(alone, type) and issubclass(alone, dict)):  # (a TypedDict: "not a X" said below)
        return options[0]

    def read(value: Any) -> Any:
        inside = None
        for option in options:
            try:
                return option(value)
            except _Misfit as e:
                inside = inside or (e if e.inside else None)
        raise inside or _Misfit(_not(value, wanted))

    return read


def _not(value: Any, wanted: str) -> Callable[[str], str]:
    return lambda where: f"{where} is {_shown(value)}, not {wanted}"


def _compiled_one(text: str, scope: dict[str, Any], wanted: str) -> Reader:
    """One option's reading; a value of another kind is said to be not ``wanted`` (all the options')."""
    head, args = (text[: text.index("[")], _split(text[text.index("[") + 1 : -1], ",")) if "[" in text else (text, [])
    kind = _PLAIN.get(head) or scope.get(head)
    module = scope["__name__"]
    if head in ("Any", "object"):
        return lambda value: value
    if head == "None":
        return _test(lambda v: v is None, wanted)
    if kind is tuple and len(args) > 1 and args[-1] != "...":  # a row: each place its own type
        return _items(wanted, None, [_compiled(arg, module) for arg in args])
    if kind in (list, tuple):
        return _items(wanted, _compiled(args[0], module) if args else None)
    if kind is dict:
        if len(args) == 2:
            return _mapping(wanted, _compiled(args[0], module), _compiled(args[1], module))
        return _test(lambda v: isinstance(v, dict), wanted)
    if kind is int:
        return _test(lambda v: isinstance(v, int) and not isinstance(v, bool), wanted)
    if kind is float:
        return _test(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), wanted)
    if isinstance(kind, type) and issubclass(kind, Enum):
        return _word(kind, wanted)
    if isinstance(kind, type) and issubclass(kind, dict):  # a TypedDict of the contract
        return _reader(kind)
    if isinstance(kind, type):
        plain = kind
        return _test(lambda v: isinstance(v, plain), wanted)  # str, bool: a bool is True or False, never 0 or "false"
    raise TypeError(f"the contract declares {text!r}, which the codec cannot read")


def _test(ok: Callable[[Any], bool], wanted: str) -> Reader:
    def read(value: Any) -> Any:
        if not ok(value):
            raise _Misfit(_not(value, wanted))
        return value

    return read


def _items(wanted: str, each: Reader | None, places: list[Reader] | None = None) -> Reader:
    """A list (a JSON array: a tuple comes back as one): each item read by ``each``, or a row of
    ``len(places)`` items, each read by its place's."""

    def read(value: Any) -> Any:
        if not isinstance(value, (list, tuple)) or (places is not None and len(value) != len(places)):
            raise _Misfit(_not(value, wanted))
        if each is None and places is None:
            return list(value)
        out: list[Any] = []
        try:
            if places is not None:
                for place, item in zip(places, value):  # noqa: B905 (Python 3.8; the lengths are equal)
                    out.append(place(item))
            elif each is not None:
                for item in value:
                    out.append(each(item))
        except _Misfit as e:
            raise e.at(f"[{len(out)}]") from None  # (the item that did not fit: the one after those read)
        return out

    return read


def _mapping(wanted: str, keys: Reader, values: Reader) -> Reader:
    def read(value: Any) -> Any:
        if not isinstance(value, dict):
            raise _Misfit(_not(value, wanted))
        out = {}
        for k, v in value.items():
            try:
                key = keys(k)
            except _Misfit as e:
                raise e.at(f"'s key {k!r}") from None
            try:
                out[key] = values(v)
            except _Misfit as e:
                raise e.at(f"[{k!r}]") from None
        return out

    return read


def _word(enum: type[Enum], wanted: str) -> Reader:
    words = [k.value for k in enum]  # (a list: a str Enum's hash is not its word's)

    def read(value: Any) -> Any:
        if value not in words:
            raise _Misfit(_not(value, wanted))
        return enum(value)

    return read


_PLAIN: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool, "list": list, "tuple": tuple, "dict": dict}


def _split(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside brackets, each part stripped."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == sep and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return [*parts, text[start:].strip()]


def _wanted(text: str, scope: dict[str, Any]) -> str:
    head = text.split("[")[0]
    kind = scope.get(head)
    if head == "None":
        return "null"
    if isinstance(kind, type) and issubclass(kind, Enum):
        return "one of " + ", ".join(str(k.value) for k in kind)
    if head == "tuple" and "[" in text and _split(text[6:-1], ",")[-1] != "...":
        places = [_wanted(arg, scope) for arg in _split(text[6:-1], ",")]
        return f"a list of {len(places)} ({', '.join(places)})"
    if head in ("list", "tuple"):
        inner = _split(text[len(head) + 1 : -1], ",")[0] if "[" in text else ""
        return f"a list of {inner}s" if inner else "a list"
    if head == "dict":
        return "an object"
    return f"a{'n' * (head[:1].lower() in 'aeiou')} {head}"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
