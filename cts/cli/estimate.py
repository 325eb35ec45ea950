"""`cts estimate`: a sweep's model calls, tokens, tool calls, cost and hours, from a pilot."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from cts.cli.common import command, output_console, run_into, run_keyed, usage_error
from cts.cli.options import CONFIG_OPTION, SERVING, SET_OPTION, checked_output_dir
from cts.eval.cost import Figure, ModelRow, RoleRow
from cts.eval.estimate import Estimate, estimate_run
from cts.eval.experiment import require_roles
from cts.eval.pilot import default_pilot_dir, pilot_experiment
from cts.eval.pilot_records import attempts
from cts.eval.run.config import ResolvedExperiment, load_experiment
from cts.eval.run.run_dir import RunDir, Shard
from cts.eval.sweep_power import Detection
from cts.eval.sweep_power import detect as detect_plans
from cts.foundation.disk import refuse_special, write_whole
from cts.serving.server_group import ServeOptions

app = typer.Typer()

#: Instances a pilot runs unless --pilot says otherwise.
DEFAULT_PILOT = 5


@command(app, "estimate")
def estimate(
    config: str | None = CONFIG_OPTION,
    set_: list[str] = SET_OPTION,
    pilot: int | None = typer.Option(
        None,
        min=1,
        help=f"Instances the pilot runs, every condition and seed (default {DEFAULT_PILOT}): "
        "a sample of the sweep's instances stratified by language, then removed-constraint type.",
    ),
    pilot_seed: int = typer.Option(
        0, help="Seed of the pilot's draw (the same seed, the same instances)."
    ),
    from_run: Path | None = typer.Option(
        None,
        help="Estimate from this finished run (or earlier pilot) instead of running a pilot.",
    ),
    pilot_dir: Path | None = typer.Option(
        None,
        help="Run directory of the pilot (default: <output_dir>/estimate-pilot). An existing "
        "pilot resumes: its keys are not run again.",
    ),
    target_hours: float = typer.Option(
        24.0, help="Wall time per shard the suggested --shards aims at."
    ),
    out: Path | None = typer.Option(None, help="Also write the estimate as JSON here."),
    detect: float | None = typer.Option(
        None,
        help="Also plan instances × seeds that detect a true difference of D restore points "
        "between two systems (80% power, α 0.05 over the report's Holm family of clarify@k "
        "rows), each with its keys and GPU-hours, from the pilot's noise; run the pilot with "
        "2+ seeds to split it (--set 'seeds=[0,1]').",
    ),
    power: float = typer.Option(0.8, min=0.5, max=0.99, help="--detect: the power wanted."),
    alpha: float = typer.Option(
        0.05,
        min=0.001,
        max=0.2,
        help="--detect: the level the report's comparisons are read at; plans are made at "
        "alpha / m, m the sweep's clarify@k conditions (a Holm family's first rejection).",
    ),
    detect_between: str | None = typer.Option(
        None,
        help="--detect: the pilot's two conditions whose paired noise stands for two systems', "
        "A,B (default: its first clarify@k, blurred).",
    ),
    options: ServeOptions = SERVING,
) -> None:
    """Estimate a whole sweep — what `cts run -c X` would run: every instance of the dataset
    × conditions × seeds — before submitting it.

    Runs a pilot of N instances (all conditions and seeds) through the normal pipeline, with
    its own response and tool caches so that every call is a real one (or reads a finished
    run with --from-run), then extrapolates: model calls, prompt and generated tokens per role
    and model, search and visit calls and their cost (search.price_per_call /
    price_per_visit), server- and GPU-hours from each model's throughput_tokens_per_s ("unknown"
    without it), and the --shards that keep each shard under --target-hours. Intervals are a
    95% bootstrap over the pilot's instances: rough with a few instances."""
    if not 0 < target_hours < math.inf:  # nan and inf too
        raise usage_error(f"--target-hours {target_hours}: expected hours > 0, e.g. 24")
    if from_run is not None and (pilot is not None or pilot_dir is not None or pilot_seed):
        raise usage_error(
            "--from-run reads a finished run: give no --pilot, --pilot-seed or --pilot-dir"
        )
    if out is not None:
        refuse_special(out)  # before a pilot runs, not after
    pair = _detect_pair(detect, detect_between)  # likewise
    sweep = load_experiment(config, set_)
    console = output_console()
    if from_run is None:
        require_roles(sweep)  # before any server is started for the pilot
        from_run = run_pilot(
            sweep,
            config,
            set_,
            (pilot or DEFAULT_PILOT, pilot_seed),
            checked_output_dir(pilot_dir) or default_pilot_dir(sweep),
            options,
            console,
        )
    found = estimate_run(from_run, sweep, target_hours)
    print_estimate(console, found)
    document = found.as_dict()
    if detect is not None:
        document["detect"] = _detect(console, from_run, found, detect, pair, (power, alpha))
    if out is not None:
        write_whole(out, json.dumps(document, indent=1))
        console.print(f"estimate: {out}", highlight=False)


