"""What bench/pipeline.py prints, and the figures made of other figures: the line of each
server run, the curve's table, the summary at the end, and the ratios between parts (the
pipeline over the ceiling; how many shards one shared judge server keeps up with).

Apart from the measurements because it changes with how the results are read, not with how they
are taken; bench/gpu_check.py prints the same ratios.
"""

from __future__ import annotations

from typing import Any

# -- ratios between parts --------------------------------------------------------------------------


def best(rows: list[dict[str, Any]]) -> float:
    return max(r["tokens_per_s"] for r in rows)


def over_ceiling(pipeline: dict[str, Any], ceiling: dict[str, Any]) -> dict[str, float]:
    """The pipeline's generated tokens/s (over its wall time, its active span, and the
    phase while keys still queued) as a fraction of the best ceiling figure."""
    most = ceiling["best_tokens_per_s"]
    queued = pipeline.get("tokens_per_s_queued")
    return {
        "pipeline_over_ceiling": round(pipeline["tokens_per_s"] / most, 3),
        "pipeline_answered_over_ceiling": round(pipeline["answered_tokens_per_s"] / most, 3),
        "pipeline_active_over_ceiling": round((pipeline["tokens_per_s_active"] or 0) / most, 3),
        "pipeline_queued_over_ceiling": round(queued / most, 3) if queued else None,
    }


def shared_judge(pipeline: dict[str, Any], ceiling: dict[str, Any]) -> dict[str, Any]:
    """How many shards one shared judge server keeps up with (`cts slurm submit
    --shared-servers judge`): the judge's share of the pipeline's generated tokens, times the
    pipeline's tok/s, is what one shard asks of the judge's server per second; the best ceiling
    is what one server gives. Generated tokens only: the judge's long prompts cost prefill the
    figure leaves out (its share of prompt tokens is beside it)."""
    generated = pipeline["completion_tokens_by_role"]
    prompted = pipeline["prompt_tokens_by_role"]
    share = generated.get("judge", 0) / max(1, sum(generated.values()))
    per_shard = share * pipeline["tokens_per_s"]
    return {
        "judge_generated_share": round(share, 3),
        "judge_prompt_share": round(prompted.get("judge", 0) / max(1, sum(prompted.values())), 3),
        "judge_tokens_per_s_per_shard": round(per_shard, 2),
        "shards_per_judge_server": (
            round(ceiling["best_tokens_per_s"] / per_shard, 1) if per_shard else None
        ),
    }


# -- printed ---------------------------------------------------------------------------------------

CURVE_HEAD = (
    "| concurrency | keys | calls | wall s | calls/s | ideal calls/s | of ideal | mean in flight "
    "| peak in flight | client CPU | sim server CPU |\n" + "|---" * 11 + "|"
)


def curve_row(r: dict[str, Any]) -> str:
    return (
        f"| {r['concurrency']} | {r['keys']} | {r['calls']} | {r['wall_s']} | "
        f"{r['calls_per_s']} | {r['ideal_calls_per_s']} | {r['ratio']:.0%} | "
        f"{r['mean_in_flight']} | {r['peak_in_flight']} | {r['client_cpu']:.0%} | "
        f"{r['server_cpu']:.0%} |"
    )


def ceiling_line(row: dict[str, Any]) -> str:
    return (
        f"concurrency {row['concurrency']}: {row['tokens_per_s']} tok/s, "
        f"running {row['in_flight'].get('running_mean')}, "
        f"{row['length_matched']}/{row['requests_finished']} lengths matched"
    )


def run_line(f: dict[str, Any]) -> str:
    flight = f["in_flight"]
    return (
        f"{f['keys_run']} keys, {f['requests']} requests, {f['completion_tokens']} completion "
        f"tokens in {f['wall_s']} s: {f['tokens_per_s']} tok/s (active span "
        f"{f['tokens_per_s_active']}; {f['tokens_per_s_queued']} over the {f['queued_s']} s "
        f"while keys queued, then a {f['tail_s']} s tail), running mean "
        f"{flight.get('running_mean')} max "
        f"{flight.get('running_max')}, waiting mean {flight.get('waiting_mean')}, prefix-cache "
        f"hit rate {f['prefix_cache_hit_rate']}, failures {f['failures']}, sent again "
        f"{f['retried'] or 'none'}"
    )


def summary(results: dict[str, Any]) -> str:
    """The headline figures, one per line."""
    lines = []
    if "overhead" in results:
        o = results["overhead"]
        lines.append(
            f"orchestration: {o['ms_per_call']} ms per model call ({o['model_calls']} calls, "
            f"{o['wall_s']} s, fixed {o['fixed_s']} s; first run in the process "
            f"{o['ms_per_call_first_run']} ms)"
        )
    if "pipeline" in results:
        p = results["pipeline"]
        lines.append(
            f"pipeline: {p['tokens_per_s']} tok/s ({p['tokens_per_s_active']} active), running "
            f"mean {p['in_flight'].get('running_mean')}"
        )
    for extra in results.get("pipeline_more", []):
        lines.append(
            f"pipeline at concurrency {extra['concurrency']}/{extra['max_concurrency']}: "
            f"{extra['tokens_per_s']} tok/s, running mean {extra['in_flight'].get('running_mean')}"
        )
    if "ceiling" in results:
        rows = results["ceiling"]["rows"]
        lines.append(
            "ceiling: "
            + ", ".join(f"{r['tokens_per_s']} tok/s at {r['concurrency']}" for r in rows)
        )
    if "naive" in results:
        lines.append(f"naive: {results['naive']['tokens_per_s']} tok/s")
    for key, value in results.get("ratios", {}).items():
        lines.append(f"{key}: {value}")
    if "rerun" in results:
        r = results["rerun"]
        lines.append(
            f"rerun ({r['engine']}): same dir {r['same_dir']['model_calls']} calls in "
            f"{r['same_dir']['wall_s']} s; new dir {r['new_dir']['model_calls']} calls in "
            f"{r['new_dir']['wall_s']} s"
        )
    return "\n".join([*lines, *structured_and_prefix_lines(results)])


def structured_and_prefix_lines(results: dict[str, Any]) -> list[str]:
    """The summary's last lines: the structured-output cost and the prefix sharing."""
    lines = []
    s = results.get("structured", {})
    if "vllm" in s:
        lines.append(
            f"structured (vLLM, xgrammar): per-token ×{s['vllm']['per_token_s_ratio_median']}, "
            f"first token ×{s['vllm']['ttft_s_ratio_median']}, compiling a new grammar "
            f"{s['vllm']['compile_s_median']} s (median), {s['vllm']['compile_s_max']} s (max)"
        )
    if "transformers" in s:
        lines.append(
            f"structured (transformers, outlines): per-token "
            f"×{s['transformers']['per_token_s_ratio_median']}, compiling a new grammar "
            f"{s['transformers']['compile_s_median']} s (median), "
            f"{s['transformers']['compile_s_max']} s (max)"
        )
    if "prefix" in results:
        shares = ", ".join(
            f"{role} {v['shared_earlier']}"
            for role, v in results["prefix"].items()
            if isinstance(v, dict) and "requests" in v
        )
        lines.append(
            f"prefix shared with an earlier request: {shares}; server hit rate "
            f"{results['prefix'].get('server_hit_rate_pipeline')}"
        )
    return lines
