"""Quota preferences a stack adopts instead of creating twice: the pure decisions (which existing
preference is ours, with what values), what the program declares under mocks (the ``import`` option,
exactly the existing values), and the thin Cloud Quotas lookup against a local fake of its API.
The process-boundary case (destroy, then up again) is in tests/slow/test_up.py."""

from __future__ import annotations

import runpy
from pathlib import Path

import pulumi
import pytest

from gpu_train.gcp import quota
from infra import lookups, program
from infra.ops import cloud_quotas, preview
from tests.conftest import gcp_raw
from tests.google_fake import FakeGoogle

REQUEST = {"gpus": "8", "justification": "training", "contactEmail": "me@example.com"}
H100 = dict(quotaRequest=REQUEST, machineType="a3-highgpu-8g", gpuType=None, gpuCount=None)
FAMILY = "GPUS-PER-GPU-FAMILY-per-project-region"


def pref(name: str, quota_id: str, dims: dict, preferred: str, granted: str | None = None) -> dict:
    """A preference as Cloud Quotas lists it (named by the project's number)."""
    config = {"preferredValue": preferred} | ({"grantedValue": granted} if granted else {})
    return {
        "name": f"projects/123456789/locations/global/quotaPreferences/{name}",
        "service": quota.SERVICE,
        "quotaId": quota_id,
        "dimensions": dims,
        "quotaConfig": config,
        "justification": "earlier",
    }


@pytest.mark.parametrize(
    ("existing", "want", "expected"),
    [
        (pref("a", "Q", {}, "8"), 8, quota.Adoption("a", "8", None, 0)),
        (pref("a", "Q", {}, "16", "16"), 8, quota.Adoption("a", "16", "16", 0)),  # asks for more already
        (pref("a", "Q", {}, "2", "2"), 8, quota.Adoption("a", "2", "2", 6)),  # asks for less: the warning's case
        (pref("a", "Q", {}, "-1"), 8, quota.Adoption("a", "-1", None, 0)),  # unlimited
    ],
)
def test_adoption_keeps_the_existing_values(existing: dict, want: int, expected: quota.Adoption) -> None:
    assert quota.adoption(existing, want) == expected


def test_the_existing_preference_is_the_one_for_this_quota_and_dimensions() -> None:
    found = [
        pref("x", FAMILY, {"region": "us-central1", "gpu_family": "NVIDIA_A100"}, "4"),
        pref("y", FAMILY, {"region": "us-central1", "gpu_family": "NVIDIA_H100"}, "4"),
        pref("z", "GPUS-ALL-REGIONS-per-project", {}, "8"),
    ]
    assert quota.existing_preference(found, quota.SERVICE, FAMILY, {"region": "us-central1", "gpu_family": "NVIDIA_H100"})["name"].endswith(
        "/y"
    )
    assert quota.existing_preference(found, quota.SERVICE, "GPUS-ALL-REGIONS-per-project", {})["name"].endswith("/z")
    assert quota.existing_preference(found, quota.SERVICE, FAMILY, {"region": "us-east1", "gpu_family": "NVIDIA_H100"}) is None
    assert quota.existing_preference(found, "other.googleapis.com", "GPUS-ALL-REGIONS-per-project", {}) is None


def test_the_program_imports_an_existing_preference_with_its_own_values() -> None:
    """One preference exists (made in the console, its own id, asking for 2): it is declared for import under
    the provider's id format with exactly its values; the other is created as before, under gpu-train's id."""
    console = pref("console-h100", FAMILY, {"region": "us-central1", "gpu_family": "NVIDIA_H100"}, "2", "2")
    result = preview.run(program.main, stack="s", config=gcp_raw(**H100), quota_preferences=[console])
    assert result.error is None, result.error
    prefs = {p.inputs["quotaId"]: p for p in result.of_type("SQuotaPreference")}
    adopted, made = prefs[FAMILY], prefs["GPUS-ALL-REGIONS-per-project"]
    assert adopted.import_id == "projects/proj-1/locations/global/quotaPreferences/console-h100"
    assert adopted.inputs["name"] == "console-h100" and adopted.inputs["parent"] == "projects/proj-1"
    assert adopted.inputs["quotaConfig"] == {"preferredValue": "2"}  # its own value, not the stack's 8
    assert adopted.inputs["dimensions"] == {"region": "us-central1", "gpu_family": "NVIDIA_H100"}
    assert set(adopted.ignore_changes) == {"justification", "contactEmail"}  # never read back by the provider
    assert adopted.retain_on_delete and made.retain_on_delete
    assert made.import_id == "" and made.inputs["name"] == "gpu-train-gpus-all-regions-per-project"
    assert made.inputs["quotaConfig"] == {"preferredValue": "8"}