def run_pilot(
    sweep: ResolvedExperiment,
    config: str | None,
    set_: list[str],
    draw: tuple[int, int],
    root: Path,
    options: ServeOptions,
    console: Console,
) -> Path:
    """Draw (`draw`: instances, seed) and run (or resume) the pilot into `root`; its
    directory."""
    resolved, drawn = pilot_experiment(sweep, config, set_, *draw, root)
    run_dir = RunDir(root)
    console.print(
        f"pilot of [bold]{resolved.experiment.name}[/bold] on {drawn.describe()} → {root}",
        highlight=False,
    )
    run_keyed(
        resolved,
        run_dir,
        Shard(),
        options,
        run_into(root),
        console,
        merge_with=f"cts merge {root}",
        retry=False,
    )
    return root


# -- the table --------------------------------------------------------------------------------


def amount(value: float) -> str:
    """A count as a reader takes it in: 950, 12.3k, 4.56M, 1.2B."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}" if value != int(value) else f"{value:.0f}"


def per_key(value: float | None) -> str:
    return "not recorded" if value is None else f"{value:.1f}"


def mean_of(figure: Figure | None) -> float | None:
    return None if figure is None else figure.per_key


def total(figure: Figure | None, unit: str = "") -> str:
    """The sweep's total with its 95% interval."""
    if figure is None:
        return "not recorded"
    if figure.low == figure.high:
        return f"{unit}{amount(figure.total)}"
    return f"{unit}{amount(figure.total)} [{unit}{amount(figure.low)}–{unit}{amount(figure.high)}]"


def hours(figure: Figure | None) -> str:
    if figure is None:
        return "unknown"
    if figure.low == figure.high:
        return f"{figure.total:.3g}"
    return f"{figure.total:.3g} [{figure.low:.3g}–{figure.high:.3g}]"


def print_table(
    console: Console, title: str, columns: list[str], *sections: list[list[str]]
) -> None:
    """A table of plain-text cells (an interval's brackets are no markup), a line between its
    sections."""
    table = Table(*columns, title=title)
    for i, rows in enumerate(sections):
        if i:
            table.add_section()
        for cells in rows:
            table.add_row(*(Text(c) for c in cells))
    console.print(table)


def _calls_and_tokens(counted: RoleRow | Estimate) -> list[str]:
    """A role's (or all roles') calls and tokens: per key (pilot), then for the sweep."""
    figures = (counted.calls, counted.prompt_tokens, counted.completion_tokens)
    return [*(per_key(mean_of(f)) for f in figures), *(total(f) for f in figures)]


def _print_roles(console: Console, found: Estimate) -> None:
    """The model calls and tokens per role, per key (pilot) and for the sweep."""
    print_table(
        console,
        "model calls and tokens, per key (pilot) and for the sweep",
        [
            "role",
            "model",
            "calls/key",
            "prompt tok/key",
            "generated tok/key",
            f"calls ({found.sweep_keys} keys)",
            "prompt tokens",
            "generated tokens",
        ],
        [[row.role, row.model_name, *_calls_and_tokens(row)] for row in found.roles],
        [["all", "", *_calls_and_tokens(found)]],
    )


def _print_conditions(console: Console, found: Estimate) -> None:
    """The pilot's per-key means per condition."""
    print_table(
        console,
        "per condition (pilot means)",
        [
            "condition",
            "keys (pilot → sweep)",
            "calls/key",
            "prompt tok/key",
            "generated tok/key",
            "search calls/key",
            "visits/key",
        ],
        [
            [
                c.condition,
                f"{c.pilot_keys} → {c.sweep_keys}",
                *map(per_key, (c.calls, c.prompt_tokens, c.completion_tokens)),
                *map(per_key, (c.search_calls, c.visit_calls)),
            ]
            for c in found.by_condition
        ],
    )


