"""The tiny model's role adapters, one `RoleAdapter` each (cts/train/lora_sft.py): `cts train
ROLE` is registered for every one, in this order."""

from __future__ import annotations

from cts.train import answerer_fit, blurrer_fit, fuser_fit, judge_fit, rewriter_fit, searcher_fit
from cts.train.lora_sft import RoleAdapter

ROLE_ADAPTERS: tuple[RoleAdapter, ...] = (
    judge_fit.ADAPTER,
    answerer_fit.ADAPTER,
    searcher_fit.ADAPTER,
    rewriter_fit.ADAPTER,
    fuser_fit.ADAPTER,
    blurrer_fit.ADAPTER,
)
