"""LMCache's in-process connector as a launch configuration: the config file each replica
gets is read back by LMCache's own config loader as the values it was built from, the
replicas get their own files and disk tiers but one hash seed, vLLM's flags name the
connector, and a value that cannot run is refused naming its field, before anything
starts; no file is overwritten."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_sharedkv.stack.launch.inprocess_connector import (
    CONFIG_ENV,
    CONNECTOR,
    InprocessConfigError,
    InprocessSettings,
    inprocess_launch,
    redis_url,
)


def settings(tmp_path: Path, **changes: object) -> InprocessSettings:
    values: dict[str, object] = {
        "chunk_size": 256, "local_cpu_gb": 2.0, "local_disk": tmp_path / "disk",
        "local_disk_gb": 4.0, "remote_url": redis_url("127.0.0.1", 6379),
        "engine_block": 16}
    values.update(changes)
    return InprocessSettings(**values)  # type: ignore[arg-type]


def test_lmcache_reads_each_replicas_file_as_built(tmp_path: Path) -> None:
    config_mod = pytest.importorskip("lmcache.v1.config",
                                     reason="LMCache's own loader reads the files")
    launch = inprocess_launch(settings(tmp_path), tmp_path / "conf")
    launch.write()
    read = {}
    for name in ("A", "B"):
        env = launch.env(name)
        read[name] = config_mod.LMCacheEngineConfig.from_file(env[CONFIG_ENV])
        config = read[name]
        with pytest.MonkeyPatch.context() as patch:  # as LMCache's vLLM adapter loads it
            for key, value in env.items():
                patch.setenv(key, value)
            config.update_config_from_env()
        assert (config.chunk_size, config.local_cpu, config.max_local_cpu_size) == (
            256, True, 2.0)
        assert config.local_disk == str(tmp_path / "disk" / name)
        assert config.max_local_disk_size == 4.0
        assert (config.remote_url, config.remote_serde) == ("redis://127.0.0.1:6379", "naive")
        assert config.save_unfull_chunk is False
        assert config.pre_caching_hash_algorithm == "sha256_cbor"
    assert launch.env("A")[CONFIG_ENV] != launch.env("B")[CONFIG_ENV]
    assert launch.env("A")["PYTHONHASHSEED"] == launch.env("B")["PYTHONHASHSEED"]
    argv = launch.argv()
    transfer = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert transfer == {"kv_connector": CONNECTOR, "kv_role": "kv_both"}
    assert launch.record()["backend"] == "redis://"
    assert "--no-enable-prefix-caching" in inprocess_launch(
        settings(tmp_path, prefix_caching=False), tmp_path / "off").argv()


def test_no_disk_and_no_remote_leave_their_keys_out(tmp_path: Path) -> None:
    launch = inprocess_launch(settings(tmp_path, local_disk=None, local_disk_gb=0.0,
                                       remote_url=None), tmp_path)
    text = launch.replica("A").config_text
    assert "local_disk" not in text and "remote_url" not in text
    assert launch.record()["backend"] == "none (each replica alone)"


@pytest.mark.parametrize(("changes", "field"), [
    ({"chunk_size": 0}, "chunk_size"),
    ({"chunk_size": 200}, "chunk_size"),  # not whole 16-token blocks
    ({"local_cpu_gb": 0.0}, "local_cpu_gb"),
    ({"local_disk_gb": 0.0}, "local_disk_gb"),
    ({"local_disk": None}, "local_disk_gb"),  # a size without a path
    ({"remote_url": "http://127.0.0.1:6379"}, "remote_url"),
    ({"remote_url": "redis://127.0.0.1"}, "remote_url"),  # no port
    ({"remote_serde": "zstd"}, "remote_serde"),
])
def test_a_value_that_cannot_run_names_its_field(tmp_path: Path, changes: dict[str, object],
                                                  field: str) -> None:
    with pytest.raises(InprocessConfigError) as err:
        inprocess_launch(settings(tmp_path, **changes), tmp_path)
    assert err.value.field == field
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_a_disk_tier_under_a_file_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(InprocessConfigError) as err:
        inprocess_launch(settings(tmp_path, local_disk=blocker / "disk"), tmp_path)
    assert err.value.field == "local_disk"
    assert "not a directory" in str(err.value)


def test_an_existing_config_file_is_never_overwritten(tmp_path: Path) -> None:
    launch = inprocess_launch(settings(tmp_path), tmp_path)
    launch.write()
    launch.write()  # the same text again: nothing changes
    theirs = launch.replica("B").config_file
    theirs.write_text("chunk_size: 512\n")
    with pytest.raises(InprocessConfigError) as err:
        launch.write()
    assert err.value.field == "config_file"
    assert theirs.read_text() == "chunk_size: 512\n"
