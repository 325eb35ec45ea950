"""How `cts view` listens: the socket, the Host headers it answers, and the server loop.
What it serves is cts/eval/viewer/view.py (the index and samples) through cts/eval/viewer/app.py
(the HTTP side, imported with uvicorn only when serving starts)."""

from __future__ import annotations

import ipaddress
import socket

from cts.eval.viewer.errors import ViewError
from cts.eval.viewer.view import Viewer

DEFAULT_PORT = 8765


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one); ViewError when it cannot be had."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ViewError(f"--host {host}: {e}") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise ViewError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def every_interface(address: str) -> bool:
    """Whether a bound address is the unspecified one (0.0.0.0, ::), however `--host` spelled
    it (`0`, `0x0`, `0.0`)."""
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_unspecified
    except ValueError:
        return False


def allowed_hosts(host: str, bound: str | None = None) -> list[str]:
    """The Host headers answered: loopback names only when serving on loopback, so that a
    web page cannot reach the viewer through a name it rebinds to 127.0.0.1. Serving on every
    interface (`bound`, the socket's address, is unspecified), any."""
    if host in ("0.0.0.0", "::", "") or (bound is not None and every_interface(bound)):
        return ["*"]
    return sorted({"127.0.0.1", "localhost", "::1", "[::1]", host})


def serve(viewer: Viewer, sock: socket.socket, host: str) -> None:
    """Answer requests on `sock` until interrupted."""
    import uvicorn

    from cts.eval.viewer.app import make_app

    hosts = allowed_hosts(host, sock.getsockname()[0])
    config = uvicorn.Config(make_app(viewer, hosts), log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
