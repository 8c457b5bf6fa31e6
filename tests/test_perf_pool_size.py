"""The ON arm's pool is sized from what the engine stores per token (every layer's page
for a hybrid model), rounded to a power of two, and capped by the host's memory with a
warning rather than pinning the machine to death."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_sharedkv.models.geometry_27b import QWEN35_27B_GEOMETRY
from pytest_sharedkv.perf.pool_size import MINIMUM_GB, pool_size_gb, stored_bytes_per_token

H200_X2 = 256 * 2**30
SCREENING = {"8k": [7841] * 3, "32k": [32929] * 3}  # the H200 screening's prompt tokens
H200 = 128 * 2**30  # the one-GPU host


def test_a_hybrid_model_stores_every_layer_at_the_attention_page() -> None:
    assert stored_bytes_per_token(QWEN35_27B_GEOMETRY) == 64 * 4 * 256 * 2 * 2  # 262,144
    llama = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "hidden_size": 4096, "dtype": "bfloat16"}
    assert stored_bytes_per_token(llama) == 32 * 8 * 128 * 2 * 2  # attention only: the KV


def test_the_h200_screening_gets_a_pool_its_largest_size_fits() -> None:
    pool = pool_size_gb(QWEN35_27B_GEOMETRY, SCREENING, host_bytes=H200_X2)
    gb, why = pool.gb, pool.why
    # 25.9 GB stored, +10%, the next power of two; was 16 from the KV
    assert gb == 32.0 and pool.one_by_one == ()
    assert "25.9 GB at 262,144 bytes a token" in why and "capped" not in why
    assert pool_size_gb(QWEN35_27B_GEOMETRY, {"8k": [7841] * 3}, host_bytes=H200_X2).gb == \
        MINIMUM_GB


def test_a_small_host_caps_the_pool_and_says_what_to_expect() -> None:
    pool = pool_size_gb(QWEN35_27B_GEOMETRY, SCREENING, host_bytes=24 * 2**30)
    # one 32k request stores 8.6 GB, over the 8 GB cap: 32k is dropped, said why; 8k fits
    assert pool.gb == 8.0 and pool.dropped == ("32k",) and "PARTIAL" not in pool.why
    assert "32k dropped (one request stores 8.6 GB, more than the 8 GB cap" in pool.why
    alone = pool_size_gb(QWEN35_27B_GEOMETRY, {"32k": [32929] * 3}, host_bytes=24 * 2**30)
    # nothing would be left: kept, capped, and the partial hits said
    assert alone.dropped == () and alone.gb == 8.0 and "capped at 8 GB" in alone.why
    assert "PARTIAL" in alone.why


def test_128k_on_the_one_gpu_host_runs_request_by_request() -> None:
    """Three 128k prompts store 103 GB together, over the 64 GB cap of a 128 GiB host; one
    stores 34 GB, which the cap holds: 128k runs request by request in a 64 GB pool, the
    smaller sizes together. Where even one request is too large, PARTIAL hits are said."""
    sizes = {**SCREENING, "128k": [131_041] * 3}
    pool = pool_size_gb(QWEN35_27B_GEOMETRY, sizes, host_bytes=H200)
    assert pool.gb == 64.0 and pool.one_by_one == ("128k",), pool
    assert "128k runs request by request (103.1 GB together, 34.4 GB each" in pool.why
    assert "PARTIAL" not in pool.why
    assert pool.native_gb == 32.0  # NATIVE: one offload per replica, two under the cap
    small = pool_size_gb(QWEN35_27B_GEOMETRY, SCREENING, host_bytes=H200_X2)
    assert small.native_gb == small.gb == 32.0  # two 32 GB offloads fit 128 GB
    huge = pool_size_gb(QWEN35_27B_GEOMETRY, {"256k": [262_113] * 3}, host_bytes=H200)
    assert huge.gb == 64.0 and huge.one_by_one == () and "PARTIAL" in huge.why
    # beside sizes that fit, 256k (68.7 GB a request) is dropped, and the rest run as before
    mixed = pool_size_gb(QWEN35_27B_GEOMETRY, {**sizes, "256k": [262_113] * 3},
                         host_bytes=H200)
    assert mixed.dropped == ("256k",) and mixed.one_by_one == ("128k",) and mixed.gb == 64.0
    assert "256k dropped (one request stores 68.7 GB" in mixed.why


def test_an_unknown_geometry_gets_the_minimum_and_says_why() -> None:
    pool = pool_size_gb({"layer_types": ["full_attention"]}, SCREENING, host_bytes=H200_X2)
    gb, why = pool.gb, pool.why
    assert gb == MINIMUM_GB and "geometry is unknown" in why


def test_the_screening_sizes_its_pool_from_its_own_payloads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tier's payloads at 8k and 32k (three 32k prompts of 32,929 tokens) get 32 GB on
    a large host; 8k alone keeps the minimum; a config without geometry keeps it too."""
    from pytest_sharedkv.perf import payloads, pool_size
    from pytest_sharedkv.perf.fixtures import _pool_size

    monkeypatch.setattr(pool_size, "host_memory_bytes", lambda: H200_X2)
    (tmp_path / "config.json").write_text(json.dumps(QWEN35_27B_GEOMETRY))
    words = payloads.word_generator(1568)
    both = payloads.build(payloads.WORDS, ("8k", "32k"), 1568, words, sessions=1)
    assert _pool_size(tmp_path, both).gb == 32.0
    small = payloads.build(payloads.WORDS, ("8k",), 1568, words, sessions=1)
    assert _pool_size(tmp_path, small).gb == MINIMUM_GB
    (tmp_path / "config.json").write_text("{}")
    assert _pool_size(tmp_path, both).gb == MINIMUM_GB
    (tmp_path / "config.json").unlink()
    pool = _pool_size(tmp_path, both)
    assert pool.gb == MINIMUM_GB and "no config.json" in pool.why


