"""From scored samples to training data: DPO preference pairs or SFT examples.

Pure functions over `Record`s (collect → rank → pairs/examples → rows), plus the file reading and
writing around them. What a row trains on is exactly what the clarifier is asked and answers at
evaluation time: the prompt is `cts.agents.clarifier.messages` at that turn (the blurred query and
the dialogue so far), the completion the JSON its constrained output produces.

A sampled dialogue earns a reward (cts/train/config.py `RewardSettings`): its restore gain over the
instance's blurred score, less a price per question and per `unknown` answer. Every turn's
action (the question asked there, or with `allow_stop` the stop) is credited with the mean
reward of the sampled dialogues that took it from the same state (the same earlier questions
and answers), whatever they did after: a question is worth what it leads to, several turns on.
Actions of one state are compared with each other; the same question sampled under several
seeds (whitespace aside) is one candidate, since the search and judge after it are noisy too.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any

from cts.agents import clarifier
from cts.agents.types import QA, UNKNOWN
from cts.eval.data.dataset import load_instances
from cts.eval.data.schema import Instance, Record
from cts.eval.run.records import RecordFileError, counts_over, parse_records
from cts.eval.run.run_dir import RunDir
from cts.eval.score.metrics import SCORE
from cts.foundation.disk import write_whole
from cts.train.config import RewardSettings, TrainConfig
from cts.train.sample import dialogue_condition
from cts.train.signal import kept_questions, spread_figures

CONDITION = "clarify@1"
BASELINE = "blurred"
#: A state: the earlier turns, questions normalised (what makes two dialogues the same so far).
State = tuple[tuple[str, str], ...]
#: Rewards this close are equal. Scores are float sums and means of nugget weights (100/3 is
#: stored rounded), so rewards equal in exact arithmetic differ by 1e-15 or so; a restore-score
#: point is 1e9 times this, so no real difference is ever taken for a tie.
TIE = 1e-9


class PairsError(ValueError):
    """Samples that cannot be turned into training data (the message says where and why)."""


@dataclass(frozen=True)
class Reward:
    """What one sampled dialogue earned, in restore-score points."""

    score: float
    #: The instance's mean blurred score (0 without a baseline).
    baseline: float
    question_cost: float
    unknown_cost: float

    @property
    def gain(self) -> float:
        return self.score - self.baseline

    @property
    def value(self) -> float:
        return self.gain - self.question_cost - self.unknown_cost


def reward_of(record: Record, baseline: float, settings: RewardSettings) -> Reward:
    """A scored dialogue's reward: its score over `baseline`, less the price of its questions
    and of its `unknown` answers."""
    return Reward(
        record.scores[SCORE],
        baseline,
        settings.question_cost * len(record.questions),
        settings.unknown_cost * sum(a == UNKNOWN for a in record.answers),
    )


@dataclass(frozen=True)
class Candidate:
    """One distinct action of an instance at one state: the question asked at turn
    `len(history) + 1`, or (`stop`) the clarifier stopping there. Score, reward and its parts
    are means over the sampled dialogues that took it."""

    question: str
    score: float
    seeds: tuple[int, ...]
    reward: float = 0.0
    #: The turns before it as the clarifier saw them (from the first dialogue that took it).
    history: tuple[QA, ...] = ()
    stop: bool = False
    #: Mean baseline, gain, question_cost and unknown_cost of its dialogues.
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def samples(self) -> int:
        return len(self.seeds)

    @property
    def turn(self) -> int:
        return len(self.history) + 1

    @property
    def state(self) -> State:
        return state_of(self.history)


@dataclass
class Collected:
    #: Instance id → its candidates at every state, by turn, then in the order of first seed.
    candidates: dict[str, list[Candidate]] = field(default_factory=dict)
    #: Dialogue records used as samples.
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
        return self.chosen.reward - self.rejected.reward


@dataclass(frozen=True)
class Example:
    instance_id: str
    best: Candidate
    #: The mean reward of all the state's samples (what the clarifier gets there on average).
    mean_reward: float


def normalise(question: str) -> str:
    return " ".join(question.split())


def state_of(history: Iterable[QA]) -> State:
    """The state a history leads to: two dialogues are in the same one when their earlier
    questions (whitespace aside) and answers are the same."""
    return tuple((normalise(t.question), t.answer) for t in history)


def states(found: list[Candidate]) -> list[list[Candidate]]:
    """An instance's candidates grouped by state (the actions compared with each other)."""
    groups: dict[State, list[Candidate]] = {}
    for candidate in found:
        groups.setdefault(candidate.state, []).append(candidate)
    return list(groups.values())


