"""Fine-tune the tiny model for the coverage judge role: a LoRA adapter trained with TRL's SFT
trainer on `train.judge_data` examples (train split only), shipped with a model config.

`cts train judge` runs `fit_judge` (the fit itself: `train.lora_sft`, shared with the User
Answerer's); its defaults rebuilt the shipped adapter (configs/models/adapters/
smollm2-135m-judge/, recorded in its judge_train.json). TRL, peft and torch are imported
inside: they are the `train` extra.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from configs import CONFIG_DIR
from train import lora_sft
from train.judge_data import generate, label_counts
from train.lora_sft import LoraSftSettings, fit_lora_sft, language_counts

#: Where the shipped judge adapter lives (a model config names it relative to configs/).
ADAPTER_DIR = CONFIG_DIR / "models" / "adapters" / "smollm2-135m-judge"
#: The record written beside the adapter.
RECORD = "judge_train.json"


@dataclass(frozen=True)
class JudgeFitSettings(LoraSftSettings):
    """What a judge fine-tune depends on; recorded beside the adapter. The defaults built the
    shipped adapter: 150 optimizer steps of 8 examples."""

    examples: int = 600
    epochs: float = 2.0
    #: One example a micro-batch: on 2 CPU cores padding costs more than batching gains
    #: (19 s a step of 8 against 22 s at 2 a micro-batch and 39 s at 8).
    batch_size: int = 1
    grad_accum: int = 8


def rebuild_command(settings: JudgeFitSettings) -> str:
    """The `cts train judge` line that trains with `settings` (those it takes as options)."""
    return lora_sft.rebuild_command("judge", settings)


def fit_judge(settings: JudgeFitSettings, output: Path = ADAPTER_DIR) -> dict[str, Any]:
    """Generate the examples, train the adapter on CPU, save it (weights and config only) to
    `output` with judge_train.json (settings, label counts, steps, losses, wall time)."""
    examples = generate(settings.examples, settings.seed)
    data = {
        "labels": label_counts(examples),
        "languages": language_counts(examples),
    }
    return fit_lora_sft("judge", settings, [e.as_row() for e in examples], data, output, RECORD)
