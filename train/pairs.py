"""From scored samples to training data: DPO preference pairs or SFT examples.

Pure functions over `Record`s (collect → rank → pairs/examples → rows), plus the file reading and
writing around them. What a row trains on is exactly what the clarifier is asked and answers at
evaluation time: the prompt is `agents.clarifier.messages` for turn 1, the completion the JSON
its constrained output produces. A question's score is its clarify@1 restore score; the same
question sampled under several seeds (whitespace aside) is one candidate with the mean score,
since the search and judge after it are noisy too.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any

from agents import clarifier
from eval.dataset import load_instances
from eval.run_dir import RunDir
from eval.runner import RecordFileError, counts_over, parse_records
from eval.schema import Instance, Record
from train.config import TrainConfig

SCORE = "restore_score_100"
CONDITION = "clarify@1"


class PairsError(ValueError):
    """Samples that cannot be turned into training data (the message says where and why)."""


@dataclass(frozen=True)
class Candidate:
    """One distinct question of an instance with the mean restore score of its samples."""

    question: str
    score: float
    seeds: tuple[int, ...]

    @property
    def samples(self) -> int:
        return len(self.seeds)


@dataclass
class Collected:
    #: Instance id → its distinct questions, in the order of their first seed.
    candidates: dict[str, list[Candidate]] = field(default_factory=dict)
    #: Records used as samples.
    used: int = 0
    #: Why the other records were left out (error:<kind>, no_scores, no_question, ...).
    skipped: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class Pair:
    instance_id: str
    chosen: Candidate
    rejected: Candidate

    @property
    def margin(self) -> float:
        return self.chosen.score - self.rejected.score


@dataclass(frozen=True)
class Example:
    instance_id: str
    best: Candidate
    #: The mean score of all the instance's samples (what the clarifier gets on average).
    mean_score: float


def normalise(question: str) -> str:
    return " ".join(question.split())


def collect(records: Iterable[Record], known_ids: set[str] | None = None) -> Collected:
    """Usable samples grouped by instance; every other record is counted with its reason."""
    out = Collected()
    scores: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for record in sorted(records, key=lambda r: (r.instance_id, r.seed)):
        reason = _unusable(record, known_ids)
        if reason:
            out.skipped[reason] += 1
            continue
        question = normalise(record.questions[0])
        by_question = scores.setdefault(record.instance_id, {})
        by_question.setdefault(question, []).append((record.seed, record.scores[SCORE]))
        out.used += 1
    for instance_id, by_question in scores.items():
        out.candidates[instance_id] = [
            Candidate(q, mean(s for _, s in samples), tuple(seed for seed, _ in samples))
            for q, samples in by_question.items()
        ]
    return out


def _unusable(record: Record, known_ids: set[str] | None) -> str | None:
    if record.condition != CONDITION:
        return "other_condition"
    if record.error:
        return f"error:{record.error.get('kind', 'unknown')}"
    if not record.questions or not normalise(record.questions[0]):
        return "no_question"
    if SCORE not in record.scores:
        return "no_scores"  # no golden nuggets to judge against
    if known_ids is not None and record.instance_id not in known_ids:
        return "unknown_instance"
    return None


def best(candidates: list[Candidate]) -> Candidate:
    """Highest score; among equals the one with more samples (a steadier mean), then the
    earliest seed, so the choice never depends on file order."""
    return min(candidates, key=lambda c: (-c.score, -c.samples, c.seeds[0]))


def worst(candidates: list[Candidate]) -> Candidate:
    return min(candidates, key=lambda c: (c.score, -c.samples, c.seeds[0]))


def dpo_pairs(
    candidates: dict[str, list[Candidate]], min_margin: float, pairing: str = "best_worst"
) -> list[Pair]:
    """best_worst: the best against the worst question of each instance; best_vs_rest: the
    best against every other question. Only pairs at least `min_margin` apart and never equal
    (a tie is no preference, even with min_margin 0)."""
    pairs: list[Pair] = []
    for instance_id, found in candidates.items():
        if len(found) < 2:
            continue
        top = best(found)
        others = (
            [worst(found)]
            if pairing == "best_worst"
            else sorted((c for c in found if c is not top), key=lambda c: c.seeds[0])
        )
        for other in others:
            pair = Pair(instance_id, top, other)
            if pair.margin > 0 and pair.margin >= min_margin:
                pairs.append(pair)
    return pairs


def sft_examples(
    candidates: dict[str, list[Candidate]], min_score: float = 0.0, above_mean: bool = False
) -> list[Example]:
    """Each instance's best question when it scored above `min_score` (by default: its search
    restored something) and, with `above_mean`, beat the instance's mean score."""
    examples = []
    for instance_id, found in candidates.items():
        top = best(found)
        average = sum(c.score * c.samples for c in found) / sum(c.samples for c in found)
        if top.score > min_score and (not above_mean or top.score > average):
            examples.append(Example(instance_id, top, average))
    return examples