@pytest.fixture
def google(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    fake = FakeGoogle("127.0.21.1")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(fake.adc_file(tmp_path / "adc.json")))
    # `pulumi up`'s program is an entry point of its own: it reads its endpoint from its process.
    monkeypatch.setenv("GPU_TRAIN_CLOUDQUOTAS_ENDPOINT", fake.url)
    yield fake
    fake.close()


def test_the_lookup_reads_every_page_with_the_project_as_quota_project(google: FakeGoogle) -> None:
    google.state["services"]["proj-1"] = {"cloudquotas.googleapis.com": "ENABLED"}
    google.state["quota_preferences"] = {"proj-1": [pref(f"p{i}", "Q", {"region": f"r{i}"}, "1") for i in range(5)]}
    found = cloud_quotas.list_preferences("proj-1", google.url)
    assert [p["name"].rsplit("/", 1)[-1] for p in found] == ["p0", "p1", "p2", "p3", "p4"]  # three pages
    assert google.state["quota_projects"] == ["proj-1"] * 3


def test_a_project_that_never_enabled_cloud_quotas_has_no_preferences(google: FakeGoogle) -> None:
    assert cloud_quotas.list_preferences("proj-1", google.url) == []


def test_without_credentials_the_lookup_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))
    with pytest.raises(cloud_quotas.CannotAsk, match=r"no Application Default Credentials at .*none\.json"):
        cloud_quotas.list_preferences("proj-1", "https://cloudquotas.googleapis.com")  # (never reached)


@pytest.mark.parametrize(
    "name", ["projects/p/locations/global/quotaPreferences/x; rm -rf ~", "projects/p/locations/global/quotaPreferences/$(id)", ""]
)
def test_a_preference_name_that_is_not_an_id_is_refused(name: str) -> None:
    # Its id goes into the import id and a gcloud command shown to the user: nothing else is taken.
    found = [{"name": name, "service": quota.SERVICE, "quotaId": "GPUS-ALL-REGIONS-per-project", "dimensions": {}}]
    with pytest.raises(ValueError, match="not an id"):
        quota.existing_preference(found, quota.SERVICE, "GPUS-ALL-REGIONS-per-project", {})


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (b"<html>proxy login</html>", "not a list of preferences"),
        (b"[1, 2]", "not a list of preferences"),
        (b'{"quotaPreferences": ["x"]}', "not a list of preferences"),
        (b'{"quotaPreferences": [], "nextPageToken": "again"}', "repeated a page"),  # (looped for ever)
    ],
)
def test_a_faulty_answer_is_cannot_ask_not_a_crash_or_a_loop(google: FakeGoogle, answer: bytes, words: str) -> None:
    google.state["services"]["proj-1"] = {"cloudquotas.googleapis.com": "ENABLED"}
    google.state["quota_preferences_answer"] = answer
    with pytest.raises(cloud_quotas.CannotAsk, match=words):
        cloud_quotas.list_preferences("proj-1", google.url)


def test_pulumi_up_hands_the_program_google_s_own_lookups(google: FakeGoogle) -> None:
    """infra/__main__.py (what `pulumi up` runs) gives the program lookups that ask Cloud Quotas itself: a
    preference only the API holds is adopted. (The mocks stand in for the engine only: no recorded answer.)"""
    google.state["services"]["proj-1"] = {"cloudquotas.googleapis.com": "ENABLED"}
    console = pref("console-h100", FAMILY, {"region": "us-central1", "gpu_family": "NVIDIA_H100"}, "2", "2")
    google.state["quota_preferences"] = {"proj-1": [console]}
    result = preview.run(lambda _recorded: runpy.run_module("infra.__main__", run_name="__main__"), stack="s", config=gcp_raw(**H100))
    assert result.error is None, result.error
    prefs = {p.inputs["quotaId"]: p for p in result.of_type("SQuotaPreference")}
    assert prefs[FAMILY].import_id == "projects/proj-1/locations/global/quotaPreferences/console-h100"
    assert google.state["quota_projects"] == ["proj-1"]


class Refusing:
    def quota_preferences(self, project: str) -> list[dict]:
        raise lookups.CannotAsk("HTTP 403: the caller does not have permission")


def test_when_cloud_quotas_cannot_be_asked_each_preference_is_created_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **kw: warned.append(message))
    result = preview.run(program.main, stack="s", config=gcp_raw(**H100), lookups=Refusing())
    assert result.error is None, result.error
    prefs = result.of_type("SQuotaPreference")
    assert len(prefs) == 2 and not any(p.import_id for p in prefs)  # each created: none known to adopt
    assert any("cannot ask Cloud Quotas" in w and "HTTP 403" in w and "409" in w for w in warned), warned
