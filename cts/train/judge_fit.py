"""Fine-tune the tiny model for the coverage judge role: a LoRA adapter trained with TRL's SFT
trainer on `cts.train.judge_data` examples (train split only), shipped with a model config.

`cts train judge` runs `ADAPTER.fit` (the fit itself: `cts.train.lora_sft`, shared with the User
Answerer's); its defaults rebuilt the shipped adapter (cts/configs/models/adapters/
smollm2-135m-judge/, recorded in its judge_train.json). TRL, peft and torch are imported
inside: they are the `train` extra.
"""

from __future__ import annotations

from dataclasses import dataclass

from cts.train import judge_data
from cts.train.lora_sft import LoraSftSettings, RoleAdapter


@dataclass(frozen=True)
class JudgeFitSettings(LoraSftSettings):
    """What a judge fine-tune depends on; recorded beside the adapter. The defaults built the
    shipped adapter: 150 optimizer steps of 8 examples."""

    examples: int = 600
    epochs: float = 2.0


#: `cts train judge --help`.
HELP = """Fine-tune the tiny model's coverage judge: a LoRA adapter trained (CPU) on labelled
    answers generated from the sample benchmark's train split and corpus (never its human
    judge labels). The command that built the shipped adapter of `smollm2-135m-judge` is in
    its judge_train.json."""

ADAPTER = RoleAdapter("judge", JudgeFitSettings(), judge_data, "judge calls", HELP)
