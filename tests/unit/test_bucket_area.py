"""gpu-train:bucketArea: a stack's own folder of its bucket, made once and kept in its stack file, so that two
stacks of one name on one bucket (two people's `lab` in a team bucket) never share runs; and the one line
gpu-train adds to a stack file for it, every other byte kept."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import yaml

from gpu_train.catalog.loader import load_catalog
from gpu_train.stack import config, stackedit
from gpu_train.stack.bucket import AREA_RE, area_of, grant_conditions, new_area, parse_bucket, run_prefix
from gpu_train.stack.problems import ConfigError
from gpu_train.stack.stackedit import add_setting, with_setting
from infra import program
from infra.ops import preview
from tests.conftest import gcp_raw

CATALOG = load_catalog()


def test_an_area_is_the_stacks_name_and_eight_hex_digits_and_no_stack_name_is_one() -> None:
    made = {new_area("lab") for _ in range(20)}
    assert len(made) == 20 and all(AREA_RE.fullmatch(a) and a.startswith("lab@") for a in made)
    assert new_area("lab", "0000beef") == "lab@0000beef"
    assert area_of("lab", None) == "lab" and area_of("lab", "lab@0000beef") == "lab@0000beef"  # a stack from before areas
    place = parse_bucket("gs://ckpt/team")
    folders = [run_prefix(place, a, "r_20260101_000000") for a in ("lab@0000beef", "lab@0000cafe", "lab")]
    assert len(set(folders)) == 3 and not any(a.startswith(b) for a in folders for b in folders if a != b)


@pytest.mark.parametrize("value", ["lab", "lab@", "lab@0000BEEF", "lab@0000bee", "lab@0000beef/x", "../x@0000beef", "@0000beef"])
def test_a_bad_area_names_the_setting_and_the_fix(value: object) -> None:
    raw = {"gpu-train:target": "ssh", "gpu-train:hosts": ["u@h:22"], "gpu-train:bucket": "gs://ckpt/x", "gpu-train:bucketArea": value}
    with pytest.raises(ConfigError) as e:
        config.parse(raw, "lab", CATALOG)
    assert "gpu-train:bucketArea" in str(e.value) and "STACK@XXXXXXXX" in str(e.value) and "fix:" in str(e.value)


def test_the_vms_grant_is_its_areas_and_a_stack_from_before_areas_keeps_its_names() -> None:
    """Two GCP stacks named `s` (two projects of a team) on one bucket had one grant's prefix: each VM could
    overwrite and delete the other's runs."""

    def write_grant(**overrides: object) -> str:
        result = preview.run(program.main, stack="s", config=gcp_raw(bucket="gs://team-ckpt/exp", **overrides))
        assert result.error is None, result.error
        grants = {g.inputs["role"]: g.inputs["condition"] for g in result.of_type("storage/bucketIAMMember:BucketIAMMember")}
        return grants["roles/storage.objectUser"]["expression"]

    objects = "projects/_/buckets/team-ckpt/objects/exp/"
    mine = write_grant(bucketArea="s@1a2b3c4d")
    assert f'startsWith("{objects}.gpu-train-runs/s@1a2b3c4d/")' in mine and f'startsWith("{objects}.gpu-train-parts/s@1a2b3c4d/")' in mine
    assert ".gpu-train-runs/s/" not in mine
    assert mine == grant_conditions(parse_bucket("gs://team-ckpt/exp"), "s@1a2b3c4d")[0]
    assert f'startsWith("{objects}.gpu-train-runs/s/")' in write_grant()