#: A dialogue that took an action: its record, reward, the turns before, the question written.
Took = tuple[Record, Reward, tuple[QA, ...], str]


def collect(
    records: Iterable[Record],
    known_ids: set[str] | None = None,
    reward: RewardSettings | None = None,
    condition: str = CONDITION,
) -> Collected:
    """Usable dialogues credited to every action they took; every other record is counted
    with its reason. Without `reward`, a dialogue's reward is its restore score."""
    settings = reward or RewardSettings(baseline="none")
    out = Collected()
    blurred: dict[str, list[float]] = {}
    dialogues: list[Record] = []
    for record in sorted(records, key=lambda r: (r.instance_id, r.seed)):
        if record.condition == BASELINE and settings.baseline == BASELINE:
            reason = _unscored(record, known_ids)
            if reason:
                out.skipped[f"blurred:{reason}"] += 1
            else:
                blurred.setdefault(record.instance_id, []).append(record.scores[SCORE])
            continue
        reason = _unusable(record, known_ids, condition)
        if reason:
            out.skipped[reason] += 1
        else:
            dialogues.append(record)
    taken: dict[str, dict[tuple[State, str, bool], list[Took]]] = {}
    for record in dialogues:
        if settings.baseline == BASELINE and record.instance_id not in blurred:
            out.skipped["no_blurred_score"] += 1
            continue
        baseline = mean(blurred[record.instance_id]) if settings.baseline == BASELINE else 0.0
        earned = reward_of(record, baseline, settings)
        out.used += 1
        asked = zip(record.questions, record.answers, strict=True)
        history = tuple(QA(question=q, answer=a) for q, a in asked)
        actions = [(history[:t], q, False) for t, q in enumerate(record.questions)]
        if record.stopped_early:
            actions.append((history, record.stop_question, True))
        by_action = taken.setdefault(record.instance_id, {})
        for before, question, stop in actions:
            state = state_of(before)
            # Every stop of a state is one action, whatever question was written beside it.
            key = (state, "" if stop else normalise(question), stop)
            by_action.setdefault(key, []).append((record, earned, before, normalise(question)))
    for instance_id, by_action in taken.items():
        found = [_candidate(key[2], took) for key, took in by_action.items()]
        out.candidates[instance_id] = sorted(found, key=lambda c: (c.turn, c.seeds[0]))
    return out


def _candidate(stop: bool, took: list[Took]) -> Candidate:
    """The action the dialogues in `took` (record, reward, turns before, question) took;
    its text is the first dialogue's. Its reward is made of its mean score and costs (equal to
    the mean of the dialogues' rewards), so that two actions of one mean score and costs get
    the very same reward, and the parts written beside it add up to it."""
    rewards = [r for _, r, _, _ in took]
    mean_reward = Reward(
        mean(r.score for r in rewards),
        mean(r.baseline for r in rewards),
        mean(r.question_cost for r in rewards),
        mean(r.unknown_cost for r in rewards),
    )
    return Candidate(
        question=took[0][3],
        score=mean_reward.score,
        seeds=tuple(record.seed for record, _, _, _ in took),
        reward=mean_reward.value,
        history=took[0][2],
        stop=stop,
        parts={
            "baseline": mean_reward.baseline,
            "gain": mean_reward.gain,
            "question_cost": mean_reward.question_cost,
            "unknown_cost": mean_reward.unknown_cost,
        },
    )


def _unscored(record: Record, known_ids: set[str] | None) -> str | None:
    if record.error:
        return f"error:{record.error.get('kind', 'unknown')}"
    if SCORE not in record.scores:
        return "no_scores"  # no golden nuggets to judge against
    if known_ids is not None and record.instance_id not in known_ids:
        return "unknown_instance"
    return None


def _unusable(record: Record, known_ids: set[str] | None, condition: str) -> str | None:
    if record.condition != condition:
        return "other_condition"
    if record.error:
        return f"error:{record.error.get('kind', 'unknown')}"
    asked = [normalise(q) for q in record.questions]
    if not record.stopped_early and (not asked or not all(asked)):
        return "no_question"
    if len(record.answers) != len(asked):
        return "unanswered_question"
    return _unscored(record, known_ids)


def _steadiest(candidates: list[Candidate]) -> Candidate:
    """Of equally rewarded candidates, the one with more samples (a steadier mean), then the
    earliest seed, so the choice never depends on file order nor on float noise."""
    return min(candidates, key=lambda c: (-c.samples, c.seeds[0]))


def best(candidates: list[Candidate]) -> Candidate:
    """Highest reward (within TIE of it: equal); among equals `_steadiest`."""
    top = max(c.reward for c in candidates)
    return _steadiest([c for c in candidates if c.reward >= top - TIE])


