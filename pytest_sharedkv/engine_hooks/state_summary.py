"""A Gated DeltaNet layer's recurrent state, summarized alike wherever it is read: in a
launched engine (the KV audit's hook, from the tensors vLLM registered), in the stub
double, and from the model's CPU reference (``models/state_reference.py``), so the state
oracle (``stack/state_oracle.py``) compares what a replica loaded with what it should
have resumed from.

The summary is the L2 norm and the ``TOP`` largest magnitudes of the layer's conv state
(its ``CONV_KEPT`` most recent inputs) and recurrent state together, and, for a state of
at most ``MAX_VALUES`` values (the copy models'), every value in one canonical layout:
transformers' (conv channel, input) and (head, key dim, value dim). Norm and magnitudes
are blind to layout, but also to which word a code names (every code has the same
norm), so a small state is compared value by value. vLLM 0.26 keeps the recurrent state as
(head, value dim, key dim) and the conv window as (kernel - 1, channels) or its transpose
(``MambaStateShapeCalculator.gated_delta_net_state_shape``, ``_orient_conv_shape``):
``canonical`` turns them around (read from vLLM's source; to be shown on a GPU run).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Sequence
from typing import Any

TOP = 8
CONV_KEPT = 3  # vLLM keeps kernel - 1 inputs (transformers the whole kernel: its last 3)
MAX_VALUES = 8192  # a layer's state at most this many values is kept whole


def summary_of(values: Iterable[float]) -> dict[str, Any]:
    """{"norm", "top", "count", "values"} of plain floats (the stub's states)."""
    data = [float(v) for v in values]
    top = sorted((abs(v) for v in data), reverse=True)[:TOP]
    out: dict[str, Any] = {"norm": math.sqrt(sum(v * v for v in data)), "top": top,
                           "count": len(data)}
    if len(data) <= MAX_VALUES:
        out["values"] = data
    return out


def summary_of_tensors(tensors: Sequence[Any]) -> dict[str, Any]:
    """The same summary of torch tensors taken together (a layer's conv and recurrent
    state, canonical layout), computed in float32; the values kept where few."""
    import torch

    flat = torch.cat([t.detach().reshape(-1).float().cpu() for t in tensors])
    top = flat.abs().topk(min(TOP, flat.numel())).values.tolist() if flat.numel() else []
    out: dict[str, Any] = {"norm": float(flat.norm()), "top": [float(v) for v in top],
                           "count": int(flat.numel())}
    if flat.numel() <= MAX_VALUES:
        out["values"] = [round(float(v), 6) for v in flat.tolist()]
    return out


def canonical(conv: Any, ssm: Any) -> tuple[Any, Any]:
    """vLLM's per-request (conv, recurrent) state in transformers' layout: the conv window
    as (channels, CONV_KEPT), the state as (heads, key dim, value dim)."""
    if conv.shape[-2] == CONV_KEPT and conv.shape[-1] != CONV_KEPT:
        conv = conv.transpose(-1, -2)
    return conv, ssm.transpose(-1, -2)


STUB_LAYER = "model.layers.0.linear_attn"  # the one recurrent layer the stub double models
STUB_VALUES = 16


def stub_state(key: str) -> list[float]:
    """The stub double's recurrent state after a chunk: a function of the chunk's key (the
    cache salt and every token up to the chunk's end), its stand-in for a model's state."""
    raw = hashlib.sha256(key.encode()).digest()
    return [(b - 127.5) / 127.5 for b in raw[:STUB_VALUES]]
