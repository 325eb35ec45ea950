"""Whether the queries a clarifier is trained on are held out from those it is evaluated on.

Paths and split names cannot tell: the same queries come under another path (a copy, golden
construction's `dataset.jsonl`, `cts/eval/sample_data/dev.jsonl` beside `sample`/dev). So the
instances themselves are compared: by id, and by their blurred and fused queries normalised
(Unicode NFKC, case folded, only letters and digits kept), so that a copy whose ids were
renamed, or whose queries differ only in case, spacing or punctuation, is found too.

The same comparison tells whether a role the loop relies on (the User Answerer, Rewriter,
searcher) was fitted on the queries the loop samples: a role adapter's record keeps what its
examples were read from (`fitting_record`), and `roles_fitted_on` names each such role."""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cts.eval.data.dataset import DatasetSource, load_instances
from cts.eval.data.schema import Instance
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.config_sections import Role
from cts.foundation.yaml_config import ConfigError

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


# -- roles fitted on the sampled queries ----------------------------------------------------------

#: The key of a role adapter's record (cts/train/lora_sft.py) that says what it was fitted on.
TRAINED_ON = "trained_on"
#: The roles whose adapters the loop checks: every role but the clarifier it trains.
CHECKED_ROLES: tuple[Role, ...] = ("user_answerer", "rewriter", "searcher", "summarizer", "judge")


def _digest(text: str) -> str:
    return hashlib.sha256(normalised(text).encode("utf-8")).hexdigest()[:16]


class Queried(Protocol):
    """An instance as far as these checks read it (a data-module's own instance type too)."""

    @property
    def id(self) -> str: ...
    @property
    def blurred_query(self) -> str: ...
    @property
    def fused_query(self) -> str: ...


def fitting_record(instances: Sequence[Queried], source: str) -> dict[str, Any]:
    """What an adapter's record keeps of the instances its examples came from: where they
    were read, their ids, and digests of their normalised blurred and fused queries (a copy
    under another path or id is still found, and the record holds no query text)."""
    queries = {_digest(q) for i in instances for q in (i.blurred_query, i.fused_query)}
    return {"source": source, "ids": sorted(i.id for i in instances), "queries": sorted(queries)}


@dataclass(frozen=True)
class RoleFit:
    """A role whose adapter was fitted on instances the loop samples: it has seen them."""

    role: str
    model: str
    #: Where the adapter's examples were read (its record's `trained_on.source`).
    source: str
    shared: int
    sampled: int

    def describe(self) -> str:
        return (
            f"role {self.role} ({self.model}) was fitted on {self.shared} of the {self.sampled} "
            f"instances sampling reads ({self.source}): on them it answers from what it learned, "
            "not as it would on new queries, so the reward measures a role that has seen them. "
            "Sample on other instances, or refit the role on a split of its own."
        )


def _record(adapter_dir: Path) -> dict[str, Any] | None:
    """The `trained_on` of the record beside an adapter, when it has one."""
    for path in sorted(adapter_dir.glob("*_train.json")):
        try:
            found = json.loads(path.read_text(encoding="utf-8")).get(TRAINED_ON)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(found, dict):
            return found
    return None


def roles_fitted_on(resolved: ResolvedExperiment, sampled: Sequence[Instance]) -> list[RoleFit]:
    """Each checked role whose model's adapter records that it was fitted on any of `sampled`
    (by id, or by a blurred or fused query); roles without an adapter or a record pass."""
    found = []
    for role in CHECKED_ROLES:
        if role not in resolved.experiment.roles:
            continue
        model = resolved.model_for(role)
        try:
            adapter = model.resolved_adapter()
        except ConfigError:
            continue  # a missing adapter is the run's error to report, not this check's
        trained = _record(Path(adapter)) if adapter else None
        if trained is None:
            continue
        ids, queries = set(trained.get("ids", [])), set(trained.get("queries", []))
        shared = sum(
            i.id in ids or bool({_digest(i.blurred_query), _digest(i.fused_query)} & queries)
            for i in sampled
        )
        if shared:
            source = str(trained.get("source", "?"))
            found.append(RoleFit(role, model.name, source, shared, len(sampled)))
    return found