def test_the_floor_line_says_what_a_full_hit_moves(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The floor stays the geometry's KV bytes (the issue's definition); its line adds what
    the pool stores per token where the engine's layout differs (4.0x for the 27B)."""
    from pytest_sharedkv.perf import floor
    from pytest_sharedkv.perf.fixtures import _floor

    monkeypatch.setattr(floor, "measure_h2d_gb_s", lambda: 55.3)
    (tmp_path / "config.json").write_text(json.dumps(QWEN35_27B_GEOMETRY))
    measured, line = _floor(tmp_path)
    assert measured is not None and measured.kv_bytes_per_token == 65_536
    assert measured.stored_bytes_per_token == 262_144  # recorded: the layout floor's bytes
    assert line.startswith("floor: 65,536 KV bytes a token") and \
        "the pool stores 262,144 bytes a token as the engine lays the KV out (4.0x)" in line


def test_a_dropped_size_leaves_the_screenings_payloads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a 24 GiB host a 32k request (8.6 GB stored) does not fit the 8 GB cap: the pool
    drops 32k, and the payloads are built again without it (warm-ups and sessions stay)."""
    from pytest_sharedkv.config.options import Settings
    from pytest_sharedkv.perf import payloads, pool_size
    from pytest_sharedkv.perf.fixtures import _payloads, _pool_size

    monkeypatch.setattr(pool_size, "host_memory_bytes", lambda: 24 * 2**30)
    (tmp_path / "config.json").write_text(json.dumps(QWEN35_27B_GEOMETRY))
    both = payloads.build(payloads.WORDS, ("8k", "32k"), 1568, payloads.word_generator(1568),
                          sessions=1)
    assert _pool_size(tmp_path, both).dropped == ("32k",)
    settings = Settings(service_sizes=("8k", "32k"))
    kept = _payloads(settings, True, None, 1568, 16, without=("32k",))
    assert kept.sizes() == ["8k"] and kept.warmups and kept.sessions
    assert _payloads(settings, True, None, 1568, 16).sizes() == ["8k", "32k"]


def test_the_pool_note_names_the_pools_of_the_arms_that_run() -> None:
    """A run without ON says the NATIVE offload and what it was sized from, not an ON pool
    it never started; with both arms both are said."""
    from pytest_sharedkv.perf.fixtures import _pool_note
    from pytest_sharedkv.perf.pool_size import PoolSize

    pool = PoolSize(64.0, "the largest size", native_gb=32.0)
    assert _pool_note(pool, ("OFF", "ON")) == \
        "pool: 64 GB of LMCache L1 in the ON arm (the largest size)"
    assert _pool_note(pool, ("OFF", "NATIVE")).startswith(
        "pool: the NATIVE arm offloads to 32 GB on each replica (vLLM's own, not shared; ")
    assert "sized as the ON arm's 64 GB would be (the largest size)" in \
        _pool_note(pool, ("OFF", "NATIVE"))
    both = _pool_note(pool, ("OFF", "ON", "NATIVE", "NATIVE", "ON", "OFF"))
    assert both.startswith("pool: 64 GB of LMCache L1 in the ON arm") and "32 GB" in both


@pytest.mark.parametrize(("host_gib", "pool_gb", "dropped"), [(128, 8.0, ("256k",)),
                                                              (512, 256.0, ())])
def test_256k_runs_where_the_host_holds_it_and_is_dropped_by_name_where_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host_gib: int, pool_gb: float,
        dropped: tuple[str, ...]) -> None:
    """--sharedkv-perf-sizes 8k,256k on the 27B geometry (chunk 1568, its 262,144-token
    context): one 256k prompt of 261,857 tokens stores 68.6 GB, over the 64 GB cap of a
    128 GiB host, so 256k is dropped and the pool note says so and why (the pool sized from
    8k, what is left); half of a 512 GiB host holds all three (206 GB) together."""
    from pytest_sharedkv.config.options import Settings
    from pytest_sharedkv.perf import pool_size
    from pytest_sharedkv.perf.fixtures import _payloads, _pool_note, _pool_size

    monkeypatch.setattr(pool_size, "host_memory_bytes", lambda: host_gib * 2**30)
    (tmp_path / "config.json").write_text(json.dumps(QWEN35_27B_GEOMETRY))
    settings = Settings(service_sizes=("8k",), perf_sizes=("8k", "256k"))
    built = _payloads(settings, True, tmp_path, 1568, 16)
    assert [p.prompt_tokens for p in built.of_size("256k")] == [261_857] * 3
    pool = _pool_size(tmp_path, built)
    assert (pool.gb, pool.dropped, pool.one_by_one) == (pool_gb, dropped, ())
    note = _pool_note(pool, ("OFF", "ON"))
    if dropped:
        assert "256k dropped (one request stores 68.6 GB, more than the 64 GB cap, half " \
            "this host's memory" in note
        assert "the largest size's requests store 6.2 GB" in note  # 8k's: the pool's size
    else:
        assert "dropped" not in note and "requests store 205.9 GB" in note


def test_a_dropped_size_leaves_the_screening_as_if_never_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the one-GPU H200 (128 GiB host) the real-compute sessions ran 8k,32k,128k; a
    session that asks for 256k as well drops it and sends the same payloads (the corpus
    digest they recorded) with the same pools, so merge-screenings takes it beside them."""
    from pytest_sharedkv.config.options import Settings
    from pytest_sharedkv.models.compute_model import ComputeModelRecipe, make_compute_model
    from pytest_sharedkv.perf import pool_size
    from pytest_sharedkv.perf.fixtures import _payloads, _pool_size

    monkeypatch.setattr(pool_size, "host_memory_bytes", lambda: 128 * 2**30)
    model = tmp_path / "model"
    make_compute_model(model, ComputeModelRecipe())
    seen = []
    for sizes in (("8k", "32k", "128k"), ("8k", "32k", "128k", "256k")):
        settings = Settings(perf_sizes=sizes)
        pool = _pool_size(model, _payloads(settings, True, model, 1568, 16))
        sent = _payloads(settings, True, model, 1568, 16, without=pool.dropped)
        seen.append((sent.digest, pool.gb, pool.native_gb, pool.one_by_one, pool.dropped))
    assert seen == [("9ff4939af819ef29", 64.0, 32.0, ("128k",), ()),
                    ("9ff4939af819ef29", 64.0, 32.0, ("128k",), ("256k",))]


