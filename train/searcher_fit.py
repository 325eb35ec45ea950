"""Fine-tune the tiny model for the searcher role: a LoRA adapter trained with TRL's SFT
trainer on `train.searcher_data` search runs (train split only), with a model config.

`cts train searcher` runs `fit_searcher` (the fit itself: `train.lora_sft`, shared with the
judge's and the User Answerer's) and writes the adapter to
configs/models/adapters/smollm2-135m-searcher/ with searcher_train.json (the command that
rebuilds it, settings, example counts, steps, losses, wall time). TRL, peft and torch are
imported inside: they are the `train` extra.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from configs import CONFIG_DIR
from train import lora_sft
from train.lora_sft import LoraSftSettings, fit_lora_sft, language_counts
from train.searcher_data import generate, label_counts, variant_counts

#: Where the searcher adapter lives (a model config names it relative to configs/).
ADAPTER_DIR = CONFIG_DIR / "models" / "adapters" / "smollm2-135m-searcher"
#: The record written beside the adapter.
RECORD = "searcher_train.json"


@dataclass(frozen=True)
class SearcherFitSettings(LoraSftSettings):
    """What a searcher fine-tune depends on; recorded beside the adapter.

    A searcher call is long: 1,185 tokens an example on average with the chat template (the
    system prompt and tools block alone are ~650; the longest, a Chinese observation, 3,030),
    so `max_length` holds the longest whole and one example is a micro-batch (padding a batch
    to a Chinese example would triple its cost).
    """

    examples: int = 144
    epochs: float = 1.0
    batch_size: int = 1
    grad_accum: int = 4
    learning_rate: float = 1e-3
    max_length: int = 3200
    threads: int = 2


def rebuild_command(settings: SearcherFitSettings) -> str:
    """The `cts train searcher` line that trains with `settings` (those it takes as options)."""
    return lora_sft.rebuild_command("searcher", settings)


def fit_searcher(settings: SearcherFitSettings, output: Path = ADAPTER_DIR) -> dict[str, Any]:
    """Generate the search runs, train the adapter on CPU, save it (weights and config only)
    to `output` with searcher_train.json (settings, example counts, steps, losses, wall
    time)."""
    examples = generate(settings.examples, settings.seed)
    data = {
        "labels": label_counts(examples),
        "variants": variant_counts(examples),
        "languages": language_counts(examples),
    }
    rows = [e.as_row() for e in examples]
    return fit_lora_sft("searcher", settings, rows, data, output, RECORD)
