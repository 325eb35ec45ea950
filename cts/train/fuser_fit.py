"""Fine-tune the tiny model for the Fuser role: a LoRA adapter trained with TRL's SFT trainer
on `cts.train.fuser_data` examples (train split only), with a model config.

`cts train fuser` runs `ADAPTER.fit` (the fit itself: `cts.train.lora_sft`, shared with the other
roles') and writes the adapter to cts/configs/models/adapters/smollm2-135m-fuser/ with
fuser_train.json (the command that rebuilds it, settings, counts, steps, losses, wall time).
TRL, peft and torch are imported inside: they are the `train` extra.
"""

from __future__ import annotations

from dataclasses import dataclass

from cts.train import fuser_data
from cts.train.lora_sft import RoleAdapter
from cts.train.rewriter_fit import RewriterFitSettings


@dataclass(frozen=True)
class FuserFitSettings(RewriterFitSettings):
    """What a Fuser (or Blurrer) fine-tune depends on; recorded beside the adapter. A call
    is as short as a Rewriter's (a session of 2-3 queries, or one query and the constraints to
    remove), so the Rewriter's layout: one example a micro-batch, 8 a step, one thread, one
    epoch of 480."""


#: `cts train fuser --help`.
HELP = """Fine-tune the tiny model's Fuser: a LoRA adapter trained (CPU) on search sessions made
    from the sample benchmark's train split, each fused as its most complete query with the
    times, figures and removed constraint it states. The adapter of `smollm2-135m-fuser` and
    its fuser_train.json are written to --output."""

#: What its record counts of the examples besides labels and languages.
COUNTS = (("constraints", fuser_data.constraint_counts),)

ADAPTER = RoleAdapter("fuser", FuserFitSettings(), fuser_data, "Fuser calls", HELP, COUNTS)
