"""The state a replica should resume from, computed on CPU by the model's own reference
implementation (transformers' Qwen3-Next: its chunked and recurrent gated delta rule),
independently of any engine: the copy models' weights are known exactly.

``reference_states(model_dir, ids, positions)``: for each position p, every Gated
DeltaNet layer's conv state (its last ``CONV_KEPT`` inputs) and recurrent state after the
first p tokens, from one prefill split at those positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

CONV_KEPT = 3  # engine_hooks.state_summary.CONV_KEPT: models may not import engine_hooks


class Reference:
    """A model loaded once; states at any positions of any token ids."""

    def __init__(self, model_dir: Path, dtype: str = "bfloat16") -> None:
        from pytest_sharedkv.models.copy_matrix import CopyRunner

        self.runner = CopyRunner(model_dir, dtype)
        # the request whose prefill state_at continues: key -> (ids, cache, position)
        self._open: dict[str, tuple[list[int], Any, int]] = {}

    def layer_indices(self) -> list[int]:
        types = list(self.runner.model.config.layer_types)
        return [i for i, t in enumerate(types) if t == "linear_attention"]

    def states(self, ids: Sequence[int], positions: Sequence[int]
               ) -> dict[int, dict[int, tuple[Any, Any]]]:
        """position -> layer index -> (conv state's last inputs, recurrent state)."""
        return self._states(ids, positions, None)

    def state_at(self, key: str, ids: Sequence[int], position: int
                 ) -> dict[int, tuple[Any, Any]]:
        """The states after POSITION tokens of IDS, continuing the prefill KEY's last call
        left where POSITION lies at or after it (a request's loads come chunk after
        chunk): each request's tokens are prefilled about once, not once a load."""
        kept = self._open.get(key)
        if kept is None or kept[0] != list(ids) or kept[2] > position:
            from transformers import DynamicCache

            kept = (list(ids), DynamicCache(config=self.runner.model.config), 0)
        out = self._states(ids, [position], kept)
        self._open = {key: (kept[0], kept[1], position)}  # one request open at a time
        return out[position]

    def _states(self, ids: Sequence[int], positions: Sequence[int],
                kept: tuple[list[int], Any, int] | None
                ) -> dict[int, dict[int, tuple[Any, Any]]]:
        from transformers import DynamicCache

        from pytest_sharedkv.models.copy_matrix import linear_layers

        torch = self.runner.torch
        model = self.runner.model
        cache = DynamicCache(config=model.config) if kept is None else kept[1]
        out: dict[int, dict[int, tuple[Any, Any]]] = {}
        done = 0 if kept is None else kept[2]
        with torch.no_grad():
            for position in sorted(set(positions)):
                if position > done:
                    model(input_ids=torch.tensor([list(ids[done:position])]),
                          use_cache=True, **{self.runner.cache_kw: cache})
                    done = position
                out[position] = {
                    index: (layer.conv_states[0][..., -CONV_KEPT:].clone(),
                            layer.recurrent_states[0].clone())
                    for index, layer in zip(self.layer_indices(), linear_layers(cache),
                                            strict=True)}
        return out


def reference_states(model_dir: Path, ids: Sequence[int], positions: Sequence[int]
                     ) -> dict[int, dict[int, tuple[Any, Any]]]:
    return Reference(model_dir).states(ids, positions)
