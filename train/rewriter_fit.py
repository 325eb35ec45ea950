"""Fine-tune the tiny model for the Rewriter role: a LoRA adapter trained with TRL's SFT
trainer on `train.rewriter_data` examples (train split only), with a model config.

`cts train rewriter` runs `fit_rewriter` (the fit itself: `train.lora_sft`, shared with the
other roles') and writes the adapter to configs/models/adapters/smollm2-135m-rewriter/ with
rewriter_train.json (the command that rebuilds it, settings, label counts, steps, losses, wall
time). TRL, peft and torch are imported inside: they are the `train` extra.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from configs import CONFIG_DIR
from train import lora_sft
from train.lora_sft import LoraSftSettings, fit_lora_sft, language_counts
from train.rewriter_data import generate, label_counts

#: Where the Rewriter adapter lives (a model config names it relative to configs/).
ADAPTER_DIR = CONFIG_DIR / "models" / "adapters" / "smollm2-135m-rewriter"
#: The record written beside the adapter.
RECORD = "rewriter_train.json"


@dataclass(frozen=True)
class RewriterFitSettings(LoraSftSettings):
    """What a Rewriter fine-tune depends on; recorded beside the adapter. A Rewriter call is
    short (a blurred query and 1-3 pairs: ~150 tokens with the chat template), so one
    example a micro-batch on one thread, as the User Answerer's (train/answerer_fit.py)."""

    examples: int = 480
    epochs: float = 1.0
    batch_size: int = 1
    grad_accum: int = 8
    learning_rate: float = 5e-4
    max_length: int = 512
    threads: int = 1


def rebuild_command(settings: RewriterFitSettings) -> str:
    """The `cts train rewriter` line that trains with `settings` (those it takes as options)."""
    return lora_sft.rebuild_command("rewriter", settings)


def fit_rewriter(settings: RewriterFitSettings, output: Path = ADAPTER_DIR) -> dict[str, Any]:
    """Generate the examples, train the adapter on CPU, save it (weights and config only) to
    `output` with rewriter_train.json (settings, label counts, steps, losses, wall time)."""
    examples = generate(settings.examples, settings.seed)
    data = {"labels": label_counts(examples), "languages": language_counts(examples)}
    return fit_lora_sft("rewriter", settings, [e.as_row() for e in examples], data, output, RECORD)
