"""The golden audit as one call (`audit_golden`, what `cts golden audit` runs) and its text: the
figure rows, the findings a curator fixes and the listing of unsupported nuggets. The checks
themselves are in cts/eval/audit/golden_audit.py."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

from cts.eval.audit.citations import citations_for, default_corpus, load_audit_dataset
from cts.eval.audit.golden_audit import (
    DUPLICATE_THRESHOLD,
    GoldenAudit,
    NuggetCheck,
    check_nuggets,
    golden_audit,
    judged_grounding,
    require_grounding_judge,
    sample_checks,
    sample_markdown,
)
from cts.eval.run.config import ResolvedExperiment

#: One row of the audit's table: the figure, its value and the n it is over.
FigureRow = tuple[str, str, str]


@dataclass(frozen=True)
class GoldenReview:
    """An audit written to its folder: audit.json, and sample.md with the drawn nuggets."""

    audit: GoldenAudit
    #: The corpus the citations were resolved in (None: traces only).
    corpus: str | None
    folder: Path
    drawn: list[NuggetCheck]

    @property
    def failed(self) -> bool:
        """A nugget cites nothing that supports it, or the model gave some no verdict."""
        return bool(self.audit.flagged or self.audit.unjudged)


def audit_golden(
    dataset: str,
    *,
    corpus: str | None = None,
    split: str | None = None,
    limit: int | None = None,
    resolved: ResolvedExperiment | None = None,
    lexical: bool = False,
    out: Path | None = None,
    sample: int = 20,
    seed: int = 0,
) -> GoldenReview:
    """Audit `dataset`'s golden nuggets (any dataset `cts data` reads, a golden construction
    folder, or `sample`) against the evidence they cite, by the judge role's model of
    `resolved` (without one, or with `lexical`: lexically), and write audit.json and
    sample.md (`sample` nuggets drawn with `seed`) to `out` (default
    runs/golden-audit-NAME). The corpus defaults to the experiment's, else the golden
    folder's, else the shipped one for `sample`."""
    if resolved is not None and not lexical:
        require_grounding_judge(resolved)  # before the dataset and corpus are read
    data = load_audit_dataset(dataset, split)
    instances = data.instances[:limit] if limit else data.instances
    if corpus is None:
        experiment = resolved or (data.golden_run.read_config() if data.golden_run else None)
        corpus = default_corpus(experiment.experiment) if experiment else None
        if corpus is None and dataset == "sample":
            corpus = "sample"
    citations = citations_for(data, corpus)
    checks = check_nuggets(instances, citations)
    model = None
    if resolved is not None and not lexical:
        model = asyncio.run(judged_grounding(resolved, checks))
    audit = golden_audit(instances, checks, model, citations.missing_traces)
    folder = out or Path("runs") / f"golden-audit-{_audit_name(dataset)}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "audit.json").write_text(
        json.dumps(audit.as_dict(), ensure_ascii=False, indent=1) + "\n", encoding="utf-8"
    )
    drawn = sample_checks(audit.checks, sample, seed)
    (folder / "sample.md").write_text(sample_markdown(audit, drawn, seed), encoding="utf-8")
    return GoldenReview(audit, corpus, folder, drawn)


def _audit_name(dataset: str) -> str:
    path = Path(dataset)
    name = path.name if path.is_dir() else path.stem
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name) or "dataset"


def review_title(review: GoldenReview) -> str:
    return f"golden audit · grounding by {review.audit.method} · corpus {review.corpus or '(none)'}"


def _listed(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in counts.items())


def figure_rows(audit: GoldenAudit) -> list[FigureRow]:
    """The audit's figures as rows of (figure, value, n)."""
    f = audit.figures()
    per, weights, sources = f["nuggets_per_instance"], f["weight_mix"], f["sources_per_nugget"]
    cites, grounding = f["citations"], f["grounding"]
    instances, nuggets = f"{per['n_instances']} instances", f"{grounding['n_nuggets']} nuggets"
    spread = f"min {per['min']} · median {per['median']} · mean {per['mean']} · max {per['max']}"
    shares = weights["shares"]
    rows: list[FigureRow] = [
        ("instances with golden nuggets", str(audit.with_golden), f"{audit.instances} instances"),
        ("nuggets per instance", f"{spread}; {_listed(per['distribution'])}", instances),
        ("instances with < 3 nuggets", str(f["fewer_than_3"]["count"]), instances),
        (
            "weight mix",
            ", ".join(f"{w}: {n} ({shares[w]:.0%})" for w, n in weights["counts"].items()),
            f"{weights['n_nuggets']} nuggets",
        ),
        (
            "sources per nugget",
            f"mean {sources['mean']}; {_listed(sources['distribution'])}",
            f"{sources['n_nuggets']} nuggets",
        ),
        (
            "citations resolved",
            f"corpus {cites['resolved_in_corpus']}, trace {cites['resolved_in_trace']}, "
            f"unresolved {cites['unresolved']}",
            f"{cites['n']} citations",
        ),
        (
            f"near-duplicate pairs (Jaccard ≥ {DUPLICATE_THRESHOLD})",
            str(f["near_duplicates"]["count"]),
            f"{f['near_duplicates']['n_pairs_compared']} pairs",
        ),
        ("grounding verdicts", _listed(grounding["verdicts"]), nuggets),
    ]
    agreement = grounding.get("lexical_agreement")
    if agreement:
        n = agreement["n_nuggets"]
        agreed = f"{agreement['agree']} ({agreement['share']:.0%})" if n else "–"
        rows.append(("model = lexical verdict", agreed, f"{n} nuggets"))
    rows.append(("citing nothing that supports them", str(grounding["flagged"]), nuggets))
    return rows


def findings(audit: GoldenAudit) -> list[str]:
    """What a curator fixes that is not a failure: thin instances, near-duplicates, dangling
    citations beside resolved ones, traces the dataset names but that are not there."""
    lines = [f"fewer than 3 nuggets: {i} has {n}" for i, n in audit.few_nuggets().items()]
    lines += [
        f"near-duplicates: {d.instance_id} {d.first} ~ {d.second} (Jaccard {d.similarity})"
        for d in audit.duplicates
    ]
    lines += [
        f"unresolved citation: {c.instance_id} {c.nugget_id} cites "
        f"{', '.join(c.unresolved)} (not in the corpus or its trace)"
        for c in audit.checks
        if c.unresolved and c.sources
    ]
    if audit.missing_traces:
        lines.append(
            f"{len(audit.missing_traces)} golden trace(s) not found, e.g. "
            f"{audit.missing_traces[0]}: their citations resolve against the corpus only"
        )
    return lines


def _listing_row(check: NuggetCheck, why: str) -> str:
    cited = ", ".join(f"{s} (unresolved)" if s in check.unresolved else s for s in check.source_ids)
    return (
        f"{check.instance_id}\t{check.nugget_id}\t{why}\t{check.text}\tcited: {cited or '(none)'}"
    )


def unsupported(audit: GoldenAudit) -> tuple[list[str], str]:
    """One tab-separated line per nugget that failed the audit, and the sentence counting them."""
    lines = [_listing_row(c, c.problem or "") for c in audit.flagged]
    lines += [_listing_row(c, f"no verdict: {c.model_error}") for c in audit.unjudged]
    return lines, (
        f"{len(audit.flagged)} of {len(audit.checks)} nuggets cite nothing that supports "
        f"them; {len(audit.unjudged)} got no verdict (model error)"
    )
