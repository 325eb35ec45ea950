"""The corpus the local search backend indexes and the local visit backend reads: JSONL lines
`{doc_id, url, title, text, date?, language?}` (docs/data-and-golden.md), validated with every
problem reported as `file:line: field: message`."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cts.foundation.files import sha256_file

# ISO 639-1. A language tag is valid when its primary subtag is one of these ("zh", "zh-CN").
ISO_639_1 = frozenset(
    (
        "aa ab ae af ak am an ar as av ay az ba be bg bh bi bm bn bo br bs ca ce ch co cr cs cu "
        "cv cy da de dv dz ee el en eo es et eu fa ff fi fj fo fr fy ga gd gl gn gu gv ha he hi "
        "ho hr ht hu hy hz ia id ie ig ii ik io is it iu ja jv ka kg ki kj kk kl km kn ko kr ks "
        "ku kv kw ky la lb lg li ln lo lt lu lv mg mh mi mk ml mn mr ms mt my na nb nd ne ng nl "
        "nn no nr nv ny oc oj om or os pa pi pl ps pt qu rm rn ro ru rw sa sc sd se sg si sk sl "
        "sm sn so sq sr ss st su sv sw ta te tg th ti tk tl tn to tr ts tt tw ty ug uk ur uz ve "
        "vi vo wa wo xh yi yo za zh zu"
    ).split()
)


#: What a byte that is not UTF-8 reads as with errors="surrogateescape" (U+DC80..U+DCFF).
_BAD_BYTE = re.compile("[\udc80-\udcff]")


def known_language(tag: str) -> bool:
    return tag.split("-")[0].split("_")[0].lower() in ISO_639_1


@dataclass(frozen=True)
class Problem:
    file: str
    line: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where}: {self.field}: {self.message}"


class CorpusDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")

    doc_id: str = Field(min_length=1)
    url: str = Field(min_length=1)
    title: str = ""
    text: str = Field(min_length=1)
    date: str | None = None
    language: str | None = None


def check_corpus(path: Path) -> tuple[list[CorpusDocument], list[Problem]]:
    """Every valid document of a corpus JSONL, and every problem as `file:line: field: ...`."""
    documents: list[CorpusDocument] = []
    problems: list[Problem] = []
    first_seen: dict[str, int] = {}
    try:
        # surrogateescape: a bad byte is a problem on its line, not a UnicodeDecodeError;
        # utf-8-sig: a BOM that an editor put at the start of the file is not a bad first row.
        f = path.open(encoding="utf-8-sig", errors="surrogateescape") if path.is_file() else None
    except OSError as e:  # a name too long for the file system, permission denied
        return [], [Problem(str(path), None, "<file>", f"cannot read: {e.strerror or e}")]
    if f is None:
        return [], [Problem(str(path), None, "<file>", "no such file")]
    with f:
        for line, text in enumerate(f, 1):
            if not text.strip():
                continue
            bad = _BAD_BYTE.search(text)
            if bad is not None:
                byte = ord(bad.group()) - 0xDC00
                problems.append(
                    Problem(str(path), line, "<row>", f"not valid UTF-8 (byte 0x{byte:02x})")
                )
                continue
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                problems.append(
                    Problem(str(path), line, "<row>", f"malformed JSON: {e.msg} (column {e.colno})")
                )
                continue
            except RecursionError:  # json.loads raises it for JSON nested ~1000 deep
                problems.append(
                    Problem(str(path), line, "<row>", "malformed JSON: nested too deeply")
                )
                continue
            except ValueError:  # ...and this for an integer longer than int() converts
                problems.append(
                    Problem(
                        str(path), line, "<row>", "malformed JSON: a number with too many digits"
                    )
                )
                continue
            if not isinstance(data, dict):
                problems.append(Problem(str(path), line, "<row>", "expected a JSON object"))
                continue
            row_problems = _document_problems(data, str(path), line, first_seen)
            try:
                document = CorpusDocument.model_validate(
                    {k: v for k, v in data.items() if v is not None}
                )
            except ValidationError as e:
                row_problems += [
                    Problem(
                        str(path),
                        line,
                        # A field named "" (unknown) would leave the problem nameless.
                        ".".join(str(p) for p in err["loc"]) or "<row>",
                        "empty"
                        if err["type"] == "string_too_short"
                        else "missing"
                        if err["type"] == "missing"
                        else "unknown field"
                        if err["type"] == "extra_forbidden"
                        else err["msg"],
                    )
                    for err in e.errors()
                ]
            else:
                if not row_problems:
                    documents.append(document)
            problems += row_problems
    return documents, problems


def _document_problems(
    data: dict[str, Any], file: str, line: int, first_seen: dict[str, int]
) -> list[Problem]:
    problems = []
    doc_id = data.get("doc_id")
    if isinstance(doc_id, str) and doc_id:
        if doc_id in first_seen:
            problems.append(
                Problem(
                    file,
                    line,
                    "doc_id",
                    f"duplicate doc_id {doc_id!r} (first at line {first_seen[doc_id]})",
                )
            )
        else:
            first_seen[doc_id] = line
    url = data.get("url")
    if isinstance(url, str) and url:
        # A visit finds a page by its URL: of two documents at one URL it read the last only.
        seen_at = first_seen.setdefault(f"url\x1f{url}", line)
        if seen_at != line:
            problems.append(
                Problem(file, line, "url", f"duplicate url {url!r} (first at line {seen_at})")
            )
    language = data.get("language")
    if isinstance(language, str) and language and not known_language(language):
        problems.append(Problem(file, line, "language", f"unknown language {language!r}"))
    date = data.get("date")
    if isinstance(date, str) and date and not re.fullmatch(r"\d{4}(-\d{2}(-\d{2})?)?", date):
        problems.append(Problem(file, line, "date", f"expected YYYY[-MM[-DD]], got {date!r}"))
    return problems


class ProblemsError(ValueError):
    """Bad input; `problems` lists every one, the message shows the first 50."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        shown = "\n".join(str(p) for p in problems[:50])
        more = f"\n… and {len(problems) - 50} more" if len(problems) > 50 else ""
        super().__init__(f"{len(problems)} problem(s):\n{shown}{more}")


class CorpusError(ProblemsError):
    """A corpus with problems."""


@dataclass(frozen=True)
class Corpus:
    path: Path
    #: SHA-256 of the file's bytes: what a run's fingerprint, the search index and the tool
    #: cache's keys name the corpus by.
    digest: str
    documents: tuple[CorpusDocument, ...]


def open_corpus(path: Path) -> Corpus:
    """The corpus's documents and digest; CorpusError lists every problem. Parsed once per
    content in a process: `cts run` checks its corpus before writing config.yaml, and its search
    and visit backends then take the same documents."""
    try:
        digest = sha256_file(path) if path.is_file() else None
    except OSError:
        digest = None
    if digest is None:  # check_corpus names what is wrong with the file
        _, problems = check_corpus(path)
        raise CorpusError(problems or [Problem(str(path), None, "<file>", "cannot read")])
    documents_read, problems_read = _parsed(str(path), digest)
    if problems_read:
        raise CorpusError(list(problems_read))
    return Corpus(path, digest, documents_read)


@lru_cache(maxsize=1)
def _parsed(path: str, digest: str) -> tuple[tuple[CorpusDocument, ...], tuple[Problem, ...]]:
    documents, problems = check_corpus(Path(path))
    return tuple(documents), tuple(problems)


def load_corpus(path: Path) -> list[CorpusDocument]:
    return list(open_corpus(path).documents)
