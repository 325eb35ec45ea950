"""The instances `cts estimate` pilots: a seeded sample stratified by language, then by
removed-constraint type within each language.

The first N instances of a dataset are whatever its file puts first (the sample dev split's
first five are all English, while 4 of its 24 are Chinese), and cost follows language and query
kind (a Chinese query tokenises otherwise, a time constraint asks other questions). So the
pilot's N are allocated to the languages in proportion to their instances, then each
language's share to its removed-constraint types (an instance's sorted types, `region+time`,
form one type; none: `none`), each by largest remainder — ties to the larger stratum, then in
an order drawn from the seed — and the instances of each stratum are drawn with the seed. The
same dataset, N and seed give the same pilot."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from math import floor
from pathlib import Path
from typing import Any, TypeVar

from cts.eval.data.dataset import load_instances
from cts.eval.data.schema import Instance
from cts.eval.run.config import ResolvedExperiment, load_experiment
from cts.eval.run.run_dir import RunDir
from cts.foundation.disk import write_whole
from cts.foundation.yaml_config import Override

T = TypeVar("T")


def constraint_stratum(instance: Instance) -> str:
    return "+".join(sorted(instance.removed_constraints)) or "none"


def allocate(sizes: dict[str, int], n: int, rng: random.Random) -> dict[str, int]:
    """`n` over strata of `sizes` in proportion (largest remainder; ties: the larger stratum,
    then the order `rng` draws), never more than a stratum holds."""
    total = sum(sizes.values())
    quotas = {s: n * size / total for s, size in sizes.items()}
    given = {s: min(sizes[s], floor(q)) for s, q in quotas.items()}
    tiebreak = {s: rng.random() for s in sorted(sizes)}
    order = sorted(sizes, key=lambda s: (-(quotas[s] - floor(quotas[s])), -sizes[s], tiebreak[s]))
    left = n - sum(given.values())
    while left > 0:
        open_strata = [s for s in order if given[s] < sizes[s]]
        if not open_strata:
            break
        for s in open_strata[:left]:
            given[s] += 1
        left = n - sum(given.values())
    return given


@dataclass
class PilotDraw:
    """The pilot's instances (in dataset order) and how they were drawn."""

    instances: list[Instance]
    of: int
    seed: int
    #: language → removed-constraint stratum → instances drawn.
    strata: dict[str, dict[str, int]] = field(default_factory=dict)

    def describe(self) -> str:
        if len(self.instances) == self.of:
            return f"all {self.of} instances of the sweep"
        parts = [
            f"{language} {sum(kinds.values())} ("
            + ", ".join(f"{kind} {k}" for kind, k in kinds.items() if k)
            + ")"
            for language, kinds in self.strata.items()
            if sum(kinds.values())
        ]
        return (
            f"{len(self.instances)} of the sweep's {self.of} instances, a sample stratified by "
            f"language, then removed-constraint type, drawn with seed {self.seed} "
            f"(proportional allocation, largest remainder): {'; '.join(parts)}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "drawn": len(self.instances),
            "of": self.of,
            "seed": self.seed,
            "strata": self.strata,
            "ids": [i.id for i in self.instances],
            "how": self.describe(),
        }


def _groups(items: Sequence[T], key: Any) -> dict[str, list[T]]:
    found: dict[str, list[T]] = {}
    for item in items:
        found.setdefault(key(item), []).append(item)
    return dict(sorted(found.items()))


def draw_pilot(instances: Sequence[Instance], n: int, seed: int) -> PilotDraw:
    """`n` of `instances` (all of them when n reaches their number), stratified and seeded as
    the module says."""
    if n >= len(instances):
        return PilotDraw(list(instances), len(instances), seed)
    rng = random.Random(f"pilot:{seed}")
    languages = _groups(instances, lambda i: i.language)
    per_language = allocate({k: len(v) for k, v in languages.items()}, n, rng)
    chosen: set[str] = set()
    strata: dict[str, dict[str, int]] = {}
    for language, members in languages.items():
        kinds = _groups(members, constraint_stratum)
        per_kind = allocate({k: len(v) for k, v in kinds.items()}, per_language[language], rng)
        strata[language] = per_kind
        for kind, k in per_kind.items():
            chosen.update(i.id for i in rng.sample(kinds[kind], k))
    drawn = [i for i in instances if i.id in chosen]
    return PilotDraw(drawn, len(instances), seed, strata)


#: In a pilot's directory: the drawn instances (its config's dataset) and how they were drawn.
PILOT_DATASET = "pilot.jsonl"
PILOT_DRAW = "pilot.json"


def write_pilot(sweep: ResolvedExperiment, n: int, seed: int, root: Path) -> PilotDraw:
    """Draw the pilot of `sweep` (its instances, `dataset.limit` included) into
    root/pilot.jsonl, a dataset of its own, as loaded (field maps and gold table applied), and
    say how in root/pilot.json. The same sweep, n and seed write the same files, so a pilot
    run again resumes."""
    draw = draw_pilot(load_instances(sweep.experiment.dataset), n, seed)
    rows = "".join(
        json.dumps(i.model_dump(mode="json"), ensure_ascii=False) + "\n" for i in draw.instances
    )
    write_whole(root / PILOT_DATASET, rows)
    write_whole(root / PILOT_DRAW, json.dumps(draw.as_dict(), indent=1, ensure_ascii=False))
    return draw


def default_pilot_dir(sweep: ResolvedExperiment) -> Path:
    """Inside the sweep's run directory, so that one pilot serves every later estimate; not
    beside it, where `cts report runs/<name>-*` would take it for a system."""
    return sweep.output_dir() / "estimate-pilot"


def pilot_overrides(sweep: ResolvedExperiment, root: Path) -> list[Override]:
    """The sweep's experiment on the pilot's drawn instances (root/pilot.jsonl, written by
    `write_pilot`), with caches of the pilot's own: a shared cache would answer earlier runs'
    calls, and those would count as no work. A replay-only tool cache (`search.offline`) is
    kept: it is the only source of tool results."""
    drawn = {"path": str(root.absolute() / PILOT_DATASET), "split": None}
    drawn["corpus"] = sweep.experiment.dataset.corpus
    overrides = [
        Override(("dataset",), drawn, "--pilot"),
        Override(("cache", "path"), str(RunDir(root.absolute()).own_cache), "--pilot"),
    ]
    if not sweep.experiment.search.offline:
        tools = root.absolute() / "cache" / "tools.sqlite"
        overrides.append(Override(("search", "tool_cache"), str(tools), "--pilot"))
    return overrides


def pilot_experiment(
    sweep: ResolvedExperiment,
    config: str | Path | None,
    overrides: Sequence[str],
    n: int,
    seed: int,
    root: Path,
) -> tuple[ResolvedExperiment, PilotDraw]:
    """The pilot of `sweep` (read from `config` with `overrides`): `n` instances drawn with
    `seed` into `root` (`write_pilot`), and the experiment that runs them there."""
    drawn = write_pilot(sweep, n, seed, root)
    return load_experiment(config, [*overrides, *pilot_overrides(sweep, root)]), drawn


def read_draw(run_dir: Path) -> str | None:
    """How a pilot directory's instances were drawn; None for a run that was not drawn."""
    try:
        found = json.loads((run_dir / PILOT_DRAW).read_text())
    except (OSError, ValueError):
        return None
    return str(found.get("how")) if isinstance(found, dict) and found.get("how") else None
