"""`cts data fuse|blur`: building a benchmark from your own queries (cts/eval/construct/), and
`cts data synth`: a synthetic one drawn from a seed; cts/cli/data.py registers them on the
`cts data` group."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, cast

import typer

from cts.cli.common import output_console, progress_for, usage_error
from cts.cli.options import SERVING, SET_OPTION, SHARD_OPTION, shard_of
from cts.eval.construct.blur import DEFAULT_MIX, BlurPlan, blur_file, parse_mix
from cts.eval.construct.fuse import fuse_file, parts_dir
from cts.eval.construct.store import BuildControl, BuildOutcome
from cts.eval.construct.synth import counts, synthesize, write_synthetic
from cts.eval.experiment import require_roles, serving_for
from cts.eval.run.config import ResolvedExperiment, load_experiment
from cts.eval.run.config_sections import Role
from cts.eval.run.run_dir import Shard
from cts.serving.server_group import ServeOptions

BUILD_CONFIG_OPTION = typer.Option(
    "build",
    "--config",
    "-c",
    help="The experiment whose roles build (default `build`: cts/configs/experiments/build.yaml, "
    "every role on the tiny model).",
)
OUT_OPTION = typer.Option(..., "--out", help="The JSONL file to write.")
RETRY_OPTION = typer.Option(False, "--retry-failed", help="Run rows whose model call failed again.")
SEED_OPTION = typer.Option(
    0, help="The seed of every sampled call (and of the draw of what to blur)."
)
_MIX_TEXT = ",".join(f"{t}={w:g}" for t, w in DEFAULT_MIX.items())


def _control(name: str, shard: str | None, retry_failed: bool, concurrency: int) -> BuildControl:
    """A progress bar on a terminal, else a line every $CTS_PROGRESS_EVERY_S seconds (a log)."""
    return BuildControl(
        name=name,
        shard=shard_of(shard),
        show_progress=progress_for(output_console()),
        retry_failed=retry_failed,
        concurrency=concurrency,
    )


def _account(outcome: BuildOutcome, shard: Shard, written: str | None, again: str) -> None:
    console = output_console()
    console.print(
        f"{outcome.ran} rows done now, {outcome.keys - outcome.ran} already done, "
        f"{outcome.failed} failed (run again with --retry-failed)",
        highlight=False,
    )
    if written is None:
        console.print(f"rows of other shards are missing: when every shard is done, {again}")
    else:
        console.print(written, highlight=False, soft_wrap=True)
    if shard.count > 1:
        console.print(f"shard {shard.index}/{shard.count} done", highlight=False)


def _experiment(config: str, set_: list[str], roles: list[Role]) -> ResolvedExperiment:
    resolved = load_experiment(config, set_)
    require_roles(resolved, roles)
    return resolved


def fuse(
    raw: Path = typer.Argument(
        ...,
        help="Raw queries, JSONL: {query, group, language} a line; a group's lines are one "
        "search session (a line without group is its own). "
        "`cts/eval/sample_data/raw_queries.jsonl` is a sample.",
    ),
    out: Path = OUT_OPTION,
    config: str = BUILD_CONFIG_OPTION,
    set_: list[str] = SET_OPTION,
    seed: int = SEED_OPTION,
    shard: str | None = SHARD_OPTION,
    retry_failed: bool = RETRY_OPTION,
    serving: ServeOptions = SERVING,
) -> None:
    """Fuse each group of raw queries into one intent query.

    The `fuser` role, under a JSON schema, writes the fused query, the constraints it states
    (type and span, verbatim in it; others are dropped and listed) and the row's provenance
    (model, prompt digest, seed). Resumable and sharded: rows go to OUT.parts/ as they are
    done (a resume from other raw queries, another --seed or fuser model is refused); OUT is
    written once every group has its row. Next: `cts data blur OUT`."""
    resolved = _experiment(config, set_, ["fuser"])
    control = _control(f"fuse {raw.name}", shard, retry_failed, resolved.experiment.concurrency)
    with serving_for(resolved, serving, parts_dir(out) / "logs") as ready:
        outcome, written = fuse_file(ready.resolved, raw, out, control, seed)
    _account(
        outcome,
        control.shard,
        None if written is None else f"{written} fused queries in {out}",
        f"run without --shard to write {out}",
    )


def blur(
    fused: Path = typer.Argument(..., help="Fused queries: `cts data fuse`'s output."),
    out: Path = OUT_OPTION,
    config: str = BUILD_CONFIG_OPTION,
    set_: list[str] = SET_OPTION,
    mix: str = typer.Option(
        _MIX_TEXT,
        help="The removed types' weights, TYPE=W comma-separated (types without a weight are "
        "never removed).",
    ),
    per_query: int = typer.Option(1, min=1, help="Blurred variants of each fused query."),
    remove: int = typer.Option(1, min=1, help="Constraints each variant removes."),
    question_check: str = typer.Option(
        "rules",
        help="Whether a blurred query is still a question: by `rules` (no model), or also by "
        "the `judge` role's model (a yes/no; give the role with --set roles.judge.model=...).",
    ),
    seed: int = SEED_OPTION,
    shard: str | None = SHARD_OPTION,
    retry_failed: bool = RETRY_OPTION,
    serving: ServeOptions = SERVING,
) -> None:
    """Blur fused queries into benchmark instances, each checked before it is kept.

    For each fused query, --per-query variants removing --remove of its constraints (types
    drawn by --mix), written by the `blurrer` role under a JSON schema. A variant is kept when
    it removed the drawn constraints, each span in the fused query and gone from the blurred
    one (no part of a word left), the blurred query is still a question (rules; with
    --question-check judge also the judge's model), and the User Answerer recovers the span
    from the fused query but answers `unknown` from the blurred one. Once every row is done:
    OUT (instances, removed constraints as {type, span}), OUT-stem.rejects.jsonl (each with
    its reasons) and OUT-stem.summary.json (counts by reason, the removed types against
    --mix). Resumable and sharded like `cts data fuse` (a resume with other settings, fused
    queries or role models is refused)."""
    if question_check not in ("rules", "judge"):
        raise usage_error(f"--question-check {question_check!r}: rules or judge")
    checked = cast(Literal["rules", "judge"], question_check)
    plan = BlurPlan(parse_mix(mix), per_query, remove, seed, checked)
    resolved = _experiment(config, set_, plan.roles)
    control = _control(f"blur {fused.name}", shard, retry_failed, resolved.experiment.concurrency)
    with serving_for(resolved, serving, parts_dir(out) / "logs") as ready:
        result = blur_file(ready.resolved, fused, out, plan, control)
    summary = result.summary
    written = None
    if summary is not None:
        v, reasons, removed = summary["variants"], summary["reasons"], summary["mix"]
        why = ", ".join(f"{r} {n}" for r, n in reasons.items()) or "none"
        skipped = summary["fused_queries"]["skipped_without_query"]
        written = (
            f"{v['accepted']} of {v['n']} blurred queries accepted into {out}; rejected "
            f"{v['rejected']}, failed {v['failed']} (reasons: {why}); not drawn: "
            f"{v['short_of_per_query']} variants short of --per-query, {skipped} fused rows "
            f"without a query skipped; removed types asked "
            f"{removed['asked']}, drawn {removed['drawn']} (n {removed['n_drawn']}), kept "
            f"{removed['got']} (n {removed['n_removed']})"
        )
    _account(result.outcome, control.shard, written, f"run without --shard to write {out}")


def synth(
    out: Path = typer.Option(..., "--out", help="The folder to write (created if missing)."),
    train: int = typer.Option(200, min=0, help="Instances of the train split."),
    heldout: int = typer.Option(100, min=0, help="Instances of the held-out split."),
    seed: int = typer.Option(0, help="The seed every name, value and number is drawn from."),
    zh_share: float = typer.Option(
        0.25, min=0.0, max=1.0, help="The share of instances in Chinese (the rest English)."
    ),
) -> None:
    """Write a synthetic benchmark: made-up entities, one removed constraint each.

    Families of every removed-constraint type (cts/eval/construct/synth_families.yaml) each
    make an instance from one made-up entity and one of its values: the fused query names the
    value, the blurred query leaves it out, and the corpus holds one page per value of the
    entity, so the blurred query finds competing pages and the fused query the right one. The
    golden nuggets are the right page's facts. OUT gets train.jsonl, heldout.jsonl,
    corpus.jsonl and a README.md with this command; the same options write the same bytes.
    Nothing in it is true of anything."""
    command = (
        f"cts data synth --out {out} --train {train} --heldout {heldout} --seed {seed} "
        f"--zh-share {zh_share:g}"
    )
    synthetic = synthesize({"train": train, "heldout": heldout}, seed, zh_share)
    written = write_synthetic(synthetic, out, command)
    figures = counts(synthetic)
    for split in ("train", "heldout"):
        each = figures[split]
        languages = ", ".join(f"{k} {v}" for k, v in each["languages"].items())
        types = ", ".join(f"{k} {v}" for k, v in each["types"].items())
        typer.echo(f"{split}: {each['instances']} instances ({languages}; removed: {types})")
    typer.echo(f"corpus: {figures['corpus']['pages']} pages")
    typer.echo("wrote " + ", ".join(str(p) for p in written))