def test_the_hosts_arm_gives_each_server_half_the_cap_and_drops_what_one_cannot_hold() -> None:
    """The OFF-HOSTS session on the one-GPU H200 (128 GiB host, 64 GB cap): two LMCache
    servers on one host may pin 32 GB each, not the ON pool's 64 GB each (128 GB pinned
    would be all of the host). One 128k request stores 34.4 GB, more than a server's 32
    GB: 128k is dropped, said why; 8k and 32k keep 32 GB a server, together."""
    sizes = {**SCREENING, "128k": [131_041] * 3}
    pool = pool_size_gb(QWEN35_27B_GEOMETRY, sizes, host_bytes=H200, hosts_arm=True)
    assert (pool.hosts_gb, pool.dropped, pool.one_by_one) == (32.0, ("128k",), ()), pool
    assert ("128k dropped (one request stores 34.4 GB, more than the 32 GB each of the HOSTS "
            "arm's two LMCache servers may pin, two on this host under the 64 GB cap") \
        in pool.why
    assert "PARTIAL" not in pool.why
    on = pool_size_gb(QWEN35_27B_GEOMETRY, sizes, host_bytes=H200)  # no HOSTS arm: as before
    assert (on.gb, on.dropped, on.one_by_one) == (64.0, (), ("128k",))
    big = pool_size_gb(QWEN35_27B_GEOMETRY, sizes, host_bytes=H200_X2, hosts_arm=True)
    assert (big.hosts_gb, big.dropped, big.one_by_one) == (64.0, (), ("128k",)), big
    assert "the cap of each HOSTS server is 64 GB" in big.why


