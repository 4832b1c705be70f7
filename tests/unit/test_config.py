"""The stack-config model: types, defaults, unknown keys, both value forms (YAML and engine strings)."""

from __future__ import annotations

import pytest

from gpu_train.catalog.loader import load_catalog
from gpu_train.stack import config, stackfile
from gpu_train.stack.config import ConfigError, SshHost, parse, parse_host
from tests.conftest import gcp_raw

CATALOG = load_catalog()


def problems_of(raw: dict) -> list[config.Problem]:
    with pytest.raises(ConfigError) as e:
        parse(raw, "s", CATALOG)
    return e.value.problems


def test_defaults() -> None:
    cfg = parse(gcp_raw(), "dev", CATALOG)
    assert (cfg.machine_type, cfg.spot, cfg.boot_disk_size_gb, cfg.boot_disk_type) == ("n1-standard-8", False, 200, "pd-balanced")
    assert (cfg.ssh_user, cfg.remote_root, cfg.target, cfg.region) == ("trainer", "~/gpu-train", "gcp", "us-central1")
    assert cfg.image_project == "deeplearning-platform-release"
    assert cfg.image_family.startswith("pytorch-") and "nvidia" in cfg.image_family
    assert cfg.labels == {} and cfg.allow_ssh_from_anywhere is False


def test_engine_form_strings_and_json_equal_yaml_form() -> None:
    """`pulumi up` hands every value over as a string, structured ones as JSON."""
    engine = gcp_raw(
        gpuCount="2", spot="true", sshSourceRanges='["198.51.100.0/24","203.0.113.7/32"]', labels='{"team":"vision"}', bootDiskSizeGb="300"
    )
    yaml_form = gcp_raw(
        gpuCount=2, spot=True, sshSourceRanges=["198.51.100.0/24", "203.0.113.7/32"], labels={"team": "vision"}, bootDiskSizeGb=300
    )
    assert parse(engine, "s", CATALOG) == parse(yaml_form, "s", CATALOG)


def test_bare_keys_belong_to_the_project_namespace() -> None:
    raw = {k.removeprefix("gpu-train:"): v for k, v in gcp_raw().items()}
    assert parse(raw, "s", CATALOG) == parse(gcp_raw(), "s", CATALOG)


def test_comma_separated_list() -> None:
    assert parse(gcp_raw(sshSourceRanges="198.51.100.0/24, 203.0.113.7/32"), "s", CATALOG).ssh_source_ranges == (
        "198.51.100.0/24",
        "203.0.113.7/32",
    )


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("gpuCount", "two", "expected a whole number"),
        ("gpuCount", True, "expected a whole number"),
        ("gpuCount", 1.5, "expected a whole number"),
        ("spot", "yes please", "expected true or false"),
        ("spot", 1, "expected true or false"),
        ("bootDiskSizeGb", [200], "expected a whole number"),
        ("sshSourceRanges", [1, 2], "expected a list of strings"),
        ("sshSourceRanges", {"a": "b"}, "expected a list of strings"),
        ("labels", ["team"], "expected a map of strings to strings"),
        ("labels", {"a": ["b"]}, "expected a map of strings to strings"),
        ("zone", 5, "expected a string"),
        ("zone", "", "expected a string"),
        ("machineType", {"secure": "v1:abc"}, "stored as a secret"),
        ("target", "aws", "must be 'gcp' or 'ssh'"),
    ],
)
def test_wrong_types_name_the_key(key: str, value: object, expected: str) -> None:
    problems = problems_of(gcp_raw(**{key: value}))
    assert [p.key for p in problems] == [key]
    assert expected in problems[0].message and problems[0].fix


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("gpuTyp", "gpu-train:gpuType"),
        ("gpu_count", "gpu-train:gpuCount"),
        ("sshSourceRange", "gpu-train:sshSourceRanges"),
        ("machinetype", "gpu-train:machineType"),
        ("xyzzy", "known keys"),
    ],
)
def test_unknown_keys_suggest(key: str, suggestion: str) -> None:
    (p,) = problems_of(gcp_raw(**{key: "x"}))
    assert p.key == key and "unknown setting" in p.message and suggestion in p.fix


@pytest.mark.parametrize(("target", "guess"), [("shh", "did you mean 'ssh'?"), ("GCP ", "did you mean 'gcp'?"), ("aws", "")])
def test_a_wrong_target_is_the_one_problem_said(target: str, guess: str) -> None:
    """An SSH stack with `target: shh` was judged as a GCP stack: four more problems, one of them the wrong
    advice "remove gpu-train:hosts from the stack"; only the target is wrong, and the fix names the close one."""
    raw = {"gpu-train:target": target, "gpu-train:hosts": ["me@gpu-box.lab:22"], "gpu-train:python": "/usr/bin/python3"}
    (p,) = problems_of(raw)
    assert p.key == "target" and p.fix == f"{guess + ' ' if guess else ''}set gpu-train:target to gcp or ssh"


def test_every_missing_required_setting_at_once() -> None:
    problems = problems_of(gcp_raw(zone=None, sshSourceRanges=None, **{"gcp:project": None}))
    assert {p.key for p in problems} == {"zone", "sshSourceRanges", "gcp:project"}
    assert all(p.fix for p in problems)


def test_other_namespaces_are_left_alone() -> None:
    assert parse(gcp_raw(**{"gcp:region": "us-central1", "aws:region": "x"}), "s", CATALOG).zone == "us-central1-a"


