"""Small pieces the fault-injection tests share: scripted loopback HTTP servers, corpus rows and
`cts run` arguments."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class QuietHandler(BaseHTTPRequestHandler):
    """A scripted server's request handler: whole replies in one call, no access log in pytest's
    output."""

    def send_body(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        """Answer `status` with `data` (JSON unless `headers` say otherwise), its length set."""
        self.send_response(status)
        if headers is None:
            headers = {"Content-Type": "application/json"}
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_json(self, status: int, payload: object) -> None:
        """Answer `status` with `payload` as JSON, as the real servers do."""
        self.send_body(status, json.dumps(payload).encode())

    def log_message(self, format: str, *args: object) -> None:
        """Silenced: a line per request would bury what a failing test prints."""


@contextmanager
def loopback_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve `handler` on a free loopback port (tests stay offline); yields its base URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def corpus_rows(titles: list[str], texts: list[str]) -> list[dict[str, str]]:
    """Corpus documents d0, d1, … at https://x.example/0, …: a test only picks their words."""
    return [
        {"doc_id": f"d{i}", "url": f"https://x.example/{i}", "title": title, "text": text}
        for i, (title, text) in enumerate(zip(titles, texts, strict=True))
    ]


def write_jsonl(path: Path, rows: Iterable[object]) -> Path:
    """Write `rows` to `path` one JSON line each, as dataset and corpus files are read."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def cts_run_args(run_dir: Path, limit: int, *sets: str) -> list[str]:
    """`cts run` of the first `limit` instances into `run_dir`, each of `sets` a `--set`."""
    overrides = [arg for override in sets for arg in ("--set", override)]
    return ["run", "--output-dir", str(run_dir), "--limit", str(limit), *overrides]
