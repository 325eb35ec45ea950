"""The tiny model: converted once from the PyPI GGUF, verified by checksum, idempotent."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cts.serving import tiny_model
from cts.serving.tiny_model import MARKER, prepare_tiny

pytestmark = pytest.mark.slow


def test_prepare_is_idempotent(tiny_path):
    marker = Path(tiny_path) / MARKER
    before = marker.stat().st_mtime_ns
    assert str(prepare_tiny(log=False)) == tiny_path
    assert marker.stat().st_mtime_ns == before
    recorded = json.loads(marker.read_text())
    assert recorded["source_sha256"] == tiny_model.GGUF_SHA256
    assert "model.safetensors" in recorded["files"]


def test_a_corrupted_checkpoint_is_converted_again_with_identical_logits(
    tiny_path, tmp_path, monkeypatch
):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("CTS_HOME", str(tmp_path))
    copy = tmp_path / "models" / tiny_model.TINY_NAME
    shutil.copytree(tiny_path, copy)
    with (copy / "tokenizer_config.json").open("a") as f:
        f.write(" ")
    assert not tiny_model._verified(copy)
    assert prepare_tiny(log=False) == copy
    assert tiny_model._verified(copy)

    gguf = tiny_model.locate_gguf()
    tok = AutoTokenizer.from_pretrained(copy)
    ids = tok("The capital of France is", return_tensors="pt")["input_ids"]
    original = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    converted = AutoModelForCausalLM.from_pretrained(copy, dtype=torch.float32)
    with torch.inference_mode():
        assert torch.equal(original(ids).logits, converted(ids).logits)


def test_a_wrong_gguf_checksum_is_refused(monkeypatch, tmp_path):
    fake = tmp_path / tiny_model.GGUF_NAME
    fake.write_bytes(b"not a model")
    monkeypatch.setattr(tiny_model, "_installed_gguf", lambda: fake)
    with pytest.raises(RuntimeError, match="is not the expected"):
        tiny_model.locate_gguf()
