"""Each task's flags as one checked object (remote/tasks/taskoptions.py): a bad combination refused with the
flag and the fix before anything is contacted, Invoke's strings read once into numbers within bounds."""

from __future__ import annotations

import pytest

from gpu_train.errors import UsageError
from remote.tasks.taskoptions import (
    DashboardOptions,
    DownOptions,
    FetchOptions,
    ImportOptions,
    InitOptions,
    LogsOptions,
    ResumeOptions,
    ServeOptions,
    StopOptions,
)


@pytest.mark.parametrize(
    "made, said",
    [
        (lambda: FetchOptions(), None),
        (lambda: FetchOptions(source="bucket", watch=True, all_nodes=True), None),  # the bucket has no watch to follow
        (lambda: FetchOptions(sweep="grid"), None),
        (lambda: FetchOptions(source="s3"), "--from s3: `host` (the default) or `bucket`"),
        (lambda: FetchOptions(sweep="grid", run="r_1"), "--sweep fetches every trial of a sweep: give no --run, --all or --dest with it"),
        (lambda: FetchOptions(sweep="grid", all=True), "--sweep fetches every trial"),
        (lambda: FetchOptions(sweep="grid", dest="out"), "--sweep fetches every trial"),
        (lambda: FetchOptions(watch=True, all_nodes=True), "--watch follows one node: give --node N (default 0), not --all-nodes"),
        (lambda: FetchOptions(source="host", watch=True, all_nodes=True), "--watch follows one node"),
        (lambda: StopOptions(run="r_1"), None),
        (lambda: StopOptions(sweep="grid"), None),
        (lambda: StopOptions(run="r_1", sweep="grid"), "--run or --sweep, not both"),
        (lambda: ImportOptions(file="config.yaml"), None),
        (lambda: ImportOptions(gcloud=("gcloud", "ai-platform")), None),
        (lambda: ImportOptions(), 'import gcloud: give gcloud\'s command after `--` (gpu-train) or as --gcloud "..."'),
        (lambda: ImportOptions(file="c.yaml", gcloud_option="gcloud x"), "--gcloud goes with `import gcloud`, not with a file (c.yaml)"),
        (lambda: LogsOptions(all_nodes=True, follow=True), None),
        (lambda: ResumeOptions(force=True), None),
        (lambda: ServeOptions("tensorboard", fetched=True), None),
        (lambda: InitOptions(host="me@box:2222"), None),
        (lambda: InitOptions(gcp_project="my-proj", stack="h100.spot"), None),
        (lambda: InitOptions(), "give --host USER@HOST[:PORT] (a machine you have) or --gcp-project ID (a VM on Google Cloud)"),
        (lambda: InitOptions(host="me@box", gcp_project="p"), "give --host USER@HOST[:PORT]"),
        (lambda: InitOptions(host="me@box", stack="-x"), "--stack '-x': use letters, digits, '.', '_' and '-', starting with a letter"),
        (lambda: InitOptions(gcp_project="p", stack="a b"), "--stack 'a b': use letters"),
        (lambda: InitOptions(host="me@box:port"), "--host 'me@box:port': write it as user@host:port or a Host alias"),
        # what every later command refuses in the stack file, refused before it is written (it was written)
        (lambda: InitOptions(host="-oProxyCommand=x"), "--host '-oProxyCommand=x': the host starts with '-'"),
        (lambda: InitOptions(host="me@gpu_box"), "--host 'me@gpu_box': the host is not a host name"),
        (lambda: InitOptions(host="-l@box"), "--host '-l@box': the user starts with '-'"),
        (lambda: InitOptions(host="root@127.0.50.1:2222"), None),
        (lambda: InitOptions(host="gpu-box.lab"), None),
        (lambda: DownOptions(no_fetch=True, force=True), None),
        (lambda: DashboardOptions(address="127.0.41.9"), None),
        (lambda: DashboardOptions(address="0.0.0.0"), "--address '0.0.0.0': the dashboard listens on a loopback address only"),
    ],
)
def test_flags_together(made, said):
    if said is None:
        made()
        return
    with pytest.raises(UsageError) as e:
        made()
    assert str(e.value).startswith(said)


