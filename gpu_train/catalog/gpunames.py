"""GPU names as people say them (T4, A100-80GB, H100) and as the Compute API wants them.

Users think in short names; the API and the catalog use accelerator type names
(``nvidia-tesla-t4``). Both are accepted wherever a GPU is named (``gpuType: T4`` in a stack file,
``gpus T4``), matched without regard to case, spaces, hyphens or underscores, so ``a100 80gb``,
``A100_80GB`` and ``nvidia-a100-80gb`` all mean the same GPU. A name that matches nothing gets the
closest short names as a suggestion. Pure functions of the catalog.
"""

from __future__ import annotations

import difflib
import re

from gpu_train.catalog.model import Accelerator, Catalog


def _key(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name.strip().lower())


def _index(catalog: Catalog) -> dict[str, Accelerator]:
    """Every spelling a GPU may be named by, folded, to its accelerator."""
    index: dict[str, Accelerator] = {}
    for acc in catalog.accelerators.values():
        names = [acc.name, acc.name.removeprefix("nvidia-"), acc.name.removeprefix("nvidia-tesla-"), acc.gpu]
        names += [acc.short] if acc.short else []
        for n in names:
            index.setdefault(_key(n), acc)
    return index


def short_name(acc: Accelerator) -> str:
    """The name shown to people: the catalog's short name, else the API name."""
    return acc.short or acc.name


def resolve(name: str, catalog: Catalog) -> Accelerator | None:
    """The accelerator a name (short, display or API, any case; ``-vws`` variants too) means, or None."""
    exact = catalog.accelerator(name)
    if exact is not None:
        return exact
    return _index(catalog).get(_key(name))


def api_name(name: str, catalog: Catalog) -> str:
    """The API name for ``name`` when it names a GPU (``T4`` -> ``nvidia-tesla-t4``), else ``name`` as given.

    API names (and ``-vws`` variants) are returned unchanged, so a stack's value is rewritten only
    when it is a short or display name.
    """
    if catalog.accelerator(name) is not None or name in catalog.retired:
        return name
    for gone in catalog.retired.values():  # `gpuType: P100` is refused as the retired GPU it names
        if _key(name) in {_key(gone.name), _key(gone.name.removeprefix("nvidia-tesla-")), _key(gone.short or "")}:
            return gone.name
    acc = resolve(name, catalog)
    return acc.name if acc is not None else name


def suggest(name: str, catalog: Catalog, n: int = 3) -> list[str]:
    """Short names close to an unknown ``name`` (``T5`` -> ``T4``; ``a10`` -> ``A100``), best first."""
    shorts = {_key(short_name(a)): short_name(a) for a in catalog.accelerators.values()}
    apis = {_key(a.name): short_name(a) for a in catalog.accelerators.values()}
    folded = _key(name)
    found: list[str] = []
    for table in (shorts, apis):
        for k in difflib.get_close_matches(folded, list(table), n=n, cutoff=0.5):
            if table[k] not in found:
                found.append(table[k])
    prefixed = [s for k, s in shorts.items() if folded and k.startswith(folded) and s not in found]
    return (found + sorted(prefixed))[:n]


def describe_unknown(name: str, catalog: Catalog) -> str:
    """The fix for a GPU name that matches nothing: close names, else every short name."""
    close = [resolve(c, catalog) for c in suggest(name, catalog)]
    if close:  # in the form the user wrote: API names for an API-like name, else short names
        api_like = name.strip().lower().startswith("nvidia-")
        shown = [f"{a.name} ({short_name(a)})" if api_like else f"{short_name(a)} ({a.name})" for a in close if a]
        return "did you mean " + " or ".join(shown) + "?"
    return "known GPUs: " + ", ".join(short_name(a) for a in catalog.accelerators.values()) + " (`gpu-train gpus` lists them)"
