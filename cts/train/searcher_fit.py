"""Fine-tune the tiny model for the searcher role: a LoRA adapter trained with TRL's SFT
trainer on `cts.train.searcher_data` search runs (train split only), with a model config.

`cts train searcher` runs `ADAPTER.fit` (the fit itself: `cts.train.lora_sft`, shared with the
judge's and the User Answerer's) and writes the adapter to
cts/configs/models/adapters/smollm2-135m-searcher/ with searcher_train.json (the command that
rebuilds it, settings, example counts, steps, losses, wall time). TRL, peft and torch are
imported inside: they are the `train` extra.
"""

from __future__ import annotations

from dataclasses import dataclass

from cts.train import searcher_data
from cts.train.lora_sft import LoraSftSettings, RoleAdapter


@dataclass(frozen=True)
class SearcherFitSettings(LoraSftSettings):
    """What a searcher fine-tune depends on; recorded beside the adapter.

    A searcher call is long: 1,185 tokens an example on average with the chat template (the
    system prompt and tools block alone are ~650; the longest, a Chinese observation, 3,030),
    so `max_length` holds the longest whole and one example is a micro-batch (padding a batch
    to a Chinese example would triple its cost).
    """

    examples: int = 144
    grad_accum: int = 4
    max_length: int = 3200


#: `cts train searcher --help`.
HELP = """Fine-tune the tiny model's WebDancer searcher: a LoRA adapter trained (CPU) on search
    runs over the sample benchmark's train split and corpus (one search with the question,
    then an answer copying the first hit's snippet). The adapter of `smollm2-135m-searcher`
    and its searcher_train.json are written to --output."""

#: What its record counts of the examples besides labels and languages.
COUNTS = (("variants", searcher_data.variant_counts),)

ADAPTER = RoleAdapter(
    "searcher", SearcherFitSettings(), searcher_data, "searcher calls", HELP, COUNTS
)
