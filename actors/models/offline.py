"""A switch for tests: any runtime that would send requests to a real model fails loudly.

Turn it on with :func:`forbid_real_models`, the environment variable ``LOOPD_NO_REAL_MODEL=1``,
or the pytest option ``--loopd-no-real-model`` (ini: ``loopd_no_real_model = true``). Then
``Runtime.start`` without ``model=`` raises :class:`RealModelForbidden` naming the endpoint,
unless that endpoint is one of the test kit's fake ``ChatServer``\\ s running in this process.
"""

from __future__ import annotations

import os
import threading

__all__ = [
    "ENV_VAR",
    "RealModelForbidden",
    "allow_fake_server",
    "check_real_model",
    "forbid_real_models",
    "real_models_forbidden",
]

ENV_VAR = "LOOPD_NO_REAL_MODEL"

_lock = threading.Lock()
_forbidden = False
_fake_servers: dict[str, int] = {}  # base URL -> how many running servers have it


class RealModelForbidden(RuntimeError):
    """A runtime would have talked to a real model while real models are forbidden."""


def forbid_real_models(forbid: bool = True) -> None:
    """Forbid (or allow again) runtimes that talk to a real model endpoint."""
    global _forbidden
    with _lock:
        _forbidden = forbid


def real_models_forbidden() -> bool:
    """True when the switch is on, by :func:`forbid_real_models` or ``LOOPD_NO_REAL_MODEL``."""
    with _lock:
        if _forbidden:
            return True
    return os.environ.get(ENV_VAR, "").strip().lower() not in ("", "0", "false", "no")


def allow_fake_server(base_url: str, running: bool) -> None:
    """The test kit's ``ChatServer`` says it serves (or no longer serves) ``base_url``."""
    key = base_url.rstrip("/")
    with _lock:
        count = _fake_servers.get(key, 0) + (1 if running else -1)
        if count > 0:
            _fake_servers[key] = count
        else:
            _fake_servers.pop(key, None)


def check_real_model(base_url: str) -> None:
    """Raise :class:`RealModelForbidden` if the switch is on and ``base_url`` is not a fake."""
    if not real_models_forbidden():
        return
    with _lock:
        fake = base_url.rstrip("/") in _fake_servers
    if not fake:
        raise RealModelForbidden(
            f"this test would send model requests to {base_url}, and real models are forbidden "
            f"here ({ENV_VAR} or --loopd-no-real-model); give Runtime.start a model= "
            "(actors.testing.ScriptedModel) or point model.base_url at an actors.testing.ChatServer"
        )
