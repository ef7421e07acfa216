"""The service's listen address (``[serve] listen``, ``loopd serve --listen``): parsing and
whether it is loopback. Pure text rules: nothing is resolved or bound here."""

from __future__ import annotations

import ipaddress

__all__ = ["format_listen", "is_loopback", "parse_listen"]


def parse_listen(text: str, what: str = "serve.listen") -> tuple[str, int]:
    """``HOST:PORT`` (``127.0.0.1:8321``, ``[::1]:8321``, ``localhost:0``) as ``(host, port)``.

    Raises ``ValueError`` naming ``what`` for anything else: no port, a port outside 0-65535,
    an empty host, or an IPv6 address without brackets.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit():
        raise ValueError(f"{what} must be HOST:PORT (127.0.0.1:8321, say), not {text!r}")
    number = int(port)
    if number > 65535:
        raise ValueError(f"{what}: the port must be 0 to 65535, not {number}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{what}: {host!r} in brackets is not an IPv6 address") from None
    elif ":" in host:
        raise ValueError(f"{what}: write an IPv6 address in brackets ([::1]:8321), not {text!r}")
    if not host or any(c.isspace() or c in "/@?#" for c in host):
        raise ValueError(f"{what}: not a host name or address: {host!r}")
    return host, number


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``); any other
    name counts as reachable from elsewhere, since what it resolves to can change."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def format_listen(host: str, port: int) -> str:
    """``host:port`` as a URL's authority (an IPv6 address in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
