"""What a run's report stands on: the keys its config.yaml names.

A run may be resumed with fewer instances (`dataset.limit`), seeds or conditions: its records
are never deleted (widening again re-uses them), but config.yaml then names fewer keys than the
records directory holds. The report stands on what config.yaml names — the same keys `cts run`
counts as done and `cts merge` checks — so that its n, its pairing and every diagnostic agree
with the run's own account; the records outside are left out and counted, never silently. The
other choice, refusing the narrowing, would force a fresh run directory (and every model call
again) on a user who only wants the report of a part, e.g. two seeds of three."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from cts.eval.data.schema import Record


@dataclass
class Scoped:
    """The records config.yaml names, and how many it does not, by why."""

    records: list[Record]
    #: Records of a condition no longer configured, per condition.
    conditions: Counter[str] = field(default_factory=Counter)
    #: Records of a configured condition under a seed no longer configured, per seed.
    seeds: Counter[int] = field(default_factory=Counter)
    #: Records of configured conditions and seeds for instances beyond `dataset.limit`.
    instances: int = 0
    #: False when the dataset did not load, so instances could not be checked.
    instances_checked: bool = True

    @property
    def ignored(self) -> int:
        return sum(self.conditions.values()) + sum(self.seeds.values()) + self.instances

    def as_dict(self) -> dict[str, Any]:
        return {
            "total": self.ignored,
            "by_condition": dict(sorted(self.conditions.items())),
            "by_seed": {str(s): n for s, n in sorted(self.seeds.items())},
            "beyond_limit": self.instances,
            "instances_checked": self.instances_checked,
        }


def outside_because(
    record: Record, conditions: Collection[str], seeds: Collection[int], beyond: Collection[str]
) -> str | None:
    """Why config.yaml does not name `record`'s key, the first of its condition, its seed, its
    instance past `dataset.limit` (in `beyond`); None when it does."""
    if record.condition not in conditions:
        return f"condition {record.condition} is not in its conditions"
    if record.seed not in seeds:
        return f"seed {record.seed} is not in its seeds"
    if record.instance_id in beyond:
        return "its instance is beyond dataset.limit"
    return None


def in_scope(
    records: Iterable[Record],
    conditions: Collection[str],
    seeds: Collection[int],
    beyond_limit: Collection[str] | None,
) -> Scoped:
    """The records of the configured `conditions` and `seeds`, less those of the instances
    `beyond_limit` (the dataset's instances past `dataset.limit`; None: the dataset did not
    load, and instances are not checked). A record outside is counted once, under the first of
    condition, seed, instance that leaves it out (`outside_because`). Only a limit can leave
    instances out: a resume with an edited dataset is refused (cts/eval/run/fingerprint.py)."""
    scoped = Scoped([], instances_checked=beyond_limit is not None)
    beyond = set(beyond_limit or ())
    for record in records:
        if outside_because(record, conditions, seeds, beyond) is None:
            scoped.records.append(record)
        elif record.condition not in conditions:
            scoped.conditions[record.condition] += 1
        elif record.seed not in seeds:
            scoped.seeds[record.seed] += 1
        else:
            scoped.instances += 1
    return scoped


def ignored_note(name: str, ignored: dict[str, Any] | None) -> str | None:
    """The report's line for records left out because config.yaml no longer names them."""
    if not ignored:
        return None
    parts = [f"condition {c}: {n}" for c, n in ignored["by_condition"].items()]
    parts += [f"seed {s}: {n}" for s, n in ignored["by_seed"].items()]
    if ignored["beyond_limit"]:
        parts.append(f"instances beyond dataset.limit: {ignored['beyond_limit']}")
    unchecked = (
        ""
        if ignored["instances_checked"]
        else " The dataset did not load: records of instances beyond dataset.limit could not "
        "be told apart."
    )
    if not parts:
        return f"NOTE {name}:{unchecked}" if unchecked else None
    return (
        f"NOTE {name}: {ignored['total']} stored record(s) are outside what config.yaml names "
        f"and are ignored here ({'; '.join(parts)}): the run was resumed with fewer instances, "
        f"seeds or conditions; widen it again to use them.{unchecked}"
    )
