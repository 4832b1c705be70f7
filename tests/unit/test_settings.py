"""Each stack setting is declared once (gpu_train/stack/settings.py); the README and the agent follow it."""

from __future__ import annotations

import re
from dataclasses import fields

from gpu_train.catalog.loader import load_catalog
from gpu_train.contract import AgentSettings
from gpu_train.stack import config, settings
from tests.conftest import ROOT, gcp_raw

CATALOG = load_catalog()


def test_the_readme_table_is_the_declared_one() -> None:
    readme = (ROOT / "docs" / "settings.md").read_text()
    found = re.search(r"<!-- settings-table:[^\n]*-->\n(.*?)<!-- /settings-table -->", readme, re.S)
    assert found, "docs/settings.md lost its settings-table markers"
    assert found.group(1) == settings.readme_table(load_catalog()), (
        "docs/settings.md's table is stale: python -m gpu_train.stack.settings prints the new one"
    )


def test_every_setting_is_a_field_with_one_declaration() -> None:
    declared = {s.attr for s in settings.SETTINGS}
    assert declared == {f.name for f in fields(config.StackConfig)} - {"stack", "project", "given"}
    assert len(settings.BY_KEY) == len(settings.SETTINGS)
    for s in settings.SETTINGS:
        assert s.kind in settings.KINDS and set(s.targets) <= {"gcp", "ssh"} and set(s.required_for) <= set(s.targets)


def test_defaults_come_from_the_declarations() -> None:
    ssh = config.parse({"gpu-train:target": "ssh", "gpu-train:hosts": ["u@h"]}, "s", CATALOG)
    for s in settings.SETTINGS:
        if s.key not in ("target", "hosts"):  # the two given
            assert getattr(ssh, s.attr) == s.default, s.key
    gcp = config.parse(gcp_raw(), "g", CATALOG)
    assert gcp.idle_stop_minutes == settings.GCP_IDLE_STOP_MINUTES
    assert gcp.image_family == load_catalog().default_image_family
    assert ssh.venv and not gcp.venv  # a venv per project on SSH hosts; the DLVM's Python on GCP


def test_the_agent_gets_its_settings_with_its_own_defaults() -> None:
    """Built in one place (stack.agentdoc.agent_settings: a setting marked ``agent`` that names no AgentSettings
    field fails there), and sent as the stack's part: what else agent.json holds stays on the host."""
    from gpu_train.gcp.vm import root_settings
    from gpu_train.stack.agentdoc import agent_settings, job_grace_s, settings_part

    ssh = config.parse({"gpu-train:target": "ssh", "gpu-train:hosts": ["u@h"]}, "s", CATALOG)
    sent = settings_part(agent_settings(ssh))
    defaults = AgentSettings().to_json()
    assert sent == {k: v for k, v in defaults.items() if k in sent}
    assert set(sent) == {"idleStopMinutes", "maxResumes", "maxRunHours", "gcp", "shutdownGraceS", "sshPort"}
    assert AgentSettings.from_json(sent) == AgentSettings()  # what the host decodes, the same defaults
    tuned = config.parse({**gcp_raw(), "gpu-train:maxResumes": 3, "gpu-train:idleStopMinutes": 45}, "g", CATALOG)
    grace = job_grace_s(tuned)
    assert settings_part(agent_settings(tuned, ssh_port=2222)) == {
        "idleStopMinutes": 45,
        "maxResumes": 3,
        "maxRunHours": None,
        "gcp": True,
        "shutdownGraceS": grace,
        "sshPort": 2222,
    }
    assert root_settings(tuned) == {
        "idleStopMinutes": 45,
        "maxResumes": 3,
        "maxRunHours": None,
        "gcp": True,
        "shutdownGraceS": grace,
        "user": tuned.ssh_user,
        "remoteRoot": tuned.remote_root,
    }
