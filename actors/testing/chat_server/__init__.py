"""The fake OpenAI-compatible chat-completions server of the test kit.

- ``server``: :class:`ChatServer` and the slow steps (:class:`Delayed`, :class:`Drip`,
  :class:`Endless`), for tests that cross real HTTP.
- ``cli`` (and ``__main__``): ``python -m actors.testing.chat_server --script FILE [--port N]
  [--log FILE]``, the server on its own, answering from a script file
  (:mod:`actors.testing.script_file`).

Imports: the rest of ``actors.testing`` and ``actors.models.offline``; nothing imports
``__main__``, so runpy runs it without a warning.
"""

from actors.testing.chat_server.cli import main
from actors.testing.chat_server.server import (
    ChatServer,
    Closed,
    Delayed,
    Drip,
    Endless,
    ScriptFunction,
    Step,
    sse_body,
)

__all__ = [
    "ChatServer",
    "Closed",
    "Delayed",
    "Drip",
    "Endless",
    "ScriptFunction",
    "Step",
    "main",
    "sse_body",
]
