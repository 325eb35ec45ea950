"""Which key starts next: the longest expected chain first, so that a run ends together.

Where keys queue for slots (a sweep's shard holds thousands of keys for tens of slots), keys
started in the dataset's order leave the last instances' long chains (clarify@3: three
Clarifier and User Answerer turns, a rewrite, the search, the judge) for last, and the run ends
with a few of them running and the server nearly idle. Started longest first, the long chains
run while short keys fill the slots around them. Where every key starts at once (a 60-key
pilot at 32 slots: bench/RESULTS.md) the order changes nothing.

Keys are ranked by group: every clarify@k of a run is one group (`clarify`), since the
clarify@k keys of an instance and seed share one dialogue and start together, in the dataset's
order (clarify@1 first), so that each turn is still charged to the first key that takes it
(clarify@1 turn 1, cts/eval/run/usage.py); blurred and oracle are a group each. A group's expected
cost is the mean seconds of its keys this run (or the run it resumes) has finished, and before
any has, a prior from the protocol (a clarify@k key makes k clarifier and k User Answerer calls
and a rewrite before the search every key makes) in the seconds per prior unit the measured
groups took."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from cts.eval.data.schema import Record
from cts.eval.run.pipeline import clarify_turns

#: A key's prior cost in searches: one search run (and its judge call) per key, plus this much
#: per clarifying turn (a question, an answer, and its share of the rewrite).
TURN_COST = 0.5
#: The clarify group's prior: its longest chain, clarify@3 (the protocol's k).
CLARIFY_PRIOR = 1.0 + TURN_COST * 3
CLARIFY = "clarify"


def group_of(condition: str) -> str:
    return CLARIFY if clarify_turns(condition) is not None else condition


def prior_cost(group: str) -> float:
    return CLARIFY_PRIOR if group == CLARIFY else 1.0


class KeyCosts:
    """Expected seconds of a key by group, from the run's own finished keys."""

    def __init__(self, finished: Iterable[Record] = ()) -> None:
        self._seconds: dict[str, float] = defaultdict(float)
        self._count: dict[str, int] = defaultdict(int)
        for record in finished:
            self.observe(record)

    def observe(self, record: Record) -> None:
        """Count a finished key's time (a failed one stopped early: it says nothing)."""
        if record.error is None and record.seconds > 0:
            group = group_of(record.condition)
            self._seconds[group] += record.seconds
            self._count[group] += 1

    def expected(self, group: str) -> float:
        """The mean of the group's measured keys; else its prior, in the seconds per prior
        unit the measured groups took (1 while none is measured)."""
        if self._count[group]:
            return self._seconds[group] / self._count[group]
        measured = [g for g, n in self._count.items() if n]
        units = sum(prior_cost(g) * self._count[g] for g in measured)
        scale = sum(self._seconds[g] for g in measured) / units if units else 1.0
        return prior_cost(group) * scale
