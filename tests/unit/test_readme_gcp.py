"""The README tells a newcomer what the GCP path needs (and that scripts/plan needs none of it)."""

from __future__ import annotations

from tests.conftest import ROOT


def test_readme_lists_the_gcp_prerequisites() -> None:
    text = (ROOT / "docs" / "google-cloud.md").read_text()
    section = text[text.index("## Prerequisites") : text.index("```sh\nscripts/setup")]
    for words in [
        "Pulumi CLI",
        "pulumi login --local",
        "PULUMI_CONFIG_PASSPHRASE",
        "pulumi login gs://",
        "gcloud auth application-default login",
        "compute.googleapis.com",
        "cloudquotas.googleapis.com",
        "`scripts/plan` needs none of these",
    ]:
        assert words in section, words