def test_ssh_target() -> None:
    cfg = parse({"gpu-train:target": "ssh", "gpu-train:hosts": ["me@127.0.0.2:2222", "box"], "gpu-train:sshKey": "/k"}, "lab", CATALOG)
    assert cfg.hosts[0] == SshHost("me", "127.0.0.2", 2222) and cfg.hosts[1].port == 22
    assert cfg.project is None and cfg.ssh_private_key_path() == "/k"


def test_ssh_target_rejects_gcp_keys_and_needs_hosts() -> None:
    problems = problems_of({"gpu-train:target": "ssh", "gpu-train:gpuType": "nvidia-l4"})
    assert {p.key: p.message for p in problems} == {"gpuType": "does not apply to a target 'ssh' stack", "hosts": "is required"}


@pytest.mark.parametrize("text", ["u@h:port", "u@:22", "u@h:0", "u@h:70000"])
def test_parse_host_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_host(text)


def test_public_key_inline_path_and_missing(public_key, tmp_path) -> None:
    inline = parse(gcp_raw(), "s", CATALOG)
    assert stackfile.read_public_key(inline)[0].startswith("ssh-ed25519 ")
    from_path = parse(gcp_raw(sshPublicKey=str(public_key)), "s", CATALOG)
    text, problem = stackfile.read_public_key(from_path)
    assert problem is None and text == public_key.read_text().strip()
    assert from_path.ssh_private_key_path() == str(public_key).removesuffix(".pub")
    (tmp_path / "junk.pub").write_text("not a key")
    for path, msg in ((tmp_path / "none.pub", "no readable public key"), (tmp_path / "junk.pub", "does not hold")):
        text, problem = stackfile.read_public_key(parse(gcp_raw(sshPublicKey=str(path)), "s", CATALOG))
        assert text is None and problem.key == "sshPublicKey" and msg in problem.message and "ssh-keygen" in problem.fix


def test_stack_files(tmp_path) -> None:
    f = tmp_path / "Pulumi.mine.yaml"
    f.write_text(
        "config:\n  gcp:project: proj-1\n  gpu-train:zone: us-central1-a\n  gpu-train:gpuType: nvidia-tesla-t4\n"
        "  gpu-train:gpuCount: 1\n  gpu-train:sshSourceRanges: [203.0.113.7/32]\n"
    )
    assert stackfile.load_file(f, CATALOG).stack == "mine"
    for text, msg in (("config: [1", "not valid YAML"), ("config: 5", "no `config:` mapping")):
        f.write_text(text)
        with pytest.raises(ConfigError, match=msg):
            stackfile.load_file(f, CATALOG)
    with pytest.raises(ConfigError, match="no stack file"):
        stackfile.load_file(tmp_path / "Pulumi.nope.yaml", CATALOG)


@pytest.mark.parametrize(
    ("text", "shape"),
    [
        ("g2-standard-8", ("g2-standard-8", None, None)),
        ("n1-standard-8/nvidia-tesla-v100", ("n1-standard-8", "nvidia-tesla-v100", 1)),
        ("n1-standard-16/nvidia-tesla-t4/4", ("n1-standard-16", "nvidia-tesla-t4", 4)),
    ],
)
def test_parse_shape(text: str, shape: tuple) -> None:
    assert config.parse_shape(text) == shape
    with pytest.raises(ValueError):
        config.parse_shape(f"{text}/x" if text.count("/") == 1 else "n1-standard-8/nvidia-tesla-t4/two")


def ssh_settings(**overrides: object) -> dict[str, object]:
    raw: dict[str, object] = {"gpu-train:target": "ssh", "gpu-train:hosts": ["me@box.lab:22"], "gpu-train:sshKey": "/k/id"}
    raw.update({(k if ":" in k else f"gpu-train:{k}"): v for k, v in overrides.items()})
    return raw


@pytest.mark.parametrize(
    "raw",
    [
        ssh_settings(),
        {"target": "ssh", "hosts": ["me@box.lab"], "sshKey": "/k/id", "maxResumes": 3},  # bare keys
        ssh_settings(notify="https://ntfy.sh/x", idleStopMinutes=20, remoteRoot="/data/{node}"),
        ssh_settings(gpuType="T4"),  # GCP's alone: refused, not looked up in the catalog
        ssh_settings(pools=[{"role": "chief", "machineType": "n1-standard-8"}]),
        ssh_settings(maxResumes=-1, notify="ntfy.sh/x", recoverHours=1000),
        ssh_settings(hosts=["me@-oProxyCommand=x"], remoteRoot="relative"),
        ssh_settings(machineTyp="n1-standard-8"),  # a typo
        ssh_settings(hosts=[]),
    ],
)
def test_an_ssh_stack_is_checked_without_compute_engines_rules_as_with_them(raw: dict) -> None:
    """The tasks check an SSH stack by its own rules (no catalog, no Compute Engine module: check_ssh),
    and find exactly what the whole validation (scripts/plan, the program) finds in it."""
    from gpu_train.gcp import validate
    from gpu_train.stack import check

    def outcome(checker) -> object:
        try:
            return checker()
        except ConfigError as e:
            return e.problems

    assert check.target_of(raw) == "ssh"
    assert outcome(lambda: check.check_ssh(raw, "s")) == outcome(lambda: validate.check(raw, "s", CATALOG))


def test_the_target_is_gcp_unless_the_stack_says_ssh() -> None:
    from gpu_train.stack import check

    assert [check.target_of(raw) for raw in ({}, {"target": "ssh"}, {"gpu-train:target": "ssh"}, {"target": "sssh"}, {"target": 1})] == [
        "gcp",
        "ssh",
        "ssh",
        "gcp",
        "gcp",
    ]
