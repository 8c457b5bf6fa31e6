"""Every engine flag the suite chooses for a launched vLLM (``EngineSettings``), recorded
with every launch (``launch_record.py``) and read back by ``compare``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

KV_CACHE_FLAG = "--kv-cache-memory-bytes"  # a fixed GPU KV cache per engine
SAMPLER_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}  # set unless the user's environment has it
GDN_PREFILL = {"gdn_prefill_backend": "triton"}


@dataclass(frozen=True)
class EngineSettings:
    """Every engine flag the suite chooses for a launched vLLM, in one recorded place, so a
    report says what its engines ran with and ``compare`` can tell two reports apart by
    it. ``enforce_eager``: the correctness tiers keep eager mode (no graph capture: faster
    starts); the perf tier runs with CUDA graphs, as production does. ``kv_cache_bytes``:
    an explicit ``--kv-cache-memory-bytes`` per replica (both replicas can then start
    together on one GPU: no profiling of each other's memory); None: vLLM sizes its cache
    from ``gpu_memory_utilization`` and the replicas start one after the other.
    ``gpu_memory_utilization`` is passed either way: beside an explicit cache it sizes
    nothing, but vLLM refuses to start unless that share of the GPU is free.
    ``load_format``/``quantization``: a weightless model's (``--load-format dummy``).
    ``extra_args``: the user's own (``--sharedkv-vllm-args``), appended last."""

    enforce_eager: bool = True
    max_num_seqs: int = 16
    gpu_memory_utilization: float = 0.35
    kv_cache_bytes: int | None = None
    additional_config: tuple[tuple[str, str], ...] = tuple(GDN_PREFILL.items())
    env: tuple[tuple[str, str], ...] = tuple(SAMPLER_ENV.items())
    load_format: str | None = None
    quantization: str | None = None
    extra_args: tuple[str, ...] = ()

    def flags(self) -> list[str]:
        """The vLLM flags these settings give (the same for every replica and arm)."""
        argv = ["--max-num-seqs", str(self.max_num_seqs)]
        if self.enforce_eager:
            argv.append("--enforce-eager")
        if self.kv_cache_bytes is not None:  # the utilization is then a start check only
            argv += [KV_CACHE_FLAG, str(self.kv_cache_bytes)]
        argv += ["--gpu-memory-utilization", f"{self.gpu_memory_utilization:g}"]
        if self.load_format is not None:
            argv += ["--load-format", self.load_format]
        if self.quantization is not None:
            argv += ["--quantization", self.quantization]
        return argv

    def record(self) -> dict[str, Any]:
        """The settings as the JSON report keeps them (``compare`` reads them back)."""
        data = asdict(self)
        data["additional_config"] = dict(self.additional_config)
        data["env"] = dict(self.env)
        data["extra_args"] = list(self.extra_args)
        return data


PERF_ENGINE = EngineSettings(enforce_eager=False)  # CUDA graphs, as served in production
