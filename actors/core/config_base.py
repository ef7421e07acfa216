"""The ground of every config table: ``ConfigError``, the value checks and the ``Section`` base.

Each table of :mod:`actors.core.config` is a :class:`Section`: a frozen msgspec Struct whose
values are checked when it is built, from TOML or in Python alike. The checks that more than one
table uses (a wait in seconds, a model URL, a backend name, a path text, a top-level session)
live here too.
"""

from __future__ import annotations

import ipaddress
import math
import re
from typing import Any, ClassVar
from urllib.parse import urlsplit

import msgspec

from actors.core.text import redact
from messages import check_top_level_session

__all__ = [
    "BACKENDS",
    "ENV_NAME",
    "MAX_CONFIG_BYTES",
    "MAX_INT",
    "MAX_SECONDS",
    "ConfigError",
    "Section",
    "check_backend",
    "check_base_url",
    "check_path_text",
    "check_top_level",
    "check_value",
    "check_wait",
]

MAX_SECONDS = 365 * 24 * 3600
"""The longest time any ``*_s`` key (and ``--timeout``) may say: 365 days."""

MAX_CONFIG_BYTES = 1 << 20
"""The largest config file ``Config.load`` reads (1 MiB)."""

MAX_INT = 2**63 - 1
_MAX_URL_CHARS = 2048
_MAX_HOST_CHARS = 253
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_IPV4_STYLE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+")


class ConfigError(ValueError):
    """A configuration file or value is wrong; the message names the key."""


def check_wait(value: object, what: str) -> float | None:
    """``value`` as seconds to wait: None (no limit) or a finite number above 0 and at most
    :data:`MAX_SECONDS`; ``ValueError`` naming ``what`` otherwise (``inf``, ``nan``, ``-1``, ``0``,
    ``1e308``, a bool or a text)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
        raise ValueError(
            f"{what} must be a finite number of seconds above 0 and at most "
            f"{MAX_SECONDS} (365 days), not {value!r}"
        )
    return float(value)


def check_base_url(url: str, key: str = "model.base_url") -> str:
    """Return ``url`` if it can be the base of every model request; ``ConfigError`` naming
    ``key`` otherwise.

    It must be ``http://`` or ``https://`` with a host, at most 2,048 characters, with no
    whitespace or control character, no query or fragment, a valid port, and a host of at most
    253 characters that is a valid IPv4 address (when it looks like one), a valid IPv6 address
    (in brackets) or a name that IDNA can encode. Credentials in it are redacted from the error
    text.
    """
    shown = repr(redact(url)[:80] + ("…" if len(url) > 80 else ""))

    def refuse(why: str) -> ConfigError:
        return ConfigError(f"{key} {shown} is not a usable URL: {why}")

    if len(url) > _MAX_URL_CHARS:
        raise refuse(f"it is longer than {_MAX_URL_CHARS} characters")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise refuse("it holds whitespace or a control character")
    try:
        parts = urlsplit(url)
        port = parts.port  # a port out of range or not a number raises here
        host = parts.hostname
    except ValueError as exc:
        raise refuse(str(exc)) from None
    if parts.scheme not in ("http", "https"):
        raise refuse("it must start with http:// or https://")
    if not host:
        raise refuse("it has no host")
    if len(host) > _MAX_HOST_CHARS:
        raise refuse(f"its host is longer than {_MAX_HOST_CHARS} characters")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise refuse("it must not have a query or a fragment")
    if port == 0:
        raise refuse("port 0 is not a port a server listens on")
    why = _host_fault(parts.netloc.rpartition("@")[2], host)
    if why is not None:
        raise refuse(why)
    return url


def _host_fault(hostport: str, host: str) -> str | None:
    """What is wrong with the host of a URL (``hostport``: its authority without the user
    part; ``host``: urlsplit's lower-cased host, brackets removed), or None."""
    if hostport.startswith("["):
        rest = hostport.partition("]")[2]
        if rest and not rest.startswith(":"):
            return f"invalid port: {rest!r}"
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"invalid IPv6 address: {host!r}"
        return None
    if _IPV4_STYLE.fullmatch(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return f"invalid IPv4 address: {host!r}"
        return None
    if host.isascii():
        return None
    return _idna_fault(host)


def _idna_fault(host: str) -> str | None:
    """Why IDNA cannot encode the non-ASCII ``host``, or None: by the ``idna`` package (IDNA
    2008, what the model client's URLs use; imported only here) where it is installed, else by
    the standard library's codec (IDNA 2003)."""
    try:
        import idna
    except ImportError:  # pragma: no cover - yarl, a dependency, brings it
        try:
            host.encode("idna")
        except UnicodeError:
            return f"invalid IDNA hostname: {host!r}"
        return None
    try:
        idna.encode(host)
    except idna.IDNAError:
        return f"invalid IDNA hostname: {host!r}"
    return None


BACKENDS = ("llama.cpp", "openai")
"""The values of ``model.backend`` (and a profile's ``backend``)."""


def check_backend(value: str, key: str) -> None:
    """``ConfigError`` naming ``key`` unless ``value`` is one of :data:`BACKENDS`."""
    if value not in BACKENDS:
        raise ConfigError(f"{key} must be one of {', '.join(BACKENDS)}, not {value!r}")


def check_path_text(value: str, key: str) -> None:
    """``ConfigError`` naming ``key`` for a path that is empty or holds a NUL character."""
    if not value:
        raise ConfigError(f"{key} must not be empty")
    if "\x00" in value:
        raise ConfigError(f"{key} must not hold a NUL character")


def check_value(key: str, value: Any) -> None:
    """The rules msgspec's constraints do not state: finite floats, bounded ints and seconds,
    text that is valid Unicode."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number, not {value!r}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if key.endswith("_s") and value > MAX_SECONDS:
            raise ConfigError(
                f"{key} must be at most {MAX_SECONDS} seconds (365 days), not {value!r}"
            )
        if abs(value) > MAX_INT:
            raise ConfigError(f"{key} is too large: {value!r}")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(f"{key} is not valid Unicode text (index {exc.start})") from None


class Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A config table. Every value is checked when the table is built, from TOML or in Python
    alike: msgspec's constraints (which it enforces only when decoding) and the rules of
    :func:`check_value`. A value of the right kind is normalised (an int given for a float
    becomes a float, a list for a tuple a tuple)."""

    _key: ClassVar[str] = ""
    """The table's name in TOML (``model``), for the key names of errors."""

    def __post_init__(self) -> None:
        prefix = f"{self._key}." if self._key else ""
        for name, kind in _field_types(type(self)):
            key = prefix + name
            value = getattr(self, name)
            try:
                checked = msgspec.convert(value, type=kind, strict=True)
            except msgspec.ValidationError as exc:
                raise ConfigError(f"{key}: {exc}") from None
            check_value(key, checked)
            if checked is not value:
                msgspec.structs.force_setattr(self, name, checked)


_FIELD_TYPES: dict[type, tuple[tuple[str, Any], ...]] = {}


def _field_types(cls: type[Section]) -> tuple[tuple[str, Any], ...]:
    """``(name, type)`` of each field of ``cls``; computed once per class (msgspec evaluates
    the annotations afresh on every ``fields`` call, which would make each Config cost ms)."""
    found = _FIELD_TYPES.get(cls)
    if found is None:
        found = tuple((f.name, f.type) for f in msgspec.structs.fields(cls))
        _FIELD_TYPES[cls] = found
    return found


def check_top_level(session: str, key: str) -> None:
    """``ConfigError`` naming ``key`` unless ``session`` is a valid top-level session id."""
    try:
        check_top_level_session(session)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None
