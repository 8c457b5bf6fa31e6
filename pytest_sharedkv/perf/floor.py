"""The physical floor of a cross-replica hit: the bytes of a prompt's KV (and of one
sequence's recurrent state) moved host-to-device at the rate measured in the same run.

A cross-replica TTFT below that floor did not come through the pool: the receiver's own
prefix cache answered, and the measurement is INVALID. The geometry is read from the
model's ``config.json``; it is a lower bound on purpose (sliding-window layers, whose KV
is capped by their window, are not counted), so a real transfer is never marked INVALID.

Recurrent state (Gated DeltaNet layers, Qwen3-Next / Qwen3.5) per sequence and linear
layer: the state ``linear_num_value_heads x linear_key_head_dim x linear_value_head_dim``
in ``mamba_ssm_dtype`` where the config names one (Qwen3.5 says float32), else in the
model's dtype; plus the convolution state ``(linear_conv_kernel_dim - 1) x channels`` in
the model's dtype, channels = ``2 x linear_num_key_heads x linear_key_head_dim +
linear_num_value_heads x linear_value_head_dim``. Both can be overridden where an engine
keeps them otherwise.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from pytest_sharedkv.perf.observations import Floor, Observation

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4,
               "float64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "int8": 1}
ATTENTION_TYPES = ("full_attention", "attention")
LINEAR_TYPES = ("linear_attention",)
H2D_BYTES = 1 << 30
H2D_REPEATS = 5


class FloorError(ValueError):
    """A config the geometry cannot be read from, or a rate that cannot be measured."""


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's config: ``text_config`` of a multimodal config (Qwen3.5's
    ``Qwen3_5ForConditionalGeneration``), else the config itself."""
    nested = config.get("text_config")
    return nested if isinstance(nested, Mapping) else config


def _int(cfg: Mapping[str, Any], name: str, where: str) -> int:
    value = cfg.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FloorError(f"{where}: {name} must be a non-negative integer, found {value!r}")
    return value


def dtype_bytes(name: object, where: str, field: str = "dtype") -> int:
    text = str(name).removeprefix("torch.")
    if text not in DTYPE_BYTES:
        raise FloorError(f"{where}: {field} {name!r} is not one of "
                         f"{', '.join(sorted(DTYPE_BYTES))}")
    return DTYPE_BYTES[text]


def _dtype(config: Mapping[str, Any], cfg: Mapping[str, Any], where: str) -> object:
    for source in (cfg, config):
        for name in ("dtype", "torch_dtype"):
            if source.get(name) is not None:
                return source[name]
    raise FloorError(f"{where}: no dtype or torch_dtype, so the bytes of a KV element are "
                     "unknown (pass dtype=)")


def layer_counts(config: Mapping[str, Any], where: str = "config.json") -> tuple[int, int]:
    """(attention layers that keep every token's KV, Gated DeltaNet layers)."""
    cfg = text_config(config)
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        return (sum(t in ATTENTION_TYPES for t in types), sum(t in LINEAR_TYPES for t in types))
    layers = _int(cfg, "num_hidden_layers", where)
    interval = cfg.get("full_attention_interval")
    if interval is not None:
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise FloorError(f"{where}: full_attention_interval must be a positive integer, "
                             f"found {interval!r}")
        full = sum((i + 1) % interval == 0 for i in range(layers))
        return full, layers - full
    return layers, 0


def kv_geometry(config: Mapping[str, Any], *, dtype: str | None = None,
                state_dtype: str | None = None, where: str = "config.json") -> tuple[int, int]:
    """(KV bytes per token, recurrent bytes per sequence) of a Hugging Face config dict.

    KV: attention layers x num_key_value_heads x head_dim (or hidden_size /
    num_attention_heads) x 2 (K and V) x dtype bytes. Recurrent: see the module's
    docstring. ``dtype`` / ``state_dtype`` override the config's."""
    cfg = text_config(config)
    attention, linear = layer_counts(config, where)
    element = dtype_bytes(dtype if dtype is not None else _dtype(config, cfg, where), where)
    heads = _int(cfg, "num_attention_heads", where)
    kv_heads = (_int(cfg, "num_key_value_heads", where)
                if cfg.get("num_key_value_heads") is not None else heads)
    if cfg.get("head_dim") is not None:
        head_dim = _int(cfg, "head_dim", where)
    elif heads:
        head_dim = _int(cfg, "hidden_size", where) // heads
    else:
        raise FloorError(f"{where}: no head_dim, and num_attention_heads is 0")
    kv_per_token = attention * kv_heads * head_dim * 2 * element
    if not linear:
        return kv_per_token, 0
    v_heads = _int(cfg, "linear_num_value_heads", where)
    k_heads = _int(cfg, "linear_num_key_heads", where)
    k_dim = _int(cfg, "linear_key_head_dim", where)
    v_dim = _int(cfg, "linear_value_head_dim", where)
    kernel = _int(cfg, "linear_conv_kernel_dim", where)
    ssm = state_dtype if state_dtype is not None else cfg.get("mamba_ssm_dtype")
    state_element = (dtype_bytes(ssm, where, "mamba_ssm_dtype") if ssm is not None
                     else element)
    state = v_heads * k_dim * v_dim * state_element
    conv = max(kernel - 1, 0) * (2 * k_heads * k_dim + v_heads * v_dim) * element
    return kv_per_token, linear * (state + conv)


