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

import sys
from collections.abc import Callable
from dataclasses import MISSING, fields
from enum import Enum
from typing import Any, TypeVar, cast

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
        return cast(T, _conform(kind, values, getattr(kind, "__name__", "the answer")))
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
        return kind.from_json(doc, what)  # type: ignore[return-value]
    return cast(T, _conform(kind, doc, what))


def _conform(kind: Any, doc: object, where: str) -> Any:
    """``doc`` as the TypedDict ``kind`` declares it (a RunState's word as a RunState), or a ValueError."""
    if not isinstance(doc, dict):
        raise ValueError(f"{where} is {_shown(doc)}, not a JSON object")
    declared = _keys(kind)
    unknown = sorted(k for k in doc if k not in declared)
    if unknown:
        # (each key as it came: the laptop's documents are written out already, agentcall.printable_doc)
        named = ", ".join("'" + str(k) + "'" for k in unknown)
        raise ValueError(f"{where} has {named}, which {kind.__name__} does not declare")
    missing = [k for k, (_, required) in declared.items() if required and k not in doc]
    if missing:
        raise ValueError(f"{where} has no {', '.join(missing)}")
    scope = vars(sys.modules[kind.__module__])
    return {key: _fits(value, declared[key][0], scope, f"{where}'s {key}") for key, value in doc.items()}


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


class _Inside(ValueError):
    """A value of the declared kind with something wrong inside it (named at its own place)."""


def _fits(value: Any, text: str, scope: dict[str, Any], where: str) -> Any:
    """``value`` as the type ``text`` (a contract annotation) declares it, or a ValueError naming ``where``."""
    options = _split(text, "|")
    for option in options:
        try:
            return _fits_one(value, option, scope, where)
        except _Inside as e:  # the right kind, wrong inside: that is what to say
            raise ValueError(str(e)) from None
        except ValueError:
            continue
    raise ValueError(f"{where} is {_shown(value)}, not {' or '.join(_wanted(o, scope) for o in options)}")


def _fits_one(value: Any, text: str, scope: dict[str, Any], where: str) -> Any:
    head, args = (text[: text.index("[")], _split(text[text.index("[") + 1 : -1], ",")) if "[" in text else (text, [])
    kind = _PLAIN.get(head) or scope.get(head)
    if head in ("Any", "object"):
        return value
    if head == "None":
        ok = value is None
    elif kind in (list, tuple) and isinstance(value, (list, tuple)):
        return [_inside(item, args[0], scope, f"{where}[{i}]") for i, item in enumerate(value)] if args else list(value)
    elif kind is dict and isinstance(value, dict):
        if len(args) != 2:
            return value
        return {_inside(k, args[0], scope, f"{where}'s key {k!r}"): _inside(v, args[1], scope, f"{where}[{k!r}]") for k, v in value.items()}
    elif kind in (int, float):
        ok = isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
    elif isinstance(kind, type) and issubclass(kind, Enum):
        if value in [k.value for k in kind]:  # (a list: a str Enum's hash is not its word's)
            return kind(value)
        ok = False
    elif isinstance(kind, type) and issubclass(kind, dict) and kind is not dict:  # a TypedDict of the contract
        if not isinstance(value, dict):
            raise ValueError(where)
        try:
            return _conform(kind, value, where)
        except ValueError as e:
            raise _Inside(str(e)) from None
    elif isinstance(kind, type):
        ok = isinstance(value, kind)  # str, bool: a bool is True or False, never 0 or "false"
    else:
        raise TypeError(f"{where}: the contract declares {text!r}, which the codec cannot read")
    if not ok:
        raise ValueError(where)
    return value


def _inside(value: Any, text: str, scope: dict[str, Any], where: str) -> Any:
    try:
        return _fits(value, text, scope, where)
    except ValueError as e:
        raise _Inside(str(e)) from None


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
    if head in ("list", "tuple"):
        inner = _split(text[len(head) + 1 : -1], ",")[0] if "[" in text else ""
        return f"a list of {inner}s" if inner else "a list"
    if head == "dict":
        return "an object"
    return f"a{'n' * (head[:1].lower() in 'aeiou')} {head}"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
