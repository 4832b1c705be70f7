"""Prices are dated per row (spot prices may change daily), `plan` states the date of the price it
shows, and no help text promises a fixed spot discount."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import yaml

from gpu_train.catalog.loader import CATALOG_PATH, load_catalog, parse_catalog
from gpu_train.catalog.model import CatalogError
from gpu_train.gcp import validate
from gpu_train.gcp.pricing import hourly_cost
from gpu_train.stack.config import parse
from infra.ops.plan import describe_cost
from tests.conftest import ROOT, gcp_raw

CATALOG = load_catalog()


def test_every_price_row_is_dated() -> None:
    rows = {**CATALOG.gpu_prices, **CATALOG.machine_prices}
    assert rows and all(p.date for p in rows.values())
    doc = yaml.safe_load(CATALOG_PATH.read_text())
    undated = copy.deepcopy(doc)
    del undated["prices"]["perGpu"]["nvidia-tesla-t4"]["date"]
    with pytest.raises(CatalogError, match=r"prices\.perGpu\.nvidia-tesla-t4: missing 'date'"):
        parse_catalog(undated)


@pytest.mark.parametrize("settings", [{}, {"machineType": "g2-standard-8", "gpuType": None, "gpuCount": None}])
def test_the_cost_carries_its_rows_date(settings: dict) -> None:
    doc = yaml.safe_load(CATALOG_PATH.read_text())
    for row in (*doc["prices"]["perGpu"].values(), *doc["prices"]["machine"].values()):
        row["date"] = "2026-11-01"
    catalog = parse_catalog(doc)
    cfg = parse(gcp_raw(**settings), "s", CATALOG)
    cost = hourly_cost(validate.shape_of(cfg, catalog), catalog)
    assert cost.date == "2026-11-01"
    assert "list prices of 2026-11-01" in describe_cost(cost, "on-demand", catalog.ways(cfg.machine_type), "")[0]


@pytest.mark.parametrize(
    ("date", "said"),
    [
        ("2026-11-01", "(us-central1 list prices of 2026-11-01; "),
        ("derived from S2's g2-standard-8 and L4 rows", "(us-central1 list prices, derived from S2's g2-standard-8 and L4 rows; "),
    ],
)
def test_a_rows_date_in_words_reads_as_words(date: str, said: str) -> None:
    """`init --gcp-project`'s starter (g2-standard-4) priced "us-central1 list prices of derived from S2's ...": its row's
    date is words, not a date."""
    cost = hourly_cost(validate.shape_of(parse(gcp_raw(), "s", CATALOG), CATALOG), CATALOG)
    assert said in describe_cost(dataclasses.replace(cost, date=date), "on-demand", (), "")[0]


def test_no_fixed_spot_discount_is_promised() -> None:
    texts = [p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "gpu_train").rglob("*.py")]]
    assert not any("60-91%" in t or "60–91%" in t for t in texts)
