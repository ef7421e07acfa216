"""A remote (A2A) child's decisions, as plain functions: what a card, a task or a part means.

The A2A service (``actors.services.a2a``) owns the network and the SDK; it hands these
functions JSON values (the card as the remote sent it, a task as ``MessageToDict`` gives it)
that have passed the bounded decode, and carries out what they say. Nothing here does I/O.

- :func:`card_interfaces`: the card's A2A 1.x JSON-RPC interfaces, or why it has none (a card
  of A2A 0.3 only counts as not 1.0); :func:`on_origin`: those a profile with ``headers_env``
  may send its headers to (its ``a2a_url``'s origin);
- :func:`task_step`: what a task in its state means for the child: keep waiting, completed with
  its artifacts' text, failed with ``<state>: <message>``, or (``INPUT_REQUIRED``) cancelled
  remotely and failed with the remote's question;
- :func:`parts_text`: parts as text (data parts as JSON text);
- :func:`remote_context_id`: the ``contextId`` a child's task is sent in, a session id any
  loopd serving A2A takes as its session.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import msgspec

from actors.core.bounded import check_text, check_value
from actors.core.text import cap_chars, neutralise

__all__ = [
    "MAX_CARD_BYTES",
    "MAX_TASK_BYTES",
    "TaskStep",
    "card_interfaces",
    "on_origin",
    "origin",
    "parts_text",
    "remote_context_id",
    "remote_reason",
    "remote_task_text",
    "task_step",
]

MAX_CARD_BYTES = 1 << 20
"""The largest agent card read (1 MiB); a longer one fails the child."""
MAX_TASK_BYTES = 8 << 20
"""The largest body of any other answer of a remote agent (8 MiB)."""

_WAITING = {"TASK_STATE_SUBMITTED", "TASK_STATE_WORKING", "TASK_STATE_UNSPECIFIED", ""}
_ASKING = {"TASK_STATE_INPUT_REQUIRED", "TASK_STATE_AUTH_REQUIRED"}
_ENDED = {"TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED"}
_ENDED |= {"TASK_STATE_REJECTED"}


def remote_task_text(child_text: str) -> str:
    """The task alone, as a remote child sends it: its first text without the ``It is
    <now>.`` line a local child's model gets (the remote keeps its own clock)."""
    head, sep, task = child_text.partition("\n\n")
    return task if sep and head.startswith("It is ") and head.endswith(".") else child_text


_CONTEXT_PREFIX = "loopd-"
_CONTEXT_MAX = 64  # a session id's bytes: a loopd serving A2A takes the contextId as one


def remote_context_id(child: str, token: str) -> str:
    """The A2A ``contextId`` of ``child``'s remote task: ``loopd-<child>-<token>``, the child's
    id cut so that the whole is at most 64 bytes. A loopd serving A2A takes a contextId as a
    top-level session id (never a ``sub-`` one, never over 64 bytes): a child's own id, or a
    long one, would be refused there. ``token`` (a few hex digits) keeps contexts apart."""
    room = _CONTEXT_MAX - len(_CONTEXT_PREFIX) - 1 - len(token)
    return f"{_CONTEXT_PREFIX}{child[: max(0, room)]}-{token}"


MAX_REASON_CHARS = 2000
"""The longest ``what`` of a reason: a remote's words are capped and neutralised (they reach a
person's terminal and the child's transcript)."""


def remote_reason(url: str, what: str) -> str:
    """The reason a remote child failed: its agent's URL and what went wrong (neutralised:
    no terminal escapes, control characters or chat-template tokens, at most 2,000 chars)."""
    return f"remote agent {url}: {cap_chars(neutralise(what), MAX_REASON_CHARS)}"