def test_the_hosts_arm_drops_what_the_l2_directory_cannot_hold() -> None:
    """8k and 32k store 32.1 GB together (6.2 + 25.9); a directory L2 with 20 GB free
    keeps 8k and drops 32k by name; unknown free space drops nothing."""
    free = 20 * 10**9
    pool = pool_size_gb(QWEN35_27B_GEOMETRY, SCREENING, host_bytes=H200_X2, hosts_arm=True,
                        l2_free_bytes=free)
    assert pool.dropped == ("32k",) and pool.hosts_gb == MINIMUM_GB, pool
    assert ("32k dropped (the HOSTS arm's L2 would hold 32.1 GB with it, more than the "
            "20.0 GB free where the L2 writes)") in pool.why
    assert pool_size_gb(QWEN35_27B_GEOMETRY, SCREENING, host_bytes=H200_X2,
                        hosts_arm=True).dropped == ()
    assert pool_size_gb(QWEN35_27B_GEOMETRY, SCREENING, host_bytes=H200_X2,
                        l2_free_bytes=free).dropped == ()  # no HOSTS arm: the L2 unused


def test_the_pool_note_names_each_hosts_servers_own_l1(tmp_path: Path) -> None:
    from pytest_sharedkv.perf.fixtures import _l2_free_bytes, _pool_note
    from pytest_sharedkv.perf.pool_size import PoolSize
    from pytest_sharedkv.stack.l2.backends import DirectoryL2

    pool = PoolSize(64.0, "the largest size", hosts_gb=32.0)
    note = _pool_note(pool, ("OFF", "HOSTS"))
    assert note.startswith("pool: the HOSTS arm's two LMCache servers (one per replica, "
                           "sharing the L2) 32 GB of L1 each"), note
    free = _l2_free_bytes(DirectoryL2(tmp_path / "not" / "yet" / "l2"))
    assert isinstance(free, int) and free > 0  # the nearest folder that exists
    assert _l2_free_bytes(None) is None
