"""GPU short names and the catalog views behind `gpu-train gpus`: tables of cases."""

from __future__ import annotations

import pytest

from gpu_train.catalog import gpunames
from gpu_train.catalog.loader import load_catalog
from gpu_train.catalog.model import dated
from gpu_train.gcp.validate import check
from gpu_train.stack.config import ConfigError
from gpu_train.views import offers
from tests.conftest import gcp_raw

CATALOG = load_catalog()


@pytest.mark.parametrize(
    ("name", "api"),
    [
        ("T4", "nvidia-tesla-t4"),
        ("t4", "nvidia-tesla-t4"),
        ("tesla t4", "nvidia-tesla-t4"),
        ("L4", "nvidia-l4"),
        ("A100", "nvidia-tesla-a100"),
        ("A100-40GB", "nvidia-tesla-a100"),
        ("a100 40gb", "nvidia-tesla-a100"),
        ("A100-80GB", "nvidia-a100-80gb"),
        ("a100_80gb", "nvidia-a100-80gb"),
        ("H100", "nvidia-h100-80gb"),
        ("H100-MEGA", "nvidia-h100-mega-80gb"),
        ("H200", "nvidia-h200-141gb"),
        ("B200", "nvidia-b200"),
        ("RTX PRO 6000", "nvidia-rtx-pro-6000"),
        ("V100", "nvidia-tesla-v100"),
        # API names (and -vws variants, and retired types) are kept as written
        ("nvidia-tesla-t4", "nvidia-tesla-t4"),
        ("nvidia-tesla-t4-vws", "nvidia-tesla-t4-vws"),
        ("nvidia-tesla-k80", "nvidia-tesla-k80"),
        # unknown names pass through for validation to report
        ("T5", "T5"),
        ("A10", "A10"),
        ("", ""),
    ],
)
def test_api_name(name: str, api: str) -> None:
    assert gpunames.api_name(name, CATALOG) == api


def test_every_short_name_is_unique_and_resolves_to_its_type() -> None:
    shorts = [a.short for a in CATALOG.accelerators.values()]
    assert None not in shorts and len(set(shorts)) == len(shorts)
    for acc in CATALOG.accelerators.values():
        assert gpunames.resolve(acc.short, CATALOG) is acc
        assert gpunames.resolve(acc.gpu, CATALOG) is acc  # the display name ("A100 80GB")


@pytest.mark.parametrize(
    ("name", "first", "words"),
    [
        ("T5", "T4", "did you mean T4 (nvidia-tesla-t4)"),
        ("a10", "A100", "A100 (nvidia-tesla-a100)"),
        ("H20", "H200", "H200"),
        ("nvidia-tesla-t5", "T4", "did you mean nvidia-tesla-t4 (T4)"),  # API-like names answered in kind
        ("B300", "B200", "B200 (nvidia-b200)"),
        ("zzz", None, "known GPUs: T4, P4"),
    ],
)
def test_suggestions(name: str, first: str | None, words: str) -> None:
    close = gpunames.suggest(name, CATALOG)
    assert (close[0] if close else None) == first
    assert words in gpunames.describe_unknown(name, CATALOG)


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [("T4", "nvidia-tesla-t4"), ("v100", "nvidia-tesla-v100"), ("nvidia-tesla-p4", "nvidia-tesla-p4")],
)
def test_stack_files_take_short_names(gpu: str, expected: str) -> None:
    cfg, _ = check(gcp_raw(gpuType=gpu), "s", CATALOG)
    assert cfg.gpu_type == expected


def test_stack_with_a_close_name_gets_a_suggestion() -> None:
    with pytest.raises(ConfigError) as e:
        check(gcp_raw(gpuType="T5"), "s", CATALOG)
    assert "gpu-train:gpuType = 'T5': is not a GPU type" in str(e.value) and "did you mean T4 (nvidia-tesla-t4)?" in str(e.value)


def test_fixed_shape_with_a_short_gpu_name_matches() -> None:
    cfg, _ = check(gcp_raw(machineType="g2-standard-8", gpuType="L4", gpuCount=None), "s", CATALOG)
    assert cfg.gpu_type == "nvidia-l4"


# -- the views --------------------------------------------------------------------------------
def by_short(rows: list[offers.GpuOffer]) -> dict[str, offers.GpuOffer]:
    return {o.short: o for o in rows}


def test_every_catalog_gpu_is_listed_with_short_and_api_names() -> None:
    rows = by_short(offers.offers(CATALOG))
    assert set(rows) == {a.short for a in CATALOG.accelerators.values()}
    t4 = rows["T4"]
    assert (t4.api, t4.memory_gb, t4.on_demand_per_gpu, t4.spot_per_gpu) == ("nvidia-tesla-t4", 16, 0.35, 0.175)
    assert [(s.machine, s.gpus) for s in t4.shapes] == [("n1-*", 1), ("n1-*", 2), ("n1-*", 4)]
    assert "us-central1" in t4.regions and "us-central1-a" in t4.regions["us-central1"]