def worst(candidates: list[Candidate]) -> Candidate:
    """Lowest reward (within TIE of it: equal); among equals `_steadiest`."""
    low = min(c.reward for c in candidates)
    return _steadiest([c for c in candidates if c.reward <= low + TIE])


def preferred(margin: float, min_margin: float) -> bool:
    """Whether rewards `margin` apart make a preference pair: more than TIE apart (a tie is no
    preference, even with min_margin 0) and at least `min_margin` apart, up to TIE (a margin of
    exactly min_margin in exact arithmetic may come out a hair below it)."""
    return margin > TIE and margin >= min_margin - TIE


def dpo_pairs(
    candidates: dict[str, list[Candidate]], min_margin: float, pairing: str = "best_worst"
) -> list[Pair]:
    """Per state, best_worst: the best against the worst action; best_vs_rest: the best
    against every other action. Only pairs at least `min_margin` apart and never equal (a tie
    is no preference, even with min_margin 0)."""
    pairs: list[Pair] = []
    for instance_id, found in candidates.items():
        for group in states(found):
            if len(group) < 2:
                continue
            top = best(group)
            others = (
                [worst(group)]
                if pairing == "best_worst"
                else sorted((c for c in group if c is not top), key=lambda c: c.seeds[0])
            )
            for other in others:
                pair = Pair(instance_id, top, other)
                if preferred(pair.margin, min_margin):
                    pairs.append(pair)
    return pairs


def sft_examples(
    candidates: dict[str, list[Candidate]], min_score: float = 0.0, above_mean: bool = False
) -> list[Example]:
    """Each state's best action when its reward is above `min_score` and, with `above_mean`,
    above the state's mean reward: by more than TIE, as no reward is above one it ties with
    (a state whose actions all tie has nothing to teach above its mean)."""
    examples = []
    for instance_id, found in candidates.items():
        for group in states(found):
            top = best(group)
            average = sum(c.reward * c.samples for c in group) / sum(c.samples for c in group)
            if top.reward > min_score + TIE and (not above_mean or top.reward > average + TIE):
                examples.append(Example(instance_id, top, average))
    return examples


# -- rows in TRL's conversational formats ---------------------------------------------------------


def prompt_messages(instance: Instance, history: Iterable[QA] = ()) -> list[dict[str, str]]:
    """The clarifier's messages at the turn after `history`, from the function `clarifier.ask`
    uses."""
    messages = clarifier.messages(instance.blurred_query, list(history), instance.language)
    return [m.model_dump() for m in messages]


def completion(candidate: Candidate, allow_stop: bool = False) -> list[dict[str, str]]:
    """The assistant turn: the JSON the clarifier's constrained output gives for the action
    (with `allow_stop`, its schema has the `stop` field too)."""
    answer: dict[str, Any] = {"question": candidate.question}
    if allow_stop:
        answer["stop"] = candidate.stop
    return [{"role": "assistant", "content": json.dumps(answer, ensure_ascii=False)}]


def dpo_row(pair: Pair, instance: Instance, allow_stop: bool = False) -> dict[str, Any]:
    return {
        "instance_id": pair.instance_id,
        "turn": pair.chosen.turn,
        "prompt": prompt_messages(instance, pair.chosen.history),
        "chosen": completion(pair.chosen, allow_stop),
        "rejected": completion(pair.rejected, allow_stop),
        "chosen_score": pair.chosen.score,
        "rejected_score": pair.rejected.score,
        "chosen_reward": pair.chosen.reward,
        "rejected_reward": pair.rejected.reward,
        "margin": pair.margin,
    }


def sft_row(example: Example, instance: Instance, allow_stop: bool = False) -> dict[str, Any]:
    top = example.best
    return {
        "instance_id": example.instance_id,
        "turn": top.turn,
        "messages": prompt_messages(instance, top.history) + completion(top, allow_stop),
        "score": top.score,
        "reward": top.reward,
        "mean_reward": example.mean_reward,
    }


def candidate_row(instance_id: str, candidate: Candidate) -> dict[str, Any]:
    """candidates.jsonl: every action with its reward and what the reward is made of."""
    return {
        "instance_id": instance_id,
        "turn": candidate.turn,
        "history": [qa.model_dump() for qa in candidate.history],
        "question": candidate.question,
        "stop": candidate.stop,
        "seeds": list(candidate.seeds),
        "score": candidate.score,
        **candidate.parts,
        "reward": candidate.reward,
    }


