"""The report as one self-contained page (report.html): the Markdown's tables as HTML tables, the
figures inlined as base64, and the block that links each system into a running `cts view`.

Apart from the Markdown (cts/eval/report/markdown.py), which it renders and does not write: the
page changes with how it is shown in a browser or printed. The viewer's script is a static file
(cts/eval/report/static/viewer.js), read as the package's data.
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Sequence
from functools import cache
from importlib import resources
from pathlib import Path

from cts.eval.report.markdown import row_cells

#: Where report.html looks for a running `cts view` (the page's `?viewer=URL` overrides it).
VIEWER_URL = "http://127.0.0.1:8765"

#: The page's style sheet.
_STYLE = (
    "body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:"
    "collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:"
    "right}td:first-child,th:first-child{text-align:left}img{max-width:100%}"
    ".viewer{background:#eef4ff;padding:.2em 1em}"
    # Printed (A4): no viewer links, and no figure or table row cut across two pages.
    "@media print{.viewer,.viewer-link{display:none}body{margin:0;max-width:none}"
    "figure,tr,img{break-inside:avoid}h1,h2{break-after:avoid}}"
)


@cache
def _viewer_script() -> str:
    """The script that probes the viewer; only if it answers, it links each system's row and
    cells into it. Offline, or with no viewer up, the page is unchanged. The run list is JSON
    data, never markup. `__VIEWER_URL__` in it stands for VIEWER_URL; the file's closing
    newline is not the page's."""
    script = resources.files("cts.eval.report").joinpath("static", "viewer.js")
    return script.read_text("utf-8").rstrip()


def _viewer_block(runs: Sequence[tuple[str, Path]]) -> str:
    listed = [{"name": name, "path": str(path)} for name, path in runs]
    # JSON inside <script>: `<` escaped so that no text in it can close the element.
    data = json.dumps(listed, ensure_ascii=False).replace("<", "\\u003c")
    script = _viewer_script().replace("__VIEWER_URL__", VIEWER_URL)
    return (
        '<div id="cts-viewer" class="viewer" hidden><p>The records behind these numbers, '
        'in <code>cts view</code> at <span id="cts-viewer-url"></span>:</p>'
        '<ul id="cts-viewer-links"></ul></div>'
        f'<script type="application/json" id="cts-viewer-runs">{data}</script>'
        f"<script>{script}</script>"
    )


def _inline(text: str) -> str:
    """Escaped text with its `code` spans as <code> and **bold** as <strong>: the Markdown
    the report writes inline."""
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", text)


def _table(rows: list[list[str]]) -> str:
    """A Markdown table's rows (its separator row left out) as an HTML table, the first the
    header."""
    head, *rest = rows
    return (
        "<table><tr>"
        + "".join(f"<th>{_inline(c)}</th>" for c in head)
        + "</tr>"
        + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rest)
        + "</table>"
    )


def _figure(image: Path) -> str:
    """A PNG inlined as base64, captioned with its name."""
    data = base64.b64encode(image.read_bytes()).decode()
    return (
        f'<figure><img alt="{image.stem}" src="data:image/png;base64,{data}">'
        f"<figcaption>{image.stem}</figcaption></figure>"
    )


def to_html(markdown_text: str, images: list[Path], runs: Sequence[tuple[str, Path]] = ()) -> str:
    """A self-contained page: the Markdown tables as HTML tables, figures inlined as base64.
    With `runs` (each system's name and run directory), links into `cts view` appear when
    one is running."""
    body: list[str] = []
    rows: list[list[str]] = []
    items: list[str] = []

    def flush() -> None:
        if rows:
            body.append(_table(rows))
            rows.clear()
        if items:
            body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>")
            items.clear()

    for line in markdown_text.splitlines():
        if line.startswith("|"):
            cells = row_cells(line)
            if not all(set(c) <= {"-"} for c in cells):
                rows.append(cells)
            continue
        if line.startswith("- "):
            items.append(line[2:])
            continue
        flush()
        if line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
            if runs:
                body.append(_viewer_block(runs))
        elif line.strip():
            body.append(f"<p>{_inline(line)}</p>")
    flush()
    body += [_figure(image) for image in images]
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>Clarify-Then-Search report"
        f"</title><style>{_STYLE}</style></head><body>{''.join(body)}</body></html>"
    )
