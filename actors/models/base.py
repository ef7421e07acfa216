"""What the model service needs of a model: the two client protocols and their one error.

:class:`ChatModel` (a blocking ``complete``) and :class:`AsyncChatModel` (a coroutine
``acomplete`` on the model loop) are the interface; :class:`~actors.models.http.HttpChatModel`
and the test kit's ``ScriptedModel`` are implementations beside it. Every failure is a
:class:`ModelFailure` whose message names the cause, ready to go into a ``ModelError``.
"""

from __future__ import annotations

from typing import Protocol

from messages import ModelAnswer, ModelRequest

__all__ = ["AsyncChatModel", "ChatModel", "ModelFailure"]


class ModelFailure(Exception):
    """A model request failed; ``str(failure)`` is a human sentence naming the cause.

    ``context_exceeded`` is true when the server refused the prompt as longer than its context;
    ``context_tokens`` is then that context's size, when the server said it.
    """

    def __init__(
        self, message: str, *, context_exceeded: bool = False, context_tokens: int | None = None
    ) -> None:
        super().__init__(message)
        self.context_exceeded = context_exceeded
        self.context_tokens = context_tokens

    cut = False
    """True when the last attempt was cut off (a deadline, a body over the cap) while the
    server may still be working on it: its slot must rest before the next request."""


class ChatModel(Protocol):
    """Anything that answers chat-completions requests: the HTTP client, or a scripted fake.

    The model service runs ``complete`` on a bounded pool of threads, so it may block. A model
    may also have ``uses_slots = False`` (an in-process model: no llama.cpp slots to guard);
    without it, requests take slots of the slot table like the HTTP client's.
    """

    def complete(self, request: ModelRequest) -> ModelAnswer:
        """Answer ``request``, blocking; raise :class:`ModelFailure` when that is impossible."""
        ...

    def close(self) -> None:
        """Release the model's resources (connections); ``complete`` may not be called after."""
        ...


class AsyncChatModel(Protocol):
    """A model whose requests are coroutines: the model service awaits ``acomplete`` on its
    loop, and cancels the task when nobody waits for the answer any more."""

    async def acomplete(self, request: ModelRequest) -> ModelAnswer:
        """Answer ``request``; raise :class:`ModelFailure` when that is impossible."""
        ...

    async def aclose(self) -> None:
        """Release what the running loop holds (its connections); the model may be used again
        from another loop."""
        ...

    def close(self) -> None:
        """Release everything; no request may be made after."""
        ...