STACK = """\
# my lab box
encryptionsalt: v1:abc
config:
  # where it is
  gpu-train:target: ssh
  gpu-train:hosts:
    - me@box:22
  gpu-train:bucket: gs://ckpt/team   # the team's

  gpu-train:notify:
    secure: v1:xyz
# trailing comment
"""


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        (STACK, STACK.replace("    secure: v1:xyz\n", "    secure: v1:xyz\n  gpu-train:bucketArea: lab@0000beef\n")),
        ("config:\n    gpu-train:target: ssh\n", "config:\n    gpu-train:target: ssh\n    gpu-train:bucketArea: lab@0000beef\n"),
        ("config:\r\n  a:b: 1\r\n", "config:\r\n  a:b: 1\r\n  gpu-train:bucketArea: lab@0000beef\r\n"),  # its line endings
        ("config:\n  a:b: 1", "config:\n  a:b: 1\n  gpu-train:bucketArea: lab@0000beef\n"),  # no newline at its end
        (
            "config:\n  a:b: |\n    two\n    lines\nother: 1\n",
            "config:\n  a:b: |\n    two\n    lines\n  gpu-train:bucketArea: lab@0000beef\nother: 1\n",
        ),
        ("encryptionsalt: x\n", "encryptionsalt: x\nconfig:\n  gpu-train:bucketArea: lab@0000beef\n"),
        ("", "config:\n  gpu-train:bucketArea: lab@0000beef\n"),
        ("config: {a:b: 1}\n", None),  # a flow mapping: not extended, the user is told the line
        ("config:\n- a\n", None),
        ("config: 3\n", None),
    ],
)
def test_one_line_is_added_under_config_and_every_other_byte_kept(text: str, expect: str | None) -> None:
    assert with_setting(text, "bucketArea", "lab@0000beef") == expect
    if expect is not None:
        assert yaml.safe_load(expect)["config"]["gpu-train:bucketArea"] == "lab@0000beef"


def test_the_stack_file_is_written_once_keeping_its_mode_and_a_value_there_wins(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.lab.yaml"
    path.write_text(STACK)
    os.chmod(path, 0o640)
    assert add_setting(path, "bucketArea", "lab@0000beef") == "lab@0000beef"
    assert path.read_text() == with_setting(STACK, "bucketArea", "lab@0000beef") and path.stat().st_mode & 0o777 == 0o640
    assert add_setting(path, "bucketArea", "lab@0000cafe") == "lab@0000beef"  # made once: another command's is kept
    assert path.read_text().count("bucketArea") == 1
    flow = tmp_path / "Pulumi.flow.yaml"
    flow.write_text("config: {gpu-train:target: ssh}\n")
    with pytest.raises(ConfigError) as e:
        add_setting(flow, "bucketArea", "flow@0000beef")
    assert "gpu-train:bucketArea: flow@0000beef" in str(e.value) and flow.read_text() == "config: {gpu-train:target: ssh}\n"


def test_two_first_trains_at_once_keep_one_area(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two trains (a script starting several) each find no area: the one that writes second must take the
    first one's, not replace it (its runs would be in an area the stack no longer names)."""
    path = tmp_path / "Pulumi.lab.yaml"
    path.write_text(STACK)
    real, writing, release = stackedit.atomic_write, threading.Event(), threading.Event()

    def first_one_slow(where: Path, text: str, **kw: object) -> None:
        if "lab@0000aaaa" in text:  # the first train, caught between its read and its write
            writing.set()
            assert release.wait(30)
        real(where, text, **kw)  # type: ignore[arg-type]  # (atomic_write's own keywords, passed on)

    monkeypatch.setattr(stackedit, "atomic_write", first_one_slow)
    got: dict[str, str] = {}
    first = threading.Thread(target=lambda: got.update(a=add_setting(path, "bucketArea", "lab@0000aaaa")))
    first.start()
    assert writing.wait(30)
    second = threading.Thread(target=lambda: got.update(b=add_setting(path, "bucketArea", "lab@0000bbbb")))
    second.start()
    second.join(1)  # (without the lock it has read no area and written its own by now)
    release.set()
    first.join(30)
    second.join(30)
    assert got == {"a": "lab@0000aaaa", "b": "lab@0000aaaa"}
    assert path.read_text() == with_setting(STACK, "bucketArea", "lab@0000aaaa")


def test_a_lock_held_on_the_stack_file_is_refused_not_waited_on_for_ever(tmp_path: Path) -> None:
    """Anyone who can read a stack file can lock it (a shared project folder): the first `train` with a bucket
    says so, with the line to add, instead of hanging."""
    import fcntl

    path = tmp_path / "Pulumi.lab.yaml"
    path.write_text(STACK)
    with open(path, "rb") as other:
        fcntl.flock(other.fileno(), fcntl.LOCK_EX)
        with pytest.raises(ConfigError) as e:
            add_setting(path, "bucketArea", "lab@0000beef", wait_s=0.2)
    assert "held a lock" in str(e.value) and "gpu-train:bucketArea: lab@0000beef" in str(e.value)
    assert path.read_text() == STACK