@pytest.mark.parametrize(
    "read, said",
    [
        (lambda: FetchOptions.read(streams="0"), "--streams 0: a number of parallel SSH streams from 1 to 64 (default 4)"),
        (lambda: FetchOptions.read(interval="-1"), "--interval '-1': must be from 0 or more"),
        (lambda: FetchOptions.read(node="x"), "--node 'x': expected a whole number"),
        (lambda: FetchOptions.read(run="../etc"), "--run '../etc' is not a run id"),
        (lambda: FetchOptions.read(sweep="a/b"), "--sweep 'a/b' is not a run id"),  # (it said --run)
        (lambda: StopOptions.read(sweep="../x"), "--sweep '../x' is not a run id"),
        (lambda: LogsOptions.read(lines="-2"), "--lines '-2': must be from 0 or more"),
        (lambda: StopOptions.read(grace="86401"), "--grace '86401': must be from 0 to 86400"),
        (lambda: ResumeOptions.read(grace="soon"), "--grace 'soon': expected a number"),
        (lambda: ServeOptions.read("jupyter", local_port="70000"), "--local-port '70000': must be from 1 to 65535"),
        (lambda: DownOptions.read(streams="65"), "--streams 65: a number of parallel SSH streams from 1 to 64 (default 4)"),
        (lambda: DashboardOptions.read(interval="0.5"), "--interval '0.5': must be from 1 to 3600"),
        (lambda: DashboardOptions.read(port="-1"), "--port '-1': must be from 0 to 65535"),
        (lambda: DashboardOptions.read(port="x"), "--port 'x': expected a whole number"),
    ],
)
def test_values_as_invoke_gives_them(read, said):
    with pytest.raises(UsageError) as e:
        read()
    assert str(e.value).startswith(said)


def test_inits_stack_name_and_kind():
    assert (InitOptions(host="me@box").name, InitOptions(host="me@box").kind) == ("lab", "ssh")
    assert (InitOptions(gcp_project="p").name, InitOptions(gcp_project="p", stack="g").name) == ("gcp", "g")


def test_defaults_and_values_read_once():
    assert FetchOptions.read() == FetchOptions(streams=4, interval=30.0, node=0)
    assert FetchOptions.read(streams="8", interval="2.5", node="1").streams == 8
    assert LogsOptions.read(lines=None, node=None) == LogsOptions(lines=50, node=0)
    assert StopOptions.read(grace="3").grace == 3.0 and ResumeOptions.read().grace == 10.0
    assert ServeOptions.read("tensorboard", local_port="6007").local_port == 6007
    assert DownOptions.read() == DownOptions(streams=4) and DownOptions.read(streams="2").streams == 2
    assert DashboardOptions.read() == DashboardOptions(interval=5.0, port=0, address="127.0.0.1")
    assert DashboardOptions.read(interval="2", port="8080") == DashboardOptions(interval=2.0, port=8080)


@pytest.mark.parametrize(
    "argv, gcloud, words",
    [
        (["gpu-train", "import", "gcloud", "--", "gcloud", "ai-platform", "--x", "a b"], None, ("gcloud", "ai-platform", "--x", "a b")),
        (["gpu-train", "import", "gcloud"], "gcloud ai-platform --x 'a b'", ("gcloud", "ai-platform", "--x", "a b")),
        (["gpu-train", "import", "gcloud", "--"], "gcloud y", ("gcloud", "y")),  # nothing after `--`: --gcloud's words
    ],
)
def test_gclouds_words_as_typed(argv, gcloud, words):
    assert ImportOptions.read("gcloud", gcloud=gcloud, argv=argv).gcloud == words
