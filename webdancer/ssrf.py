"""Refuse fetches that would reach this machine, its network or a cloud metadata service.

Checked after resolving the name (every address it resolves to must be public) and again for
every redirect target. Hosts on the allow-list skip the check (a user's own intranet mirror).
The numeric forms that resolvers accept (decimal `2130706433`, octal `0177.0.0.1`, hex
`0x7f.1`, IPv4-mapped IPv6) are normalised by the resolver before the check, so they cannot
slip through.
"""

from __future__ import annotations

import ipaddress
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


class BlockedURL(ValueError):
    """The URL may not be fetched; the message says why."""


def system_resolver(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except socket.gaierror as e:
        raise BlockedURL(f"cannot resolve {host!r}: {e}") from e
    return [str(info[4][0]) for info in infos]


def _forbidden(address: str) -> str | None:
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip in _METADATA:
        return "a cloud metadata address"
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


def check_url(
    url: str, allow_hosts: Iterable[str] = (), resolver: Resolver = system_resolver
) -> None:
    """Raise BlockedURL unless `url` is http(s) and every address of its host is public."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise BlockedURL(f"{url}: only http and https URLs are fetched")
    host = parts.hostname
    if not host:
        raise BlockedURL(f"{url}: no host")
    if host.lower().rstrip(".") in {h.lower() for h in allow_hosts}:
        return
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:
        raise BlockedURL(f"{url}: bad port") from e
    addresses = resolver(host, port)
    if not addresses:
        raise BlockedURL(f"{url}: {host!r} resolves to no address")
    for address in addresses:
        reason = _forbidden(address)
        if reason:
            raise BlockedURL(f"{url}: {host!r} resolves to {address}, {reason}; refused")
