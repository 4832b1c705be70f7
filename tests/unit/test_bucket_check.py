"""`check` on an SSH stack with a bucket: on the host, in its login environment, with the job's Python (what
the uploader will see), Google's client finds credentials and writes, reads and deletes an object.

Against the storage emulator (tests/gcs.py) for the way that works and for a bucket that does not exist; with
the real google-auth and no credentials at all for the way that has none (its probe of the GCE metadata
server led to a loopback port by google-auth's own GCE_METADATA_HOST / GCE_METADATA_IP)."""

from __future__ import annotations

import pytest

from gpu_train.views.checkup import bucket_access

URL = "gs://ckpt/team"


@pytest.mark.parametrize(
    ("answer", "ok", "said", "fix"),
    [
        (
            {"ok": True, "object": "gs://ckpt/team/lab/.gpu-train-check-h-1", "credentials": "service account a@p.iam"},
            True,
            "wrote, read and deleted gs://ckpt/team/lab/.gpu-train-check-h-1",
            "",
        ),
        (
            {"ok": False, "step": "client", "detail": "cannot import google-cloud-storage"},
            False,
            "cannot import",
            "pip install google-cloud-storage",
        ),
        (
            {"ok": False, "step": "credentials", "detail": "Your default credentials were not found."},
            False,
            "no usable credentials",
            "gcloud auth application-default login",
        ),
        (
            {"ok": False, "step": "bucket", "detail": "write: 404 The specified bucket does not exist."},
            False,
            "no bucket ckpt",
            "gcloud storage buckets create gs://ckpt",
        ),
        (
            {"ok": False, "step": "access", "member": "serviceAccount:up@p.iam.gserviceaccount.com", "detail": "403"},
            False,
            "no access to objects in ckpt",
            "--member=serviceAccount:up@p.iam.gserviceaccount.com --role=roles/storage.objectUser",
        ),
        (
            {"ok": False, "step": "access", "detail": "403 you@x does not have storage.objects.create"},
            False,
            "no access",
            "MEMBER: user:YOU@DOMAIN or serviceAccount:EMAIL",
        ),
        ({"ok": False, "step": "network", "detail": "write: Connection refused"}, False, "Connection refused", "storage.googleapis.com"),
    ],
)
def test_each_answer_is_a_finding_with_its_fix(answer: dict, ok: bool, said: str, fix: str) -> None:
    f = bucket_access("lab", URL, {"python": "/usr/bin/python3", **answer}, None)
    assert f.ok is ok and said in f.detail and fix in f.fix, f


def test_a_host_that_cannot_be_asked_is_not_checked() -> None:
    f = bucket_access("lab", URL, None, "connection refused")
    assert f.ok is None and "connection refused" in f.detail


def test_google_s_own_exceptions_give_their_step() -> None:
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth
    from requests import ConnectionError as Refused

    from agent.bucketcheck import step_of

    assert [
        step_of(e)
        for e in (
            api.NotFound("b"),
            api.Forbidden("f"),
            api.Unauthorized("u"),
            auth.RefreshError("r"),
            auth.DefaultCredentialsError("d"),
            Refused("c"),
        )
    ] == ["bucket", "access", "credentials", "credentials", "credentials", "network"]
