"""Fine-tune the tiny model for the User Answerer role: a LoRA adapter trained with TRL's SFT
trainer on `cts.train.answerer_data` examples (train split only), with a model config.

`cts train answerer` runs `ADAPTER.fit` (the fit itself: `cts.train.lora_sft`, shared with the
judge's) and writes the adapter to cts/configs/models/adapters/smollm2-135m-answerer/ with
answerer_train.json (the command that rebuilds it, settings, label counts, steps, losses, wall
time). TRL, peft and torch are imported inside: they are the `train` extra.
"""

from __future__ import annotations

from dataclasses import dataclass

from cts.train import answerer_data
from cts.train.lora_sft import LoraSftSettings, RoleAdapter


@dataclass(frozen=True)
class AnswererFitSettings(LoraSftSettings):
    """What a User Answerer fine-tune depends on; recorded beside the adapter.

    An answerer call is short: ~106 tokens an example with the chat template (the longest, a
    Chinese one, 209), the completion ~3.4 of them. Measured on this machine's 2 cores
    (2026-12-03, `cts.train.lora_sft` with these settings, 2-6 steps a layout, while another
    training held both cores at a higher priority): one example a micro-batch, 8 a step, took
    7-9 CPU-s and 9-12 s a step on one thread; 8 a micro-batch 5.5 or 12-14 CPU-s (a batch
    holding the 209-token example pads every row to it); two threads 27-76 s a step (their
    workers spin-wait for a core another job holds). Hence one thread, one example a
    micro-batch. Full fit: 560 examples × 2 epochs / 8 a step = 140 steps; at ≤ 12 s a step
    ≤ 28 min (~18 min at the 7.5 CPU-s a step one free core gives).
    """

    examples: int = 560
    epochs: float = 2.0
    learning_rate: float = 5e-4
    max_length: int = 512
    threads: int = 1


#: `cts train answerer --help`.
HELP = """Fine-tune the tiny model's User Answerer: a LoRA adapter trained (CPU) on clarifying
    questions generated from the sample benchmark's train split, each answered with the
    removed constraint's span of the fused query or `unknown` (never its held-out answerer
    labels). The adapter of `smollm2-135m-answerer` and its answerer_train.json are written
    to --output."""

#: What its record counts of the examples besides labels and languages.
COUNTS = (("topics", answerer_data.topic_counts),)

ADAPTER = RoleAdapter(
    "answerer", AnswererFitSettings(), answerer_data, "User Answerer calls", HELP, COUNTS
)
