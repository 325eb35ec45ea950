"""Fine-tune the tiny model for the Rewriter role: a LoRA adapter trained with TRL's SFT
trainer on `cts.train.rewriter_data` examples (train split only), with a model config.

`cts train rewriter` runs `ADAPTER.fit` (the fit itself: `cts.train.lora_sft`, shared with the
other roles') and writes the adapter to cts/configs/models/adapters/smollm2-135m-rewriter/ with
rewriter_train.json (the command that rebuilds it, settings, label counts, steps, losses, wall
time). TRL, peft and torch are imported inside: they are the `train` extra.
"""

from __future__ import annotations

from dataclasses import dataclass

from cts.train import rewriter_data
from cts.train.answerer_fit import AnswererFitSettings
from cts.train.lora_sft import RoleAdapter


@dataclass(frozen=True)
class RewriterFitSettings(AnswererFitSettings):
    """What a Rewriter fine-tune depends on; recorded beside the adapter. A Rewriter call is
    short (a blurred query and 1-3 pairs: ~150 tokens with the chat template), so the User
    Answerer's layout (one example a micro-batch, 8 a step, on one thread), one epoch."""

    examples: int = 480
    epochs: float = 1.0


#: `cts train rewriter --help`.
HELP = """Fine-tune the tiny model's Rewriter: a LoRA adapter trained (CPU) on dialogues about
    the sample benchmark's train split, each rewritten as the blurred query with every
    answer that is not `unknown` appended. The adapter of `smollm2-135m-rewriter` and its
    rewriter_train.json are written to --output."""

ADAPTER = RoleAdapter("rewriter", RewriterFitSettings(), rewriter_data, "Rewriter calls", HELP)
