"""The contract's one wire codec: a document (a dataclass) to its JSON and back, for both sides.

Each field travels under its camelCase name with the contract's version; reading checks each value
against the field's declared type and names what is wrong, gives a missing field its default and
ignores a key of no field, so a document an older agent wrote still reads. Standard library only,
Python 3.8+: the agent's zipapp carries it beside the contract (gpu_train/contract.py).
"""

from __future__ import annotations

import sys
from dataclasses import MISSING, fields
from enum import Enum
from typing import Any, TypeVar

CONTRACT_VERSION = 1  # raised when a field changes meaning; a new field with a default needs no new version
OMITTED_WHEN_UNSET = ("notify", "path", "user", "remote_root")  # a secret, and what only one side sets: out while None
D = TypeVar("D", bound="Document")


class Document:
    """A document of the contract (a dataclass): its JSON through the one codec, ``encode``/``decode``."""

    WHAT = "the document"  # its name in messages
    REQUIRED: tuple[str, ...] = ()  # fields without which it means nothing

    def to_json(self) -> dict:
        return encode(self)

    @classmethod
    def from_json(cls: type[D], doc: dict, what: str | None = None) -> D:
        """From its JSON: a bad value named with ``what`` (default: WHAT), see ``decode``."""
        return decode(cls, doc, what or cls.WHAT, cls.REQUIRED)


def wire_name(name: str) -> str:
    """A field's name on the wire: ``expect_gpus`` -> ``expectGpus`` (one rule, so the two sides cannot differ)."""
    first, *rest = name.split("_")
    return first + "".join(w[:1].upper() + w[1:] for w in rest)


def encode(obj: Any) -> dict:
    """A contract dataclass as its JSON document: each field under its wire name, and the contract's version."""
    doc = {
        wire_name(f.name): _plain(getattr(obj, f.name))
        for f in fields(obj)
        if not (f.name in OMITTED_WHEN_UNSET and getattr(obj, f.name) is None)
    }
    return {"version": CONTRACT_VERSION, **doc}


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
    strings = "[str" in declared and kind in (tuple, list)
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
