"""loopd's test kit: write message-level tests of your own agents with it.

- :class:`Probe`: an actor with an address that records what it receives and ``expect``\\ s.
- :class:`ScriptedModel`: an in-process model that answers from a script, recording requests.
- :class:`ChatServer`: a fake OpenAI-compatible server on 127.0.0.1, scripted the same way.
- :func:`reply`, :func:`call`, :func:`calls`: the answers a script is made of.
- :class:`Terminated`: what a probe that ``watch``\\ es an actor receives when it stops.
- The pytest plugin (installed with loopd) gives the fixtures ``loopd_runtime``,
  ``chat_server`` and ``probe``, and the ``--loopd-no-real-model`` switch.

Imports: ``actors.runtime`` and everything below it.
"""

from actors.testing.chat_server import ChatServer
from actors.testing.model import ScriptedModel
from actors.testing.probe import Probe, Terminated
from actors.testing.script import (
    Answer,
    RawResponse,
    ScriptBook,
    call,
    calls,
    reply,
    with_usage,
)

__all__ = [
    "Answer",
    "ChatServer",
    "Probe",
    "RawResponse",
    "ScriptBook",
    "ScriptedModel",
    "Terminated",
    "call",
    "calls",
    "reply",
    "with_usage",
]
