"""The flags of the ``loopd`` commands that can go through a service, with nothing imported:
building the ``loopd`` parser (``loopd --help``) costs none of the client."""

from __future__ import annotations

import argparse

__all__ = ["DEFAULT_TOKEN_ENV", "add_client_flags"]

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
