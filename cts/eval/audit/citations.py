"""What a golden audit reads: the dataset (the sample, a golden construction folder, or any dataset
`cts data` reads) and the texts its nuggets' citations resolve to — corpus documents by doc id
and URL, and the evidence each golden trace showed (its search hits, the pages read)."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cts.eval.data.dataset import DatasetSource, check_source, load_corpus, sample_sources
from cts.eval.data.readers import DatasetError
from cts.eval.data.schema import CorpusDocument, Instance
from cts.eval.run.config import ExperimentConfig
from cts.eval.run.run_dir import RunDir
from cts.webdancer.corpus import CorpusError, Problem
from cts.webdancer.search import QUERY_SEPARATOR

# -- evidence the citations resolve to -----------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """The text a citation resolves to, and where it was found (`corpus` or `trace`)."""

    id: str
    text: str
    origin: str


def corpus_texts(documents: Iterable[CorpusDocument]) -> dict[str, str]:
    """Title, date and text of each document (a search hit shows all three), by doc id and by
    URL (web-search ids are URLs)."""
    texts: dict[str, str] = {}
    for d in documents:
        date = f"Date published: {d.date}\n" if d.date else ""
        text = f"{d.title}\n{date}{d.text}" if d.title else f"{date}{d.text}"
        texts[d.doc_id] = text
        texts.setdefault(d.url, text)
    return texts


def _hit_entry(result: str, url: str) -> str | None:
    """The search hit for `url` in a Serper-shaped result (title line to the next hit)."""
    at = result.find(f"]({url})")
    if at < 0:
        return None
    start = result.rfind("\n", 0, at) + 1
    ends = [
        e
        for e in (
            re.search(r"\n\n\d+\. \[", result[at:]),
            re.search(re.escape(QUERY_SEPARATOR), result[at:]),
        )
        if e is not None
    ]
    end = at + min(e.start() for e in ends) if ends else len(result)
    return result[start:end].strip()


def trace_texts(trace: dict[str, Any]) -> dict[str, str]:
    """What a golden trace showed of each evidence id: its search hits, the pages read."""
    shown: dict[str, list[str]] = defaultdict(list)
    for step in trace.get("steps", []):
        if not isinstance(step, dict) or step.get("kind") != "tool":
            continue
        result = str(step.get("result", ""))
        for item in step.get("evidence", []) or []:
            if not isinstance(item, dict) or not item.get("id"):
                continue
            entry = _hit_entry(result, str(item.get("url", ""))) if item.get("url") else None
            text = entry if step.get("tool") == "search" and entry else result
            if text not in shown[str(item["id"])]:
                shown[str(item["id"])].append(text)
    return {source_id: "\n\n".join(texts) for source_id, texts in shown.items()}


@dataclass
class Citations:
    """Where `source_ids` resolve: corpus texts (by doc id and URL), and per instance the
    evidence its golden trace showed."""

    corpus: dict[str, str] = field(default_factory=dict)
    traces: dict[str, dict[str, str]] = field(default_factory=dict)
    #: Golden traces the dataset names that are not there (their citations use the corpus).
    missing_traces: list[str] = field(default_factory=list)

    def resolve(self, instance_id: str, source_id: str) -> Source | None:
        # The corpus document is the fuller text; a trace shows a snippet or a page's notes.
        if source_id in self.corpus:
            return Source(source_id, self.corpus[source_id], "corpus")
        shown = self.traces.get(instance_id, {}).get(source_id)
        return Source(source_id, shown, "trace") if shown is not None else None


def read_traces(instances: Iterable[Instance], traces_dir: Path) -> Citations:
    """The golden traces of `instances` under `traces_dir` (a golden run's traces/); a trace
    that is not valid JSON is a DatasetError naming it."""
    citations = Citations()
    problems = []
    for instance in instances:
        trace_id = instance.golden.trace_id if instance.golden else None
        if not trace_id:
            continue
        path = traces_dir / trace_id
        if not path.is_file():
            citations.missing_traces.append(trace_id)
            continue
        try:
            trace = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            problems.append(Problem(str(path), None, "<trace>", f"not a JSON trace: {e}"))
            continue
        if not isinstance(trace, dict):
            problems.append(Problem(str(path), None, "<trace>", "not a JSON object"))
            continue
        citations.traces[instance.id] = trace_texts(trace)
    if problems:
        raise DatasetError(problems)
    return citations


# -- the dataset ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditInput:
    instances: list[Instance]
    #: Where the dataset was read from (for messages and the default output folder's name).
    label: str
    #: A golden construction folder's traces, when the dataset is one's dataset.jsonl.
    traces_dir: Path | None = None
    #: A golden construction folder's own run directory (its config names the corpus).
    golden_run: RunDir | None = None


def load_audit_dataset(dataset: str, split: str | None = None) -> AuditInput:
    """`sample` (every split, or `split`), a golden construction folder (its dataset.jsonl and
    traces), or any dataset `cts data` reads. Citations are not checked against a corpus here:
    one that resolves to nothing is the audit's finding, not bad input. DatasetError when a
    row is invalid or no instance has golden nuggets."""
    golden_run = None
    traces_dir = None
    if dataset == "sample":
        sources = sample_sources(split)
    else:
        path = Path(dataset).expanduser()
        if path.is_dir() and RunDir(path).golden_dataset.is_file():
            path = RunDir(path).golden_dataset
        sources = [DatasetSource(path=str(path) if path.exists() else dataset, split=split)]
        folder = RunDir(path.parent)
        if path.is_file() and path == folder.golden_dataset:
            traces_dir = folder.traces if folder.traces.is_dir() else None
            golden_run = folder if folder.config.is_file() else None
    instances: list[Instance] = []
    problems: list[Problem] = []
    for source in sources:
        checked = check_source(source)
        instances += checked.instances
        problems += checked.problems
    if problems:
        raise DatasetError(problems)
    if not any(i.golden for i in instances):
        raise DatasetError([Problem(dataset, None, "golden", "no instance has golden nuggets")])
    return AuditInput(instances, dataset, traces_dir, golden_run)


def default_corpus(experiment: ExperimentConfig) -> str | None:
    """The corpus an experiment's citations name: its dataset's, else its local search's."""
    if experiment.dataset.corpus:
        return experiment.dataset.corpus
    return experiment.search.corpus if experiment.search.backend == "local" else None


def citations_for(data: AuditInput, corpus: str | None) -> Citations:
    """The corpus texts (`sample` or a corpus JSONL) and the golden traces the dataset's
    citations can resolve to. DatasetError when there is neither (every citation would
    resolve to nothing: a forgotten --corpus, not a finding) or the corpus is invalid."""
    if corpus is None and data.traces_dir is None:
        raise DatasetError(
            [
                Problem(
                    data.label,
                    None,
                    "source_ids",
                    "nothing to resolve citations against: no corpus (give --corpus, or an "
                    "experiment whose search uses one) and no golden traces beside the dataset",
                )
            ]
        )
    citations = read_traces(data.instances, data.traces_dir) if data.traces_dir else Citations()
    if corpus is not None:
        try:
            citations.corpus = corpus_texts(load_corpus(corpus))
        except CorpusError as e:
            raise DatasetError(e.problems) from None
    return citations