def _print_servers(console: Console, found: Estimate) -> None:
    """Per model: tokens, throughput, server- and GPU-hours, and shards."""
    print_table(
        console,
        "servers",
        [
            "model",
            "roles",
            "generated tokens",
            "tok/s per server",
            "server-hours",
            "GPUs/server",
            "servers/shard",
            "GPU-hours",
            f"shards for {found.target_hours:g} h",
        ],
        [_server_cells(m) for m in found.models],
    )


def _server_cells(m: ModelRow) -> list[str]:
    throughput = m.throughput_tokens_per_s
    return [
        m.model_name,
        ", ".join(m.roles),
        total(m.completion_tokens),
        "unknown" if throughput is None else f"{throughput:g}",
        hours(m.server_hours),
        str(m.gpus_per_server),
        str(m.replicas),
        hours(m.gpu_hours),
        "unknown" if m.shards is None else f"{m.shards} (≤ {m.shards_high})",
    ]


def _print_tools(console: Console, found: Estimate) -> None:
    """Search calls and visits, and their cost where priced."""
    for tool in found.tools:
        search = tool.tool == "search"
        what = "search calls (one per query)" if search else "pages visited"
        key = "search.price_per_call" if search else "search.price_per_visit"
        cost = (
            f"no price ({key})"
            if tool.price is None
            else f"cost {total(tool.cost, '$')} at ${tool.price:g} each"
        )
        console.print(f"{what}: {total(tool.calls)}; {cost}", highlight=False, markup=False)


def _print_shards(console: Console, found: Estimate) -> None:
    """The suggested --shards, or why it is unknown."""
    if found.shards is None:
        console.print(
            "suggested --shards: unknown (no model has a throughput_tokens_per_s)",
            highlight=False,
            markup=False,
        )
    else:
        high = max(m.shards_high for m in found.models if m.shards_high is not None)
        partly = any(m.shards is None for m in found.models)
        console.print(
            f"suggested: --shards {found.shards} for about {found.target_hours:g} h of wall time "
            f"per shard ({high} at the intervals' upper ends"
            + ("; models without a throughput not counted" if partly else "")
            + "): each shard running every model on its vllm.replicas servers (one unless "
            "set), each sustaining its throughput_tokens_per_s, the instances split evenly",
            highlight=False,
            markup=False,
        )


def _print_held(console: Console, found: Estimate) -> None:
    """GPU-hours the servers are held per task, what a shard holds of each model, and shared
    where sharing saves any."""
    if not found.held:
        return
    per_task = sum(h.per_task_gpu_hours for h in found.held)
    each = ", ".join(
        f"{h.model} {h.replicas} server(s) × {h.gpus_per_server} GPU(s)" for h in found.held
    )
    text = (
        f"GPU-hours held by the servers at --shards {found.shards}: {per_task:g} with every "
        f"shard serving every model for {found.target_hours:g} h (per shard: {each})"
    )
    saved = [h for h in found.held if h.shared_gpu_hours < h.per_task_gpu_hours]
    if saved:
        shared = sum(min(h.shared_gpu_hours, h.per_task_gpu_hours) for h in found.held)
        lines = ", ".join(
            f"{h.model} {h.per_task_gpu_hours:g} → {h.shared_gpu_hours:g}" for h in saved
        )
        text += (
            f"; {shared:g} with --shared-servers for the roles of "
            f"{', '.join(h.model for h in saved)} (one job serving only the servers their work "
            f"needs: {lines})"
        )
    console.print(text, highlight=False, markup=False)