def config_floor(config: Mapping[str, Any], h2d_gb_s: float, source: str) -> Floor:
    kv, recurrent = kv_geometry(config)
    return Floor(h2d_gb_s=h2d_gb_s, kv_bytes_per_token=kv,
                 recurrent_bytes_per_sequence=recurrent, source=source)


def measure_h2d_gb_s(device: str = "cuda", nbytes: int = H2D_BYTES,
                     repeats: int = H2D_REPEATS) -> float:
    """Host-to-device copy rate in GB/s (1e9 bytes): the median of REPEATS copies of
    NBYTES from pinned host memory, timed with CUDA events on the copying stream."""
    try:
        import torch
    except ImportError as exc:
        raise FloorError(f"measuring the host-to-device rate needs torch ({exc})") from None
    if nbytes < 1 or repeats < 1:
        raise FloorError(f"nbytes and repeats must be positive, not {nbytes}, {repeats}")
    try:
        target = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise FloorError(f"measure_h2d_gb_s: {device!r} is not a device ({exc})") from None
    if target.type != "cuda":
        raise FloorError(f"measure_h2d_gb_s: {device!r} is not a CUDA device")
    if not torch.cuda.is_available():
        raise FloorError(f"measure_h2d_gb_s: no CUDA device here (torch {torch.__version__} "
                         "sees none), so the host-to-device floor cannot be measured")
    with torch.cuda.device(target):
        source = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        destination = torch.empty(nbytes, dtype=torch.uint8, device=target)
        stream = torch.cuda.current_stream()
        destination.copy_(source, non_blocking=True)  # warm-up: mappings, clocks
        stream.synchronize()
        rates = []
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            destination.copy_(source, non_blocking=True)
            end.record(stream)
            end.synchronize()
            rates.append(nbytes / (start.elapsed_time(end) / 1e3) / 1e9)
        del source, destination
    return float(statistics.median(rates))


L2_PROBE_BYTES = 256 << 20
L2_PROBE_REPEATS = 3
L2_PROBE_ENTRY = "sharedkv-floor-probe@0x00000000@0@probe@sharedkv-floor"


def measure_l2_read_gb_s(l2: Any, nbytes: int = L2_PROBE_BYTES,
                         repeats: int = L2_PROBE_REPEATS) -> float:
    """An L2's read rate in GB/s (1e9 bytes): one entry of NBYTES written through the
    suite's own client (stack.l2), then the median of REPEATS timed reads of it whole; the
    entry is removed after. FloorError where the L2 cannot be written or read."""
    import time

    if nbytes < 1 or repeats < 1:
        raise FloorError(f"nbytes and repeats must be positive, not {nbytes}, {repeats}")
    entry = L2_PROBE_ENTRY + (".data" if getattr(l2, "adapter_type", "").startswith("fs")
                              else "")
    data = bytes(range(256)) * (nbytes // 256) + bytes(nbytes % 256)
    try:
        l2.write(entry, data)
    except Exception as exc:  # the L2's own error: a full Redis, a read-only directory
        raise FloorError(f"the L2 read rate: {l2.describe()} refused a {nbytes:,}-byte "
                         f"entry ({type(exc).__name__}: {exc})") from None
    try:
        rates = []
        for _ in range(repeats):
            started = time.perf_counter()
            read = l2.read(entry)
            seconds = time.perf_counter() - started
            if read is None or len(read) != nbytes:
                raise FloorError(f"the L2 read rate: {l2.describe()} gave back "
                                 f"{'nothing' if read is None else f'{len(read):,} bytes'} "
                                 f"of a {nbytes:,}-byte entry")
            rates.append(nbytes / seconds / 1e9)
    finally:
        l2.remove(entry)
    return float(statistics.median(rates))


def floor_ratio(ttft_s: float, tokens: int, floor: Floor) -> float:
    """How many floors a TTFT is: below 1 the pool cannot have served it."""
    return ttft_s / floor.seconds(tokens)


def below_floor(ttft_s: float, tokens: int, floor: Floor) -> bool:
    return ttft_s < floor.seconds(tokens)


def invalid(observations: Iterable[Observation], floor: Floor) -> list[Observation]:
    """Measured cross-replica observations faster than the floor: INVALID (the receiver's
    own prefix cache answered, not the pool)."""
    return [o for o in observations if o.step == "cross" and not o.warmup
            and below_floor(o.ttft_s, o.prompt_tokens, floor)]
