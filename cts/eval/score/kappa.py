"""Agreement statistics between two labellings of the same items: Cohen's κ (over the three
labels, and strict: full vs the rest), the confusion matrix, and Kendall's τ-b between two
rankings, and a rate (count of n). Pure functions, each tested against a hand computation."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

LABELS: tuple[str, ...] = ("full", "partial", "none")
#: Strict agreement: a partial label counts as no credit, as the strict score does.
STRICT_LABELS: tuple[str, ...] = ("full", "rest")
# κ is undefined when chance agreement is (within float noise) certain.
_EPS = 1e-12


def strict(label: str) -> str:
    return "full" if label == "full" else "rest"


# -- statistics on small tables -----------------------------------------------------------------


@dataclass(frozen=True)
class Kappa:
    """Cohen's κ = (p_o − p_e) / (1 − p_e) over n paired labels. `kappa` is None when p_e = 1
    (both judgements gave one and the same label throughout: agreement beyond chance is
    undefined); every field is None when n = 0."""

    kappa: float | None
    #: p_o, the share of equal labels.
    observed: float | None
    #: p_e, the agreement the two judgements' label rates give by chance.
    expected: float | None
    n: int


def cohen_kappa(pairs: Sequence[tuple[str, str]], labels: Sequence[str] = LABELS) -> Kappa:
    n = len(pairs)
    unknown = {x for pair in pairs for x in pair} - set(labels)
    if unknown:
        raise ValueError(f"labels {sorted(unknown)} are not among {list(labels)}")
    if n == 0:
        return Kappa(None, None, None, 0)
    observed = sum(a == b for a, b in pairs) / n
    first, second = Counter(a for a, _ in pairs), Counter(b for _, b in pairs)
    expected = sum(first[label] * second[label] for label in labels) / (n * n)
    if 1 - expected <= _EPS:
        return Kappa(None, observed, expected, n)
    return Kappa((observed - expected) / (1 - expected), observed, expected, n)


@dataclass(frozen=True)
class Confusion:
    labels: tuple[str, ...]
    #: counts[i][j]: nuggets the first judgement labelled labels[i] and the second labels[j].
    counts: list[list[int]]
    n: int


def confusion(pairs: Sequence[tuple[str, str]], labels: Sequence[str] = LABELS) -> Confusion:
    index = {label: i for i, label in enumerate(labels)}
    counts = [[0] * len(labels) for _ in labels]
    for a, b in pairs:
        counts[index[a]][index[b]] += 1
    return Confusion(tuple(labels), counts, len(pairs))


@dataclass(frozen=True)
class Tau:
    """Kendall's τ-b between two rankings of the same n items:
    (C − D) / √((P − T_a)(P − T_b)), P = n(n−1)/2 pairs, C concordant, D discordant, T_a and T_b
    the pairs tied in each ranking. None when either ranking ties every pair (or n < 2)."""

    tau: float | None
    concordant: int
    discordant: int
    ties_first: int
    ties_second: int
    n: int


def kendall_tau(first: Sequence[float], second: Sequence[float]) -> Tau:
    if len(first) != len(second):
        raise ValueError("the two rankings must score the same items")
    n = len(first)
    concordant = discordant = ties_first = ties_second = 0
    for i in range(n):
        for j in range(i + 1, n):
            da, db = first[i] - first[j], second[i] - second[j]
            ties_first += da == 0
            ties_second += db == 0
            if da * db > 0:
                concordant += 1
            elif da * db < 0:
                discordant += 1
    pairs = n * (n - 1) // 2
    denominator = math.sqrt((pairs - ties_first) * (pairs - ties_second))
    tau = (concordant - discordant) / denominator if denominator > 0 else None
    return Tau(tau, concordant, discordant, ties_first, ties_second, n)


@dataclass(frozen=True)
class Rate:
    """`count` of `n` rows (labels that changed between two passes, answers that matched)."""

    n: int
    count: int

    @property
    def share(self) -> float | None:
        return self.count / self.n if self.n else None

    def as_dict(self, count: str = "count") -> dict[str, Any]:
        """{n, <count>, share}: `count` names the counted rows in a file."""
        return {"n": self.n, count: self.count, "share": self.share}
