"""Model weights fetched once, on a machine with internet (a login node), so that compute nodes
start offline: a Hugging Face snapshot of each model, and a manifest of what was fetched.

A first start that downloads its weights (~250 GB for hard518) inside the servers' readiness
deadline, with 16 array tasks writing one Hugging Face cache at once, is what this avoids."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cts.serving.model_config import ModelConfig

#: Files a served or loaded checkpoint does not need: the original (non-HF) weights some repos
#: ship beside the HF ones, and other frameworks' formats (they would double the download).
IGNORE_PATTERNS = ["original/*", "*.pth", "*.pt", "*.gguf", "*.onnx", "*.msgpack", "*.h5", "*.ot"]

#: huggingface_hub.snapshot_download's signature, as far as it is used here.
Snapshot = Callable[..., str]


class DownloadError(RuntimeError):
    """A model could not be fetched; the message names it and the hub's reason."""


@dataclass(frozen=True)
class Downloaded:
    #: The name roles use for the model.
    key: str
    repo: str
    #: The revision the config asked for (None: the default branch) and the commit fetched.
    requested_revision: str | None
    revision: str
    path: str
    files: int
    bytes: int


def hub_models(models: dict[str, ModelConfig]) -> dict[str, ModelConfig]:
    """The models whose weights come from the hub: not the tiny model, not a local directory,
    not an endpoint someone else serves (`engine: openai` with `vllm.serve: false`), not a
    scripted engine."""
    return {
        key: m
        for key, m in models.items()
        if not m.is_tiny and not Path(m.path).expanduser().is_dir() and m.needs_weights
    }


def _default_snapshot() -> Snapshot:
    from huggingface_hub import snapshot_download

    return snapshot_download


def _size(folder: Path) -> tuple[int, int]:
    """Files and bytes under `folder` (a snapshot's files are links into the cache's blobs)."""
    files = [p for p in folder.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def download(
    key: str, model: ModelConfig, to: Path, snapshot: Snapshot | None = None
) -> Downloaded:
    """One model's snapshot under `to` (a Hugging Face cache folder: models--org--name/...)."""
    fetch = snapshot or _default_snapshot()
    try:
        path = Path(
            fetch(
                repo_id=model.path,
                revision=model.revision,
                cache_dir=to,
                ignore_patterns=IGNORE_PATTERNS,
            )
        )
    except Exception as e:  # the hub's errors are many (HTTP, auth, gated repos, disk)
        raise DownloadError(f"model {key} ({model.path}): {type(e).__name__}: {e}") from e
    # The cache layout names the commit: .../snapshots/<40-hex sha>.
    commit = path.name if re.fullmatch(r"[0-9a-f]{40}", path.name) else model.revision or "?"
    files, size = _size(path)
    return Downloaded(key, model.path, model.revision, commit, str(path), files, size)


def write_manifest(to: Path, downloaded: list[Downloaded]) -> Path:
    """`to/manifest.json`: per model its repo, the revision asked for and fetched, its local
    path, file count and bytes."""
    manifest = to / "manifest.json"
    document: dict[str, Any] = {
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "models": {d.key: asdict(d) for d in downloaded},
        "bytes": sum(d.bytes for d in downloaded),
    }
    partial = manifest.with_suffix(".partial")
    partial.write_text(json.dumps(document, indent=1))
    partial.replace(manifest)
    return manifest
