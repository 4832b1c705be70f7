"""Google's own machine-readable truth about its REST APIs, for the stand-ins: the discovery documents that
google-api-python-client ships (googleapiclient/discovery_cache/documents/, pinned in requirements-test.txt).

``problems(api, http_method, path, query, body)`` says what is wrong with one request as Google's API
describes it: no such method at that path, a query parameter the method does not take, a body field its
request schema does not have, an enum value that is not one of the listed ones, a value of the wrong JSON
type. The fake (tests/google_fake.py) runs it on every request it gets and answers Google's own 400 for
any problem, so every test that drives the code against the fake checks its requests' shapes too.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import googleapiclient

DOCUMENTS = Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"


@functools.cache
def document(name: str) -> dict:
    """``compute.v1``, ``logging.v2``, ``run.v2``, ``cloudfunctions.v2``, ..."""
    return json.loads((DOCUMENTS / f"{name}.json").read_text(encoding="utf-8"))


def methods(doc: dict) -> list[tuple[str, dict]]:
    """Every (method id, method) of a discovery document, resources nested."""
    out: list[tuple[str, dict]] = []

    def walk(resources: dict) -> None:
        for resource in resources.values():
            out.extend((m["id"], m) for m in (resource.get("methods") or {}).values())
            walk(resource.get("resources") or {})

    walk(doc.get("resources") or {})
    return out


def _pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"(\{\+?[A-Za-z_]+\})", template)
    rx = "".join(("(.+)" if p.startswith("{+") else "([^/]+)") if p.startswith("{") else re.escape(p) for p in parts)
    return re.compile(rx + "$")


@functools.cache
def _routes(name: str) -> list[tuple[str, re.Pattern[str], str, dict]]:
    doc = document(name)
    routes = []
    for method_id, method in methods(doc):
        for template in {method["path"], method.get("flatPath", method["path"])}:
            routes.append((method["httpMethod"], _pattern(doc["servicePath"] + template), method_id, method))
    return routes


def method_of(name: str, http_method: str, path: str) -> tuple[str, dict] | None:
    """The (id, method) that ``http_method path`` (the URL's path, no leading slash needed) calls."""
    path = path.lstrip("/")
    found = [(mid, m) for verb, rx, mid, m in _routes(name) if verb == http_method and rx.match(path)]
    # a fixed segment beats a parameter (".../instances/aggregated" vs ".../instances/{instance}")
    found.sort(key=lambda f: f[1].get("flatPath", f[1]["path"]).count("{"))
    return found[0] if found else None


def problems(name: str, http_method: str, path: str, query: dict[str, list[str]], body: object = None) -> list[str]:
    """What Google's API ``name`` says is wrong with this request (empty: nothing)."""
    doc = document(name)
    found = method_of(name, http_method, path)
    if found is None:
        return [f"{http_method} {path}: no method of {name} has this path"]
    method_id, method = found
    out = []
    params = {**doc.get("parameters", {}), **method.get("parameters", {})}
    for key, values in query.items():
        spec = params.get(key)
        if spec is None or spec.get("location") != "query":
            out.append(  # Google's own words for it
                f'{method_id}: Invalid JSON payload received. Unknown name "{key}": Cannot bind query parameter. '
                f"Field '{key}' could not be found in request message."
            )
            continue
        for value in values:
            out += [f"{method_id}: {key}: {p}" for p in _value_problems(doc, spec, value, from_query=True)]
    for key, spec in params.items():
        if spec.get("required") and spec.get("location") == "query" and key not in query:
            out.append(f"{method_id}: the required query parameter {key!r} is missing")
    request = (method.get("request") or {}).get("$ref")
    if body not in (None, {}) and request is None:
        out.append(f"{method_id} takes no request body")
    elif request is not None and body is not None:
        out += [f"{method_id}: {p}" for p in _value_problems(doc, {"$ref": request}, body, where=request)]
    return out


def _value_problems(doc: dict, spec: dict, value: object, where: str = "", from_query: bool = False) -> list[str]:
    if "$ref" in spec:
        spec = doc["schemas"][spec["$ref"]]
    kind = spec.get("type")
    here = where or "value"
    if from_query:  # a query string is text: its type is the text's
        if kind == "boolean" and value not in ("true", "false"):
            return [f"{value!r} is not a boolean"]
        if kind == "integer" and not re.fullmatch(r"-?\d+", str(value)):
            return [f"{value!r} is not an integer"]
    elif kind == "object":
        if not isinstance(value, dict):
            return [f"{here}: {type(value).__name__} where an object is expected"]
        out = []
        props, extra = spec.get("properties") or {}, spec.get("additionalProperties")
        for key, inner in value.items():
            if key in props:
                out += _value_problems(doc, props[key], inner, f"{here}.{key}")
            elif extra is not None:
                out += _value_problems(doc, extra, inner, f"{here}[{key!r}]")
            else:
                out.append(f"Invalid JSON payload received. Unknown name \"{key}\" at '{here}': Cannot find field.")
        return out
    elif kind == "array":
        if not isinstance(value, list):
            return [f"{here}: {type(value).__name__} where an array is expected"]
        return [p for i, item in enumerate(value) for p in _value_problems(doc, spec.get("items") or {}, item, f"{here}[{i}]")]
    elif kind == "string" and not isinstance(value, str):
        return [f"{here}: {value!r} is not a string (int64 and the like travel as strings)"]
    elif kind == "boolean" and not isinstance(value, bool):
        return [f"{here}: {value!r} is not a boolean"]
    elif kind == "integer" and (isinstance(value, bool) or not isinstance(value, int)):
        return [f"{here}: {value!r} is not an integer"]
    if "enum" in spec and value not in spec["enum"]:
        return [f"{here}: {value!r} is not one of {spec['enum']}"]
    return []


def schema_fields(name: str, schema: str) -> set[str]:
    """The field names of one schema of the document (``Scheduling``, ``LogEntry``, ...)."""
    return set(document(name)["schemas"][schema].get("properties") or {})


def enum_of(name: str, schema: str, field: str) -> list[str]:
    return list(document(name)["schemas"][schema]["properties"][field].get("enum") or [])