def stats(
    collected: Collected,
    rows: list[dict[str, Any]],
    method: str,
    min_margin: float,
    read_skipped: Counter[str] | None = None,
) -> dict[str, Any]:
    """What pairs_stats.json holds; also the explanation when there is no training data."""
    groups = [g for found in collected.candidates.values() for g in states(found)]
    spread = [max(c.reward for c in g) - min(c.reward for c in g) for g in groups if len(g) > 1]
    margins = [r["margin"] for r in rows if "margin" in r]
    skipped = Counter(read_skipped or {}) + collected.skipped
    every = [c for g in groups for c in g]
    return {
        "method": method,
        "instances": len(collected.candidates),
        # A state: an instance and the turns before an action (one per instance at turn 1).
        "states": len(groups),
        "candidates": collected.used,
        "distinct_questions": sum(not c.stop for c in every),
        "stops": sum(c.stop for c in every),
        # Why states give no pair: one action only, all rewarded equal, or too close.
        "single_question": sum(len(g) == 1 for g in groups),
        # By the rule of `dpo_pairs`: equal within TIE, apart but not `preferred`.
        "all_equal": sum(s <= TIE for s in spread),
        "below_margin": sum(s > TIE and not preferred(s, min_margin) for s in spread),
        "mean_score": round(mean(c.score for c in every), 3) if every else None,
        "mean_reward": round(mean(c.reward for c in every), 3) if every else None,
        "pairs" if method == "dpo" else "examples": len(rows),
        "by_turn": dict(sorted(Counter(str(r["turn"]) for r in rows).items())),
        "mean_margin": round(mean(margins), 3) if margins else None,
        "reward_spread": spread_figures(spread, TIE),
        "skipped": dict(sorted(skipped.items())),
    }


def no_data_message(summary: dict[str, Any], config: TrainConfig) -> str:
    """Why there is nothing to train on, in numbers, with the knob to turn."""
    unscored = summary["skipped"].get("no_blurred_score", 0)
    if unscored:
        # Before the per-state reasons: with no baseline there may be no state at all.
        return (
            f"{unscored} sampled dialogue(s) have no scored blurred run of their instance, the "
            "reward's baseline (reward.baseline: blurred): sample with this config (it runs "
            "the blurred condition), or set reward.baseline=none; " + _per_state(summary, config)
        )
    return _per_state(summary, config)


def _per_state(summary: dict[str, Any], config: TrainConfig) -> str:
    if config.method == "dpo":
        return (
            f"no preference pairs: of {summary['states']} dialogue state(s) over "
            f"{summary['instances']} instance(s), {summary['all_equal']} had all candidates "
            f"scoring equal, {summary['single_question']} got one distinct question only and "
            f"{summary['below_margin']} differed by less than min_margin={config.min_margin:g}; "
            "min_margin may be too high (or sample more candidates, at a higher temperature)"
        )
    rule = f"reward above sft_min_score={config.sft_min_score:g}" + (
        " and above the state's mean" if config.sft_above_mean else ""
    )
    return (
        f"no SFT examples: no best action of {summary['states']} dialogue state(s) had a "
        f"{rule}; {summary['all_equal']} state(s) had all candidates scoring equal"
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
    """Read the samples, write the training data (pairs.jsonl or sft.jsonl), every candidate
    with its reward (candidates.jsonl) and pairs_stats.json. Files are written even when there
    are no rows, so the stats say why."""
    samples = config.samples_dir()
    records, read_skipped = read_records(samples)
    instances = sampled_instances(samples)
    collected = collect(records, set(instances), config.reward, dialogue_condition(config))
    rows: list[dict[str, Any]]
    if config.method == "dpo":
        pairs = dpo_pairs(collected.candidates, config.min_margin, config.pairing)
        rows = [dpo_row(p, instances[p.instance_id], config.allow_stop) for p in pairs]
        chosen = [(p.instance_id, p.chosen) for p in pairs]
    else:
        examples = sft_examples(collected.candidates, config.sft_min_score, config.sft_above_mean)
        rows = [sft_row(e, instances[e.instance_id], config.allow_stop) for e in examples]
        chosen = [(e.instance_id, e.best) for e in examples]
    kept = [(i, c.turn, c.question) for i, c in chosen if not c.stop]
    summary = stats(collected, rows, config.method, config.min_margin, read_skipped)
    summary["kept_questions"] = kept_questions(kept, records, instances)
    summary["samples_dir"] = str(samples)
    summary["reward"] = config.reward.model_dump()
    path = config.data_file()
    _write(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    _write(
        path.parent / "candidates.jsonl",
        "".join(
            json.dumps(candidate_row(i, c), ensure_ascii=False) + "\n"
            for i, found in collected.candidates.items()
            for c in found
        ),
    )
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
    write_whole(path, text)  # refuses a path that is not a regular file (NotAFile)