# -- rows in TRL's conversational formats ---------------------------------------------------------


def prompt_messages(instance: Instance) -> list[dict[str, str]]:
    """The clarifier's first-turn messages, from the same function `clarifier.ask` uses."""
    messages = clarifier.messages(instance.blurred_query, [], instance.language)
    return [m.model_dump() for m in messages]


def completion(question: str) -> list[dict[str, str]]:
    """The assistant turn: the JSON the clarifier's constrained output gives for a question."""
    return [
        {"role": "assistant", "content": json.dumps({"question": question}, ensure_ascii=False)}
    ]


def dpo_row(pair: Pair, instance: Instance) -> dict[str, Any]:
    return {
        "instance_id": pair.instance_id,
        "prompt": prompt_messages(instance),
        "chosen": completion(pair.chosen.question),
        "rejected": completion(pair.rejected.question),
        "chosen_score": pair.chosen.score,
        "rejected_score": pair.rejected.score,
        "margin": pair.margin,
    }


def sft_row(example: Example, instance: Instance) -> dict[str, Any]:
    return {
        "instance_id": example.instance_id,
        "messages": prompt_messages(instance) + completion(example.best.question),
        "score": example.best.score,
        "mean_score": example.mean_score,
    }


def stats(
    collected: Collected,
    rows: list[dict[str, Any]],
    method: str,
    min_margin: float,
    read_skipped: Counter[str] | None = None,
) -> dict[str, Any]:
    """What pairs_stats.json holds; also the explanation when there is no training data."""
    groups = list(collected.candidates.values())
    spread = [max(c.score for c in g) - min(c.score for c in g) for g in groups if len(g) > 1]
    margins = [r["margin"] for r in rows if "margin" in r]
    skipped = Counter(read_skipped or {}) + collected.skipped
    return {
        "method": method,
        "instances": len(groups),
        "candidates": collected.used,
        "distinct_questions": sum(len(g) for g in groups),
        # Why instances give no pair: one question only, all scored equal, or too close.
        "single_question": sum(len(g) == 1 for g in groups),
        "all_equal": sum(s == 0 for s in spread),
        "below_margin": sum(0 < s < min_margin for s in spread),
        "mean_score": round(mean(c.score for g in groups for c in g), 3) if groups else None,
        "pairs" if method == "dpo" else "examples": len(rows),
        "mean_margin": round(mean(margins), 3) if margins else None,
        "skipped": dict(sorted(skipped.items())),
    }


def no_data_message(summary: dict[str, Any], config: TrainConfig) -> str:
    """Why there is nothing to train on, in numbers, with the knob to turn."""
    if config.method == "dpo":
        return (
            f"no preference pairs: of {summary['instances']} instance(s), {summary['all_equal']} "
            f"had all candidates scoring equal, {summary['single_question']} got one distinct "
            f"question only and {summary['below_margin']} differed by less than "
            f"min_margin={config.min_margin:g}; min_margin may be too high (or sample more "
            "candidates, at a higher temperature)"
        )
    rule = f"score above sft_min_score={config.sft_min_score:g}" + (
        " and above the instance's mean" if config.sft_above_mean else ""
    )
    return (
        f"no SFT examples: no best question of {summary['instances']} instance(s) had a {rule}; "
        f"{summary['all_equal']} instance(s) had all candidates scoring equal"
    )


