"""Whether the queries a clarifier is trained on are held out from those it is evaluated on.

Paths and split names cannot tell: the same queries come under another path (a copy, golden
construction's `dataset.jsonl`, `cts/eval/sample_data/dev.jsonl` beside `sample`/dev). So the
instances themselves are compared: by id, and by their blurred and fused queries normalised
(Unicode NFKC, case folded, only letters and digits kept), so that a copy whose ids were
renamed, or whose queries differ only in case, spacing or punctuation, is found too."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.data.schema import Instance

#: Overlapping instances a message lists before it says how many more.
SHOWN = 10


def normalised(text: str) -> str:
    """A query as compared: NFKC, case folded, letters and digits only (any script)."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return "".join(c for c in folded if unicodedata.category(c)[0] in "LN")


@dataclass(frozen=True)
class Overlap:
    """A sampled instance that is an evaluated one: both ids, and what they share."""

    sampled_id: str
    evaluated_id: str
    why: str

    def describe(self) -> str:
        same = self.sampled_id if self.sampled_id == self.evaluated_id else None
        named = same or f"{self.sampled_id} = {self.evaluated_id}"
        return f"{named} ({self.why})"


def shared_instances(sampled: Sequence[Instance], evaluated: Sequence[Instance]) -> list[Overlap]:
    """Each sampled instance that has an evaluated instance's id, or one of whose queries
    (blurred or fused, normalised) is one of an evaluated instance's."""
    by_id = {i.id: i for i in evaluated}
    by_query: dict[str, tuple[str, str]] = {}
    for instance in evaluated:
        for field in ("blurred_query", "fused_query"):
            by_query.setdefault(normalised(getattr(instance, field)), (instance.id, field))
    found = []
    for instance in sampled:
        if instance.id in by_id:
            found.append(Overlap(instance.id, instance.id, "same id"))
            continue
        for field in ("blurred_query", "fused_query"):
            key = normalised(getattr(instance, field))
            if key and key in by_query:
                other, other_field = by_query[key]
                mine, theirs = field.replace("_", " "), other_field.replace("_", " ")
                why = f"same {mine}" if mine == theirs else f"its {mine} is the other's {theirs}"
                found.append(Overlap(instance.id, other, why))
                break
    return found


def held_out_overlap(sampled: DatasetSource, evaluated: DatasetSource) -> list[Overlap]:
    """The sampled instances (with the sampling's limit) that are instances of the evaluated
    dataset (all of it: a larger `dataset.limit` must not bring a training query into the
    evaluation). DatasetError when either does not load."""
    whole = evaluated.model_copy(update={"limit": None})
    return shared_instances(load_instances(sampled), load_instances(whole))


def describe(overlaps: Sequence[Overlap]) -> str:
    """`A-dev-01 (same id), X-2 = A-dev-02 (same fused query), … and N more`."""
    shown = ", ".join(o.describe() for o in overlaps[:SHOWN])
    more = len(overlaps) - SHOWN
    return shown + (f", and {more} more" if more > 0 else "")
