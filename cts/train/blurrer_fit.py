"""Fine-tune the tiny model for the Blurrer role: a LoRA adapter trained with TRL's SFT trainer
on `cts.train.blurrer_data` examples (train split only), with a model config.

`cts train blurrer` runs `ADAPTER.fit` (the fit itself: `cts.train.lora_sft`) and writes the
adapter to cts/configs/models/adapters/smollm2-135m-blurrer/ with blurrer_train.json (the command
that rebuilds it, settings, counts, steps, losses, wall time). TRL, peft and torch are imported
inside: they are the `train` extra.
"""

from __future__ import annotations

from cts.train import blurrer_data
from cts.train.fuser_fit import FuserFitSettings
from cts.train.lora_sft import RoleAdapter

#: `cts train blurrer --help`.
HELP = """Fine-tune the tiny model's Blurrer: a LoRA adapter trained (CPU) on fused queries
    from the sample benchmark's train split, each with the chosen constraints' spans deleted
    (the dataset's own blurred query where it has one), every example passing `cts data
    blur`'s checks. The adapter of `smollm2-135m-blurrer` and its blurrer_train.json are
    written to --output."""

#: What its record counts of the examples besides labels and languages.
COUNTS = (("removed", blurrer_data.removed_counts),)

ADAPTER = RoleAdapter("blurrer", FuserFitSettings(), blurrer_data, "Blurrer calls", HELP, COUNTS)
