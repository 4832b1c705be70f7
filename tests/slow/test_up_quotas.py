"""scripts/up and the stack's quota preferences (`quotaRequest`), against the stand-in `pulumi` and its model
of Cloud Quotas: a preference is made once across attempts, and, as nothing can delete one, a destroyed
stack brought up again (or a preference made in the console) adopts it as it stands. The stand-in and
the helpers are tests/slow/test_up.py's."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from infra.ops import pulumi_cli
from tests.slow.test_up import edit_stack, env, names, state, up  # noqa: F401  (env: the fixture)

pytestmark = pytest.mark.slow  # each test runs scripts/up (infra.ops.up) against the stand-in pulumi, seconds


REQUEST = {"gpus": 4, "justification": "training", "contactEmail": "me@example.com"}
# spot T4: the preemptible per-model quota in us-central1, and GPUS-ALL-REGIONS
PREFERENCE_IDS = ["gpu-train-gpus-all-regions-per-project", "gpu-train-preemptible-nvidia-t4-gpus-per-project-region-1cee12"]


def cloud(env: dict) -> dict:
    """The project's quota preferences in Cloud Quotas, by id (the stand-in's model of them)."""
    path = Path(env["PULUMI_STAND_IN_DIR"]) / "quota-preferences.json"
    return json.loads(path.read_text()) if path.exists() else {}


def cloud_calls(env: dict) -> list[str]:
    path = Path(env["PULUMI_STAND_IN_DIR"]) / "cloud-calls"
    return path.read_text().splitlines() if path.exists() else []


def test_quota_preferences_are_never_removed_between_attempts(env: dict) -> None:
    edit_stack(env, quotaRequest=REQUEST)
    result, calls = up(env, "stockout stockout ok")
    assert result.returncode == 0, result.stdout
    assert not any("SQuotaPreference" in c for c in calls if c.startswith(("destroy", "state")))
    assert len(names(state(env), "SQuotaPreference")) == 2
    assert sorted(cloud_calls(env)) == [f"create {p}" for p in PREFERENCE_IDS]  # made once, by the first attempt


def test_a_destroyed_stack_brought_up_again_adopts_its_quota_preferences(env: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cloud Quotas cannot delete a preference: a destroy forgets them (retainOnDelete), and the next up finds
    them (the program asks Cloud Quotas) and imports them with their own values: no second create, no 409."""
    edit_stack(env, quotaRequest=REQUEST)
    result, _ = up(env, "ok")
    assert result.returncode == 0, result.stdout
    assert sorted(cloud(env)) == PREFERENCE_IDS
    assert {p["quotaConfig"]["preferredValue"] for p in cloud(env).values()} == {"4"}
    for key in ("PATH", "PULUMI_STAND_IN_DIR", "GPU_TRAIN_STACKS_DIR"):
        monkeypatch.setenv(key, env[key])
    pulumi_cli.release_data_disks("t4")  # as `fab down` does, once every run is fetched
    down = subprocess.run(["pulumi", "destroy", "--yes", "--stack", "t4"], env=env, capture_output=True, text=True)
    assert down.returncode == 0 and not names(state(env))
    assert sorted(cloud(env)) == PREFERENCE_IDS  # still there: nothing can delete them

    result, _ = up(env, "ok")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "409" not in out and "already exists" not in out
    assert sorted(cloud_calls(env)) == sorted([f"create {p}" for p in PREFERENCE_IDS] + [f"import {p}" for p in PREFERENCE_IDS])
    prefs = [r for r in state(env)["deployment"]["resources"] if r["type"].endswith("SQuotaPreference")]
    assert sorted(r["importId"] for r in prefs) == [f"projects/proj-1/locations/global/quotaPreferences/{p}" for p in PREFERENCE_IDS]
    # A third up: they are the stack's now (in its state under the same ids): no import, no change. (--yes:
    # the stand-in's own state of the VM holds too few inputs to compare with the settings.)
    result, _ = up(env, "ok", "--yes")
    assert result.returncode == 0 and len(cloud_calls(env)) == 4


def test_a_preference_made_elsewhere_is_adopted_as_it_stands(env: dict) -> None:
    """One preference per quota and dimensions: one made in the console (its own id, asking for less) is
    imported as it is, with a warning that gives the command to ask for more."""
    (Path(env["PULUMI_STAND_IN_DIR"]) / "quota-preferences.json").write_text(
        json.dumps(
            {
                "console-t4": {
                    "name": "projects/123456789/locations/global/quotaPreferences/console-t4",
                    "service": "compute.googleapis.com",
                    "quotaId": "PREEMPTIBLE-NVIDIA-T4-GPUS-per-project-region",
                    "dimensions": {"region": "us-central1"},
                    "quotaConfig": {"preferredValue": "2", "grantedValue": "2"},
                    "justification": "by hand",
                }
            }
        )
    )
    edit_stack(env, quotaRequest=REQUEST)
    result, _ = up(env, "ok")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert sorted(cloud_calls(env)) == ["create gpu-train-gpus-all-regions-per-project", "import console-t4"]
    assert cloud(env)["console-t4"]["quotaConfig"]["preferredValue"] == "2"  # never changed by an up
    assert "already holds preference console-t4" in out and "asking for 2 (granted: 2); this stack asks for 4" in out
    assert "gcloud quotas preferences update console-t4 --project=p" in out and "--preferred-value=4" in out