# -- files ----------------------------------------------------------------------------------------


def read_records(samples_dir: Path) -> tuple[list[Record], Counter[str]]:
    """The sampling run's records (shard files, or merged files when only those exist), one per
    key, without modifying them (a shard may still be writing). A complete line that is not a
    record is an error naming file:line; an unfinished last line is skipped and counted."""
    root = samples_dir / "records"
    files = sorted(root.glob("*/shard-*.jsonl")) or sorted(root.glob("*/merged.jsonl"))
    if not files:
        raise PairsError(f"{root}: no records; run `cts train sample` first")
    records: dict[tuple[str, str, int], Record] = {}
    skipped: Counter[str] = Counter()
    for path in files:
        data = path.read_bytes()
        try:
            found, complete = parse_records(path, data)
        except RecordFileError as e:
            raise PairsError(str(e)) from None
        if complete < len(data):
            skipped["unfinished_line"] += 1
        for record in found:
            # A retried failure (--retry-failed) has two lines; the success counts.
            records[record.key] = counts_over(records.get(record.key), record)
    return list(records.values()), skipped


def sampled_instances(samples_dir: Path) -> dict[str, Instance]:
    """The instances the sampling run read (its recorded config names the dataset)."""
    run = RunDir(samples_dir)
    if not run.config.is_file():
        raise PairsError(f"{run.config}: not found; run `cts train sample` first")
    return {i.id: i for i in load_instances(run.read_config().experiment.dataset)}


@dataclass
class PairsResult:
    path: Path
    stats_path: Path
    rows: list[dict[str, Any]]
    stats: dict[str, Any]


def build_pairs(config: TrainConfig) -> PairsResult:
    """Read the samples, write the training data (pairs.jsonl or sft.jsonl) and
    pairs_stats.json. Files are written even when there are no rows, so the stats say why."""
    samples = config.samples_dir()
    records, read_skipped = read_records(samples)
    instances = sampled_instances(samples)
    collected = collect(records, set(instances))
    rows: list[dict[str, Any]]
    if config.method == "dpo":
        pairs = dpo_pairs(collected.candidates, config.min_margin, config.pairing)
        rows = [dpo_row(p, instances[p.instance_id]) for p in pairs]
    else:
        examples = sft_examples(collected.candidates, config.sft_min_score, config.sft_above_mean)
        rows = [sft_row(e, instances[e.instance_id]) for e in examples]
    summary = stats(collected, rows, config.method, config.min_margin, read_skipped)
    summary["samples_dir"] = str(samples)
    path = config.data_file()
    _write(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    stats_path = path.parent / "pairs_stats.json"
    _write(stats_path, json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    return PairsResult(path, stats_path, rows, summary)


def read_rows(path: Path, method: str) -> list[dict[str, Any]]:
    """Training rows back from pairs.jsonl / sft.jsonl; a bad line is an error naming
    file:line (the files are meant to be inspected and filtered by hand)."""
    if not path.is_file():
        raise PairsError(f"{path}: not found; run `cts train pairs` first")
    needed = ("prompt", "chosen", "rejected") if method == "dpo" else ("messages",)
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise PairsError(f"{path}:{n}: malformed JSON: {e.msg}") from None
            missing = [k for k in needed if not isinstance(row, dict) or k not in row]
            if missing:
                raise PairsError(f"{path}:{n}: missing {', '.join(missing)} ({method} row)")
            if not all(_is_messages(row[k]) for k in needed):
                raise PairsError(f"{path}:{n}: {', '.join(needed)} must be lists of messages")
            rows.append(row)
    return rows


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in value
    )


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)