def print_estimate(console: Console, found: Estimate) -> None:
    """The estimate as `cts estimate` prints it: what it covers, the tables, the
    suggested shards and the notes."""
    seeds = len(found.seeds)
    console.print(
        f"estimate of {found.experiment}: {found.sweep_instances} instances × "
        f"{len(found.conditions)} conditions × {seeds} seed(s) = {found.sweep_keys} keys, from "
        f"a pilot of {found.pilot_instances} instance(s) ({found.pilot_keys} keys) in "
        f"{found.pilot_dir}; [low–high]: 95% bootstrap interval over the pilot's instances",
        highlight=False,
        markup=False,
    )
    console.print(f"pilot: {found.pilot_drawn}", highlight=False, markup=False)
    _print_roles(console, found)
    _print_conditions(console, found)
    _print_servers(console, found)
    _print_tools(console, found)
    _print_shards(console, found)
    _print_held(console, found)
    for note in found.notes:
        console.print(f"note: {note}", style="yellow", highlight=False, markup=False)


def _detect(
    console: Console,
    run_dir: Path,
    found: Estimate,
    detect: float,
    pair: tuple[str, str] | None,
    level: tuple[float, float],
) -> dict[str, object]:
    """`--detect`: the plans from the pilot's records (`level`: the power wanted and the
    family's α), printed; their JSON."""
    records, _ = attempts(run_dir)
    power, alpha = level
    detection = detect_plans(records, found, detect, between=pair, wanted=power, alpha=alpha)
    print_detection(console, detection)
    return detection.as_dict()


def _detect_pair(detect: float | None, between: str | None) -> tuple[str, str] | None:
    """--detect and --detect-between checked: the pair named, or None for the default."""
    if detect is not None and not 0 < detect < math.inf:
        raise usage_error(f"--detect {detect}: expected restore points > 0, e.g. 3")
    named = [c.strip() for c in (between or "").split(",") if c.strip()]
    if between is not None and len(named) != 2:
        raise usage_error(f"--detect-between {between}: two conditions, A,B")
    return (named[0], named[1]) if named else None


def _pilot_advice(found: Detection) -> str:
    """What the pilot's own uncertainty means for the cheapest plan."""
    cheapest, n = found.costs[0], found.noise.instances
    needed = cheapest.instances_if_noisier
    line = (
        f"the pilot's {n} instances leave its noise uncertain: at its 90% upper bound (variance "
        f"× {found.noisier:.2f}) the cheapest plan needs "
        + ("more instances than the dataset holds" if needed is None else f"{needed} instances")
    )
    if needed is None or needed > 1.2 * cheapest.instances:
        return (
            line + f"; plan for that many, or pilot more instances (--pilot {2 * n}) to narrow it"
        )
    return line + "; the pilot is large enough for this plan"


def print_detection(console: Console, found: Detection) -> None:
    """The plans of `--detect`, cheapest first, and what limits them."""
    noise, plans = found.noise, found.plans
    share = (
        "unknown (one seed)"
        if noise.seed_part is None
        else "none"
        if noise.seed_share is None
        else f"{noise.seed_share:.0%}"
    )
    level = (
        f"α {found.alpha:g} over a Holm family of {found.family} clarify@k rows: planned at "
        f"{plans.alpha:.4g}"
        if found.family > 1
        else f"α {plans.alpha:g}"
    )
    console.print(
        f"to detect {plans.detect:g} points between two systems (power {plans.power:g}, "
        f"{level}, two-sided): noise of {found.between[0]} − {found.between[1]} over "
        f"{noise.instances} pilot instances, sd {noise.variance**0.5:.1f} at {noise.seeds:g} "
        f"seed(s), {share} of it from seeds",
        highlight=False,
        markup=False,
    )
    if found.costs:
        table = Table(
            "instances", "seeds", "MDE", "keys (one system)", "GPU-hours", "if noisier (90%)"
        )
        for i, c in enumerate(found.costs):
            mark = " (cheapest)" if i == 0 else ""
            hours = "unknown" if c.gpu_hours is None else f"{c.gpu_hours:g}"
            noisier = "> dataset" if c.instances_if_noisier is None else str(c.instances_if_noisier)
            table.add_row(
                str(c.instances), str(c.seeds), f"{c.mde:.2f}", f"{c.keys}{mark}", hours, noisier
            )
        console.print(table)
        console.print(_pilot_advice(found), highlight=False, markup=False)
    if plans.instances_at_any_seeds is not None:
        console.print(
            f"with unlimited seeds it would still take {plans.instances_at_any_seeds} instances "
            "(the per-instance spread of the difference)",
            highlight=False,
            markup=False,
        )
    for note in plans.notes:
        console.print(f"note: {note}", style="yellow", highlight=False, markup=False)
