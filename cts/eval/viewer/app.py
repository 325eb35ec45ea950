"""The HTTP side of `cts view` (cts/eval/viewer/view.py): three static files and a JSON API, GET
only.

GET /                          the page (cts/eval/viewer/static/index.html)
GET /static/app.js, style.css
GET /api/ping                  {"ok": true}: what report.html probes
GET /api/runs                  the run directories served (records as each report counts
                               them, the others stored in `ignored`), and the filter values
GET /api/records?…             one page of the index (see cts.eval.viewer.index.parse_query; by
                               default the records config.yaml names: scope=out|all for more)
GET /api/instance?instance=ID  every record of one instance, in every run
GET /api/sample?run&instance&condition&seed   one record with its trace and nuggets (every
                               text cut at cts.eval.viewer.cuts.MAX_FIELD_CHARS, saying its length)
GET /api/raw?run&instance&condition&seed&part=record|trace   the record or trace file whole,
                               as plain text (what a cut text links to)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cts.eval.viewer.errors import NotFound, ViewError
from cts.eval.viewer.index import parse_query
from cts.eval.viewer.view import Viewer

#: The page, its script and its style.
STATIC = Path(__file__).with_name("static")

#: The page runs only its own script and style, and loads nothing from elsewhere: text that
#: escaped escaping still could not run.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
RAW_TYPE = "text/plain; charset=utf-8"
_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
}


class SecurityHeaders:
    """Every response carries SECURITY_HEADERS, the ones no route made too: a 404 of an
    unknown path, a 405, the 400 of a refused Host header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        await self.app(scope, receive, with_headers)


def _json(content: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(content, status_code=status, headers=SECURITY_HEADERS)


def _params(request: Request) -> dict[str, list[str]]:
    return {k: request.query_params.getlist(k) for k in request.query_params}


def _required(request: Request, name: str) -> str:
    value = request.query_params.get(name)
    if value is None:
        raise ViewError(f"{name}: missing")
    return value


def _whole(request: Request, name: str) -> int:
    value = _required(request, name)
    try:
        return int(value)
    except ValueError:
        raise ViewError(f"{name}: expected a whole number, got {value!r}") from None


def _record_key(request: Request) -> tuple[int, str, str, int]:
    """The record a request names: run, instance, condition and seed."""
    return (
        _whole(request, "run"),
        _required(request, "instance"),
        _required(request, "condition"),
        _whole(request, "seed"),
    )


def make_app(viewer: Viewer, hosts: list[str]) -> Starlette:
    files = {path: ((STATIC / name).read_bytes(), kind) for path, (name, kind) in _FILES.items()}

    async def static(request: Request) -> Response:
        body, kind = files[request.url.path]
        return Response(body, media_type=kind, headers=SECURITY_HEADERS)

    async def ping(request: Request) -> Response:
        return _json({"ok": True})

    async def runs(request: Request) -> Response:
        return _json({"runs": viewer.describe_runs(), "facets": viewer.facets()})

    async def records(request: Request) -> Response:
        query = parse_query(_params(request))
        return _json(await run_in_threadpool(viewer.index, query))

    async def instance(request: Request) -> Response:
        return _json({"records": viewer.keys(_required(request, "instance"))})

    async def sample(request: Request) -> Response:
        # Reads a trace and maybe the dataset: off the event loop.
        found = await run_in_threadpool(viewer.sample, *_record_key(request))
        return _json(found)

    async def raw(request: Request) -> Response:
        found = await run_in_threadpool(
            viewer.raw, *_record_key(request), _required(request, "part")
        )
        # Plain text (and nosniff): a browser shows it, and never runs it as a page.
        if isinstance(found, bytes):
            return Response(found, media_type=RAW_TYPE, headers=SECURITY_HEADERS)
        return FileResponse(found, media_type=RAW_TYPE, headers=SECURITY_HEADERS)

    async def bad_request(request: Request, exc: Exception) -> Response:
        return _json({"error": str(exc)}, 400)

    async def not_found(request: Request, exc: Exception) -> Response:
        return _json({"error": str(exc)}, 404)

    async def server_error(request: Request, exc: Exception) -> Response:
        # Sent by the outermost middleware, past SecurityHeaders: the headers are set here.
        return _json({"error": "internal error (see the viewer's log)"}, 500)

    routes = [Route(path, static, methods=["GET"]) for path in files]
    routes += [
        Route("/api/ping", ping, methods=["GET"]),
        Route("/api/runs", runs, methods=["GET"]),
        Route("/api/records", records, methods=["GET"]),
        Route("/api/instance", instance, methods=["GET"]),
        Route("/api/sample", sample, methods=["GET"]),
        Route("/api/raw", raw, methods=["GET"]),
    ]
    return Starlette(
        routes=routes,
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(TrustedHostMiddleware, allowed_hosts=hosts),
        ],
        exception_handlers={ViewError: bad_request, NotFound: not_found, Exception: server_error},
    )
