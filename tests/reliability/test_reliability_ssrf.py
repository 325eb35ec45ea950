"""SSRF guard under hostile DNS: the connection goes to the address that was checked (no
second resolution to rebind), tunnelled IPv6 forms that embed a private IPv4 are refused, and
allow-list entries name a host and port."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anyio
import httpx
import pytest

from cts.webdancer.ssrf import BlockedURL, check_url
from cts.webdancer.visit import HttpPages

ARTICLE = (
    "<html><head><title>Night trains</title></head><body><article><h1>Night trains</h1>"
    + "<p>The sleeper leaves at 22:10 and arrives at 07:45.</p>" * 8
    + "</article></body></html>"
)


class Server:
    """A loopback HTTP server that records every request (path and Host header)."""

    def __init__(self, replies: dict[str, tuple[int, str, dict[str, str]]]) -> None:
        self.hits: list[tuple[str, str]] = []
        self.replies = replies
        hits, table = self.hits, replies

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append((self.path, self.headers.get("Host", "")))
                status, body, headers = table.get(self.path, (404, "", {}))
                data = body.encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def servers() -> Iterator[tuple[Server, Server]]:
    """(public, internal): `public` stands in for the checked public addresses; `internal`
    is this machine's loopback service that no fetch may reach."""
    html = {"Content-Type": "text/html; charset=utf-8"}
    public = Server({"/page": (200, ARTICLE, html)})
    internal = Server({"/secret": (200, ARTICLE.replace("22:10", "SECRET"), html)})
    yield public, internal
    public.httpd.shutdown()
    internal.httpd.shutdown()


@pytest.fixture
def connects(monkeypatch, servers) -> list[tuple[str, int]]:
    """Record every TCP connection httpx makes. The public test addresses (93.184.216.x, which
    the injected resolvers answer) are routed to the `public` server, so the test runs offline;
    every other host is connected to as asked (`localhost` reaches the `internal` server)."""
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(var, raising=False)
    public, _ = servers
    real = anyio.connect_tcp
    seen: list[tuple[str, int]] = []

    async def connect_tcp(remote_host, remote_port, **kwargs):  # type: ignore[no-untyped-def]
        seen.append((str(remote_host), remote_port))
        if str(remote_host).startswith("93.184.216."):
            remote_host, remote_port = "127.0.0.1", public.port
        return await real(remote_host, remote_port, **kwargs)

    monkeypatch.setattr(anyio, "connect_tcp", connect_tcp)
    return seen


def rebinding_resolver(public_ip: str = "93.184.216.34"):
    """A hostile DNS server: a public address on the first lookup, loopback afterwards."""
    calls: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        calls.append(host)
        return [public_ip] if len(calls) == 1 else ["127.0.0.1"]

    return resolver, calls


def test_dns_rebinding_connects_to_the_checked_address(servers, connects):
    pytest.importorskip("trafilatura")
    public, internal = servers
    resolver, _ = rebinding_resolver()
    # `localhost` is what the system resolver (httpx's own lookup) answers with 127.0.0.1.
    url = f"http://localhost:{internal.port}/page"
    page = asyncio.run(HttpPages(resolver=resolver).fetch(url))
    assert "22:10" in page.text and page.url == url
    assert connects == [("93.184.216.34", internal.port)]  # the checked address, pinned
    assert public.hits == [("/page", f"localhost:{internal.port}")]  # Host kept
    assert internal.hits == []


def test_each_redirect_hop_is_checked_and_pinned(servers, connects):
    pytest.importorskip("trafilatura")
    public, internal = servers
    port = public.port
    lookups: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        lookups.append(host)
        return {"news.example": ["93.184.216.34"], "cdn.example": ["93.184.216.35"]}.get(
            host, ["127.0.0.1"]
        )

    public.replies["/start"] = (302, "", {"Location": f"http://cdn.example:{port}/page"})
    public.replies["/evil"] = (302, "", {"Location": f"http://localhost:{internal.port}/secret"})
    pages = HttpPages(resolver=resolver)
    page = asyncio.run(pages.fetch(f"http://news.example:{port}/start"))
    assert page.url == f"http://cdn.example:{port}/page"
    assert lookups == ["news.example", "cdn.example"]  # one checked lookup per hop
    assert connects == [("93.184.216.34", port), ("93.184.216.35", port)]
    assert public.hits == [("/start", f"news.example:{port}"), ("/page", f"cdn.example:{port}")]
    with pytest.raises(BlockedURL, match="loopback"):
        asyncio.run(pages.fetch(f"http://news.example:{port}/evil"))
    assert internal.hits == []