def card_interfaces(card: Any) -> list[dict[str, Any]] | str:
    """The card's A2A 1.x JSON-RPC interfaces (``supportedInterfaces`` entries), or why it
    has none: it is not a JSON object, lists no such interface, or speaks only A2A 0.3."""
    if not isinstance(card, Mapping):
        return "its agent card is not a JSON object"
    listed = card.get("supportedInterfaces")
    if not isinstance(listed, list) or not listed:
        version = card.get("protocolVersion")
        if isinstance(version, str):  # a 0.3 card names its version at the top
            return f"its agent card is A2A {version[:20]!r}, not 1.0 (no supportedInterfaces)"
        return "its agent card lists no supportedInterfaces (not an A2A 1.0 card)"
    found = [
        dict(entry)
        for entry in listed
        if isinstance(entry, Mapping)
        and entry.get("protocolBinding") == "JSONRPC"
        and isinstance(entry.get("protocolVersion"), str)
        and str(entry["protocolVersion"]).split(".")[0] == "1"
        and isinstance(entry.get("url"), str)
    ]
    if not found:
        return "its agent card has no A2A 1.x JSON-RPC interface (not A2A 1.0)"
    return found


def origin(url: str) -> tuple[str, str, int | None]:
    """``url``'s origin: scheme, host and port (the scheme's default port when none is given)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        port = {"http": 80, "https": 443}.get(parts.scheme.lower())
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


def on_origin(interfaces: list[dict[str, Any]], url: str) -> list[dict[str, Any]] | str:
    """The interfaces on ``url``'s origin, or why there is none: a profile's ``headers_env``
    values are sent to the origin of its ``a2a_url`` only, never where a card points."""
    home = origin(url)
    kept = [entry for entry in interfaces if origin(str(entry["url"])) == home]
    if kept:
        return kept
    other = str(interfaces[0]["url"])[:200]
    return (
        f"its agent card's interface {other!r} is on another origin; with headers_env, "
        "loopd sends requests only to the origin of a2a_url"
    )


def parts_text(parts: Any) -> str:
    """Parts as one text: text parts as they are, data parts as JSON text, one per line; a
    raw or url part is named, not fetched."""
    if not isinstance(parts, Sequence):
        return ""
    out: list[str] = []
    for part in parts:
        if not isinstance(part, Mapping):
            continue
        if isinstance(part.get("text"), str):
            out.append(part["text"])
        elif "data" in part:
            data = _whole_numbers(check_value(part["data"]))
            out.append(msgspec.json.encode(data).decode())
        elif isinstance(part.get("url"), str):
            out.append(f"[file: {part['url'][:200]}]")
        elif "raw" in part:
            out.append("[binary part]")
    return "\n".join(out)


def _whole_numbers(value: Any) -> Any:
    """``value`` with each whole double made an int again (A2A data parts carry numbers as
    doubles: ``3`` arrives as ``3.0``). Its depth was checked already."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class TaskStep:
    """What a task's state means: ``done`` (completed or failed), ``cancel`` (cancel it
    remotely first), ``text`` (a completed task's answer) and ``what`` (why it failed)."""

    done: bool
    completed: bool = False
    cancel: bool = False
    text: str = ""
    what: str = ""


def _status_text(task: Mapping[str, Any]) -> str:
    status = task.get("status")
    message = status.get("message") if isinstance(status, Mapping) else None
    parts = message.get("parts") if isinstance(message, Mapping) else None
    return parts_text(parts)


def task_step(task: Any, cap: int) -> TaskStep:
    """What ``task`` (a Task as JSON, its values checked already) means for the child; the
    texts are capped at ``cap`` characters and checked as valid Unicode."""
    if not isinstance(task, Mapping):
        return TaskStep(True, what="it answered something that is not a task")
    status = task.get("status")
    state = status.get("state", "") if isinstance(status, Mapping) else ""
    state = state if isinstance(state, str) else ""
    if state in _WAITING:
        return TaskStep(False)
    said = check_text(_status_text(task), "the task's status message")[:cap]
    short = state.removeprefix("TASK_STATE_")
    if state in _ASKING:
        question = said or "(no question given)"
        return TaskStep(True, cancel=True, what=f"{short}: it asked for input: {question}")
    if state == "TASK_STATE_COMPLETED":
        artifacts = task.get("artifacts")
        texts = [
            parts_text(a.get("parts"))
            for a in (artifacts if isinstance(artifacts, list) else [])
            if isinstance(a, Mapping)
        ]
        text = "\n".join(t for t in texts if t) or said
        return TaskStep(True, completed=True, text=check_text(text, "the task's artifacts")[:cap])
    if state in _ENDED:
        return TaskStep(True, what=f"{short}: {said}" if said else short)
    return TaskStep(True, cancel=True, what=f"its task is in an unknown state {state[:40]!r}")
