"""``make-model --kind copy-attention``: the attention-only copy model, made offline."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_make_model_makes_the_attention_only_copy_model(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    from pytest_sharedkv.__main__ import make_model_command
    from pytest_sharedkv.models.kinds import kind_in

    assert make_model_command(["--kind", "copy-attention", str(tmp_path / "m")]) == 0
    assert kind_in(tmp_path / "m") == "copy-attention"
    assert "copy-attention model, digest 32823e049a97c0ba" in capsys.readouterr().out