# -- tunnelled IPv6 forms that embed an IPv4 address ---------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "2002:7f00:1::1",  # 6to4 of 127.0.0.1
        "2002:a9fe:a9fe::",  # 6to4 of 169.254.169.254
        "2002:a00:5::1",  # 6to4 of 10.0.0.5
        "2002:5db8:d822::1",  # 6to4 of a public address: a tunnel all the same
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
        "::ffff:127.0.0.1",  # IPv4-mapped
        "::ffff:a9fe:a9fe",
        "::7f00:1",  # IPv4-compatible 127.0.0.1
        "::a00:5",  # IPv4-compatible 10.0.0.5
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "64:ff9b:1::a00:5",  # local-use NAT64
    ],
)
def test_ipv6_forms_embedding_an_ipv4_address_are_refused(address):
    with pytest.raises(BlockedURL):
        check_url("http://tunnel.example/", resolver=lambda host, port: [address])


def test_nat64_of_a_public_address_is_allowed():
    # An IPv6-only network with DNS64 answers this for every IPv4-only site.
    check_url("http://site.example/", resolver=lambda host, port: ["64:ff9b::5db8:d822"])


# -- allow_hosts entries name host and port ------------------------------------------------------


def test_an_allow_hosts_entry_names_a_host_and_port():
    def resolver(host: str, port: int) -> list[str]:
        return ["10.1.2.3"]

    def allowed(url: str, *entries: str) -> bool:
        try:
            check_url(url, allow_hosts=entries, resolver=resolver)
        except BlockedURL:
            return False
        return True

    # A bare host allows the URL scheme's default port only.
    assert allowed("http://intranet.example/a", "intranet.example")
    assert allowed("https://Intranet.Example./a", "intranet.example")
    assert allowed("http://intranet.example:80/a", "intranet.example")
    assert not allowed("http://intranet.example:8080/a", "intranet.example")
    assert not allowed("https://intranet.example:80/a", "intranet.example")
    # host:port allows that port only.
    assert allowed("http://intranet.example:8080/a", "intranet.example:8080")
    assert not allowed("http://intranet.example/a", "intranet.example:8080")
    assert not allowed("http://intranet.example:9090/a", "intranet.example:8080")
    # IPv6 literals: bracketed with a port, or bare for the default port.
    assert allowed("http://[fd00::1]:8080/a", "[fd00::1]:8080")
    assert allowed("http://[fd00::1]/a", "fd00::1")
    assert not allowed("http://[fd00::1]:8080/a", "fd00::1")
    assert not allowed("http://other.example/a", "intranet.example")


def test_https_is_pinned_with_sni_and_host_naming_the_original_host(monkeypatch):
    """TLS still names (and verifies the certificate of) the URL's host, not the address."""
    sent: list[httpx.Request] = []

    async def send(self, request, **kwargs):  # type: ignore[no-untyped-def]
        sent.append(request)
        raise httpx.ConnectError("offline", request=request)

    monkeypatch.setattr(httpx.AsyncClient, "send", send)
    pages = HttpPages(resolver=lambda host, port: ["2606:2800:220:1::1", "93.184.216.34"])
    with pytest.raises(httpx.ConnectError):
        asyncio.run(pages.fetch("https://news.example:8443/a?b=1"))
    assert [str(r.url) for r in sent] == [
        "https://[2606:2800:220:1::1]:8443/a?b=1",  # each checked address in turn
        "https://93.184.216.34:8443/a?b=1",
    ]
    assert {r.headers["Host"] for r in sent} == {"news.example:8443"}
    assert {r.extensions["sni_hostname"] for r in sent} == {"news.example"}
