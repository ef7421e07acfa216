"""The flags of the ``loopd`` commands that can go through a service, and what the commands
share below ``cli`` (the timeout's exit status, the ``--output-schema`` reader), with nothing
imported: building the ``loopd`` parser (``loopd --help``) costs none of the client."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_TOKEN_ENV", "EXIT_TIMEOUT", "add_client_flags", "read_output_schema"]

EXIT_TIMEOUT = 124
"""``loopd run --timeout`` gave up waiting (as timeout(1) does); distinct from bad input's 2.
``loopd approvals --wait --timeout`` exits with it too when no call came to wait."""

DEFAULT_TOKEN_ENV = "LOOPD_TOKEN"
"""The variable ``--connect`` reads the token from when ``--token-env`` names none."""


def add_client_flags(p: argparse.ArgumentParser) -> None:
    """``--connect URL`` and ``--token-env NAME`` on a command that can go through a service."""
    p.add_argument("--connect", metavar="URL", help="go through the loopd service at URL")
    p.add_argument(
        "--token-env",
        metavar="NAME",
        help=f"with --connect: the variable holding its token (default {DEFAULT_TOKEN_ENV})",
    )


def read_output_schema(path: Path | None) -> dict[str, Any] | None:
    """``run --output-schema FILE``: the JSON schema in FILE, checked before anything starts
    (``ValueError`` naming the file)."""
    if path is None:
        return None
    import msgspec

    from actors.core.output import SchemaError, final_answer_spec

    try:
        schema = msgspec.json.decode(path.read_bytes())
        final_answer_spec(schema)
    except (msgspec.DecodeError, SchemaError) as exc:
        raise ValueError(f"--output-schema {path}: {exc}") from None
    assert isinstance(schema, dict)
    return schema
