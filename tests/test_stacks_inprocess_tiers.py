"""The in-process stack's tiers by option: each replica's local_cpu and local_disk (a
directory of its own in the run's temporary directory) sized in GiB, the remote backend
(redis or none); validated before any test, and a tier that cannot run names its option."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_sharedkv.models.copy_attention_model import AttentionCopyRecipe, config_dict
from pytest_sharedkv.stack.launch import stacks as stack_launch
from pytest_sharedkv.stack.launch.providers import build_vllm_pair
from pytest_sharedkv.stack.launch.spec import StackLaunch, StackUnavailable
from tests.test_stacks_wiring import cases, model, spec_for

ATTENTION = config_dict(AttentionCopyRecipe())


def configs(tmp_path: Path, tiers: stack_launch.InprocessTiers
            ) -> tuple[StackLaunch, dict[str, dict[str, object]]]:
    spec = stack_launch.stacked_spec(spec_for(tmp_path, ATTENTION), "inprocess",
                                     cases({"3k": (4, 3009)}), 8, tiers)
    assert spec.stack is not None and spec.stack.record is not None
    build_vllm_pair(spec, [])  # builds argv and environment: nothing starts
    return spec.stack, {name: r["config"] for name, r in spec.stack.record["replicas"].items()}


def test_the_options_size_each_replicas_tiers(tmp_path: Path) -> None:
    stack, values = configs(tmp_path, stack_launch.InprocessTiers(cpu_gib=3.5, disk_gib=12.0))
    disks = set()
    for config in values.values():
        assert config["max_local_cpu_size"] == 3.5 and config["max_local_disk_size"] == 12.0
        assert Path(str(config["local_disk"])).is_relative_to(tmp_path / "logs")
        disks.add(config["local_disk"])
        assert str(config["remote_url"]).startswith("redis://")
    assert len(disks) == 2 and stack.backend is not None  # a disk each, a shared Redis
    _, default = configs(tmp_path / "d", stack_launch.InprocessTiers())
    assert default["A"]["max_local_cpu_size"] == 2.0 and "local_disk" not in default["A"]


def test_no_remote_starts_no_redis_and_has_no_gate(tmp_path: Path) -> None:
    stack, values = configs(tmp_path, stack_launch.InprocessTiers(remote=False))
    assert stack.backend is None and "remote_url" not in values["A"]
    assert (stack.record["gate"], stack.record["no_gate"]) == (
        "none", stack_launch.INPROCESS_NO_REMOTE)
    assert stack.gate is None and not any("GATE" in k for _, env in stack.envs for k, _ in env)


def test_a_disk_tier_that_cannot_be_written_names_its_option(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, ATTENTION)
    (tmp_path / "file").write_text("")
    with pytest.raises(StackUnavailable,
                       match=r"^--sharedkv-inprocess-disk-gib: local_disk: .* is not a dir"):
        stack_launch.stacked_spec(replace(spec, log_dir=tmp_path / "file" / "logs"),
                                  "inprocess", cases({"3k": (4, 3009)}), 8,
                                  stack_launch.InprocessTiers(disk_gib=1.0))


@pytest.mark.parametrize(("args", "message"), [
    (["--sharedkv-inprocess-cpu-gib=0"], "--sharedkv-inprocess-cpu-gib: '0' is out of range*"),
    (["--sharedkv-inprocess-disk-gib=lots"],
     "--sharedkv-inprocess-disk-gib: 'lots' is not a number*"),
    (["--sharedkv-inprocess-disk-gib=4"],
     "--sharedkv-inprocess-disk-gib: only the in-process stack has LMCache tiers in each "
     "replica, and --sharedkv-stack is mp; give --sharedkv-stack inprocess or drop "
     "--sharedkv-inprocess-disk-gib"),
    (["--sharedkv-stack=native", "--sharedkv-inprocess-remote=none"],
     "--sharedkv-inprocess-remote: only the in-process stack*is native*"),
    (["--sharedkv-inprocess-remote=lm"],
     "--sharedkv-inprocess-remote: 'lm' is not one of redis, none"),
])
def test_a_tier_option_that_cannot_run_is_a_usage_error(
        pytester: pytest.Pytester, args: list[str], message: str) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_inprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


def test_the_options_reach_the_settings(pytester: pytest.Pytester) -> None:
    from pytest_sharedkv.state import state_of

    model(pytester.path, ATTENTION)
    config = pytester.parseconfigure(
        "--sharedkv-stack=inprocess", "--sharedkv-model=model",
        "--sharedkv-inprocess-cpu-gib=3", "--sharedkv-inprocess-disk-gib=5",
        "--sharedkv-inprocess-remote=none")
    tiers = stack_launch.inprocess_tiers(state_of(config).settings)
    assert tiers == stack_launch.InprocessTiers(3.0, 5.0, False)
    assert json.dumps(tiers.__dict__)  # plain values