@pytest.mark.parametrize(
    ("name", "kwargs", "shapes", "note"),
    [
        (
            "L4",
            {},
            [
                "g2-standard-4",
                "g2-standard-8",
                "g2-standard-12",
                "g2-standard-16",
                "g2-standard-32",
                "g2-standard-24",
                "g2-standard-48",
                "g2-standard-96",
            ],
            "",
        ),
        ("H100", {}, ["a3-highgpu-1g", "a3-highgpu-2g", "a3-highgpu-4g", "a3-highgpu-8g", "a3-edgegpu-8g"], ""),
        ("H200", {}, ["a3-ultragpu-8g"], "no on-demand: spot, flex-start, reservation"),
        ("GB200", {}, ["a4x-highgpu-4g"], "reservation-only"),  # reservation-only in 2026 (reference, 2026-11-25)
        ("GB200", {"spot": True}, None, None),
        ("A100", {"region": "europe-west4"}, ["a2-highgpu-1g", "a2-highgpu-2g", "a2-highgpu-4g", "a2-highgpu-8g", "a2-megagpu-16g"], ""),
        ("A100", {"region": "me-west1"}, ["a2-highgpu-1g", "a2-highgpu-2g", "a2-highgpu-4g", "a2-highgpu-8g"], ""),
        (
            "H100",
            {"region": "us-central1", "spot": True},
            ["a3-highgpu-1g", "a3-highgpu-2g", "a3-highgpu-4g", "a3-highgpu-8g", "a3-edgegpu-8g"],
            "",
        ),
        ("T4", {"region": "us-east5"}, None, None),  # not offered there
    ],
)
def test_one_gpu(name: str, kwargs: dict, shapes: list[str] | None, note: str | None) -> None:
    rows = offers.offers(CATALOG, name, **kwargs)
    if shapes is None:
        assert rows == []
        return
    (row,) = rows
    assert [s.machine for s in row.shapes] == shapes and row.note == note
    if "region" in kwargs:
        assert list(row.regions) == [kwargs["region"]]


def test_prices_of_fixed_shapes_are_whole_vm_prices() -> None:
    l4 = offers.offers(CATALOG, "L4")[0]
    g2 = next(s for s in l4.shapes if s.machine == "g2-standard-8")
    assert (g2.on_demand, g2.spot) == (0.85362, 0.34057)
    assert next(s for s in l4.shapes if s.machine == "g2-standard-96").on_demand is None  # unknown stays unknown


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"name": "T5"}, "no GPU called 'T5' in the catalog: did you mean T4"),
        ({"region": "us-central"}, "did you mean us-central1"),
        ({"region": "mars1"}, "no GPU is offered in a region called 'mars1'"),
    ],
)
def test_unknown_names_and_regions(kwargs: dict, words: str) -> None:
    with pytest.raises(offers.OfferError) as e:
        offers.offers(CATALOG, **kwargs)
    assert words in str(e.value)


def test_renderings() -> None:
    table = offers.render_table(offers.offers(CATALOG), CATALOG)
    t4_line = next(line for line in table.splitlines() if line.startswith("T4 "))
    assert t4_line.split()[:4] == ["T4", "nvidia-tesla-t4", "16", "GB"] and "$0.35" in t4_line and "$0.17" in t4_line
    assert "no on-demand: spot, flex-start, reservation" in table and CATALOG.dates["prices"] in table
    spot = offers.render_table(offers.offers(CATALOG, spot=True), CATALOG, spot=True)
    assert "spot $/h/GPU" in spot and "GB200" not in spot and "H200" in spot  # A4X: reservation-only
    detail = offers.render_detail(offers.offers(CATALOG, "T4")[0], CATALOG)
    assert "n1-* + 4 x T4" in detail and "GPUs $1.40/h" in detail and "us-central1: a, b, c, f" in detail
    assert "gpu-train:gpuType: T4" in detail
    assert "[on-demand $0.35/h, spot $0.17/h, reservation on-demand rate]" in detail
    h100 = offers.render_detail(offers.offers(CATALOG, "H100")[0], CATALOG)
    ways = {line.split()[0]: line[line.index("[") :] for line in h100.splitlines() if line.startswith("    a3-")}
    assert ways["a3-highgpu-1g"] == "[spot n/a, flex-start DWS rate n/a]"
    assert ways["a3-highgpu-8g"] == "[on-demand n/a, spot n/a, flex-start DWS rate n/a, reservation on-demand rate]"
    assert "cloud.google.com/compute/gpus-pricing" in h100
    doc = offers.to_json(offers.offers(CATALOG, "h200"), CATALOG)
    assert doc["gpus"][0]["api"] == "nvidia-h200-141gb"
    assert list(doc["gpus"][0]["shapes"][0]["obtain"]) == ["spot", "flex-start", "reservation"]


def test_prices_carry_their_rows_dates() -> None:
    t4 = offers.offers(CATALOG, "T4")[0]
    row_date = CATALOG.gpu_prices["nvidia-tesla-t4"].date
    assert row_date and t4.price_date == row_date and all(s.price_date == row_date for s in t4.shapes)
    assert f"(prices{dated(row_date)})" in offers.render_detail(t4, CATALOG)
    assert row_date in offers.render_table(offers.offers(CATALOG), CATALOG)
    assert offers.offers(CATALOG, "H200")[0].shapes[0].price_date is None  # no price, no date
    assert offers.to_json([t4], CATALOG)["gpus"][0]["priceDate"] == row_date


def test_dates_in_words_read_as_words() -> None:
    """`gpu-train gpus` said "list prices as of S2 snapshot, undated (2025 or later)" and "zones: snapshot date unknown,
    2025-era or later snapshot": a catalog date is often words."""
    assert dated("2026-11-01") == " of 2026-11-01" and dated("derived from S2's rows") == ", derived from S2's rows"
    footer = offers.render_table(offers.offers(CATALOG), CATALOG).splitlines()[-2]
    for date in (CATALOG.dates["zones"], CATALOG.gpu_prices["nvidia-tesla-t4"].date):
        assert f"of {date}" not in footer if not date[:4].isdigit() else f"of {date}" in footer
    assert f"zones: a snapshot{dated(CATALOG.dates['zones'])}" in footer
