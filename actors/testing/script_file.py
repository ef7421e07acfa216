"""Scripts in a file, and ``python -m actors.testing.chat_server --script FILE``.

Start the fake server on its own to try a supervisor (or ``loopd run``) by hand, offline::

    $ python -m actors.testing.chat_server --script answers.json --port 8089
    serving http://127.0.0.1:8089/v1 (3 answers)

The file is a JSON array, one model answer per item, used in order: a string is an answer
with that text (it ends the turn); an object has ``content`` and/or ``tool_calls``, each call
``{"name": ..., "arguments": {...}}`` (arguments as an object or as raw JSON text)::

    [{"tool_calls": [{"name": "subagent", "arguments": {"task": "look it up"}}]},
     "found it",
     "Here is what the child found."]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from actors.testing.script import Answer, reply
from messages import ProposedCall

__all__ = ["load_script"]


class _Call(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    arguments: str | dict[str, Any] = msgspec.field(default_factory=dict)


class _Answer(msgspec.Struct, forbid_unknown_fields=True):
    content: str | None = None
    tool_calls: list[_Call] = msgspec.field(default_factory=list)


def load_script(path: str | Path) -> list[Answer]:
    """Read a script file (see the module's doc); ``ValueError`` naming the file and the place."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the script {path}: {exc.strerror or exc}") from None
    try:
        items = msgspec.json.decode(raw, type=list[str | _Answer])
    except msgspec.ValidationError as exc:
        raise ValueError(f"the script {path} is not valid: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ValueError(f"the script {path} is not JSON: {exc}") from None
    answers: list[Answer] = []
    for item in items:
        if isinstance(item, str):
            answers.append(reply(item))
            continue
        calls = tuple(
            ProposedCall(
                c.name, c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments)
            )
            for c in item.tool_calls
        )
        answers.append(Answer(content=item.content, tool_calls=calls))
    return answers
