"""Refuse fetches that would reach this machine, its network or a cloud metadata service.

Checked after resolving the name (every address it resolves to must be public) and again for
every redirect target; `check_url` returns the checked addresses and the fetcher connects to
one of them rather than resolving the name again (a DNS server that answers a public address
for the check and 127.0.0.1 for the connection, "DNS rebinding", gains nothing). Hosts on the
allow-list skip the check (a user's own intranet mirror); an entry names `host:port`, or `host`
alone for the scheme's default port (80/443). The numeric forms that resolvers accept (decimal
`2130706433`, octal `0177.0.0.1`, hex `0x7f.1`) are normalised by the resolver before the
check, so they cannot slip through; IPv6 forms that carry an IPv4 address (IPv4-mapped, NAT64)
are judged by that address, and the tunnel forms (6to4, Teredo, IPv4-compatible) are refused.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

Resolver = Callable[[str, int], list[str]]

#: Metadata endpoints that are not in a private range (AWS/GCP/Azure use 169.254.169.254,
#: which link-local already covers).
_METADATA = {
    ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
    ipaddress.ip_address("fd00:ec2::254"),  # AWS over IPv6
}


_NAT64 = (ipaddress.ip_network("64:ff9b::/96"),)  # well-known prefix: IPv4 in the last 32 bits
#: IPv6 forms that tunnel to an IPv4 address (which may be private) or are deprecated for it.
_TUNNELS = (
    (ipaddress.ip_network("2002::/16"), "a 6to4 address (it tunnels to an embedded IPv4)"),
    (ipaddress.ip_network("2001::/32"), "a Teredo address (it tunnels to an embedded IPv4)"),
    (ipaddress.ip_network("::/96"), "an IPv4-compatible address"),
)


class BlockedURL(ValueError):
    """The URL may not be fetched; the message says why."""


def system_resolver(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except socket.gaierror as e:
        raise BlockedURL(f"cannot resolve {host!r}: {e}") from e
    return [str(info[4][0]) for info in infos]


def _forbidden(address: str) -> str | None:
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        elif any(ip in net for net in _NAT64):
            ip = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        elif int(ip) > 1:  # `::` and `::1` get their own labels below
            for net, label in _TUNNELS:
                if ip in net:
                    return label
    if ip in _METADATA:
        return "a cloud metadata address"
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return "a site-local address"  # fec0::/10: deprecated, still routed inside some sites
    for flag, label in (
        ("is_loopback", "a loopback address"),
        ("is_private", "a private address"),
        ("is_link_local", "a link-local address"),
        ("is_multicast", "a multicast address"),
        ("is_reserved", "a reserved address"),
        ("is_unspecified", "an unspecified address"),
    ):
        if getattr(ip, flag):
            return label
    if isinstance(ip, ipaddress.IPv4Address) and ip in ipaddress.ip_network("100.64.0.0/10"):
        return "a shared (carrier-grade NAT) address"
    return None


_HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*")


def allow_entry(entry: str) -> tuple[str, int | None]:
    """`host:port`, `[v6]:port`, `host` or a bare IPv6 literal -> (host, port or None);
    ValueError naming the entry for anything else (`:80`, `a:1:2`, `[x]`, `host:0`)."""
    text = entry.strip()
    host, port, v6 = text, "", False
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port, v6 = rest.removeprefix(":"), True
        if (rest and not rest.startswith(":")) or rest == ":":
            raise ValueError(f"allow_hosts entry {entry!r}: expected [address]:port")
    elif text.count(":") == 1:
        host, port = text.split(":")
        if not port:
            raise ValueError(f"allow_hosts entry {entry!r}: no port after ':'")
    elif ":" in text:
        v6 = True  # a bare IPv6 literal
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"allow_hosts entry {entry!r}: bad port")
    host = host.lower().rstrip(".")
    if v6:
        try:
            ipaddress.IPv6Address(host.split("%")[0])
        except ValueError:
            raise ValueError(f"allow_hosts entry {entry!r}: not an IPv6 address") from None
    elif not _HOST_NAME.fullmatch(host):
        raise ValueError(f"allow_hosts entry {entry!r}: expected host, host:port or [IPv6]:port")
    return host, int(port) if port else None


def _allowed(host: str, port: int, default_port: int, allow_hosts: Iterable[str]) -> bool:
    host = host.lower().rstrip(".")
    for entry in allow_hosts:
        entry_host, entry_port = allow_entry(entry)
        if entry_host == host and port == (default_port if entry_port is None else entry_port):
            return True
    return False


def check_url(
    url: str, allow_hosts: Iterable[str] = (), resolver: Resolver = system_resolver
) -> list[str]:
    """Raise BlockedURL unless `url` is http(s) and every address of its host is public.

    Returns the checked addresses: connect to one of them, not to the name (resolving it again
    could answer differently). An allow-listed `host:port` is not resolved: returns []."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise BlockedURL(f"{url}: only http and https URLs are fetched")
    host = parts.hostname
    if not host:
        raise BlockedURL(f"{url}: no host")
    default_port = 443 if parts.scheme == "https" else 80
    try:
        port = parts.port or default_port
    except ValueError as e:
        raise BlockedURL(f"{url}: bad port") from e
    if _allowed(host, port, default_port, allow_hosts):
        return []
    addresses = resolver(host, port)
    if not addresses:
        raise BlockedURL(f"{url}: {host!r} resolves to no address")
    for address in addresses:
        reason = _forbidden(address)
        if reason:
            raise BlockedURL(f"{url}: {host!r} resolves to {address}, {reason}; refused")
    return list(dict.fromkeys(addresses))
