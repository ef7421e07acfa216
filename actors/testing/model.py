"""ScriptedModel: an in-process model that answers from a script and records every request."""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Mapping, Sequence

from actors.models.base import ModelFailure
from actors.testing.script import Answer, ScriptBook
from messages import ModelAnswer, ModelRequest, Usage

__all__ = ["ScriptedModel"]


def _by_agent(book: ScriptBook[ModelRequest, Answer], request: ModelRequest) -> Answer:
    try:
        return book.answer(request.agent, request)
    except LookupError as exc:
        raise ModelFailure(f"the scripted model: {exc}") from None


Script = Sequence[Answer] | Callable[[ModelRequest], Answer]


class ScriptedModel:
    """A model for tests and the demo, behind the same interface as the HTTP client.

    ``script`` is a list of answers given in order (running out is a model error), or a function
    of the request. A function runs outside the model's lock, so it may block to hold a request
    in flight. Raise ``ModelFailure`` from it to answer a model error. A mapping gives one
    script per agent profile (``request.agent``): ``ScriptedModel({"default": [...],
    "researcher": [...]})``; a profile without one, or a list that ran out, is a model error.

    An in-process model has no llama.cpp slots: its requests run as they come. With
    ``uses_slots=True`` they take slots of the runtime's slot table, like the HTTP client's
    (``request.slot`` is then the slot granted).

    A script may block, so by default each request runs on a thread of the model service's
    pool. ``blocking=False`` promises that it never does: requests are then answered on the
    model service's loop, as the HTTP client's are, without a thread hop each way (the
    benchmarks use it; a script that blocks there would stall every model request).
    """

    def __init__(
        self,
        script: Script | Mapping[str, Script],
        *,
        uses_slots: bool = False,
        blocking: bool = True,
    ) -> None:
        if isinstance(script, Mapping):
            book: ScriptBook[ModelRequest, Answer] = ScriptBook(script)
            script = functools.partial(_by_agent, book)
        self._script: Script = script
        self.uses_slots = uses_slots
        self.blocking = blocking
        self._next = 0
        self._cond = threading.Condition()
        self._requests: list[ModelRequest] = []

    @property
    def requests(self) -> list[ModelRequest]:
        """Every request so far, in arrival order."""
        with self._cond:
            return list(self._requests)

    streams = True
    """A streamed request (``options.stream``) gets its answer's text in pieces too."""

    def complete(
        self, request: ModelRequest, on_text: Callable[[str], None] | None = None
    ) -> ModelAnswer:
        """Answer ``request`` from the script; with ``on_text`` (a streamed request) the
        answer's text is given to it first, a word at a time."""
        with self._cond:
            self._requests.append(request)
            self._cond.notify_all()
            if not callable(self._script):
                if self._next >= len(self._script):
                    raise ModelFailure(
                        f"the scripted model ran out of answers after {len(self._script)}"
                    )
                answer = self._script[self._next]
                self._next += 1
        if callable(self._script):
            answer = self._script(request)
        if on_text is not None and answer.content:
            for piece in re.findall(r"\S*\s*", answer.content):
                if piece:
                    on_text(piece)
        return ModelAnswer(
            request.session,
            request.request_id,
            answer.content,
            answer.tool_calls,
            usage=answer.usage or Usage(),
        )

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[ModelRequest]:
        """Block until ``n`` requests have arrived; AssertionError naming the count otherwise."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._requests) >= n, timeout):
                raise AssertionError(
                    f"expected {n} model requests within {timeout} s, got {len(self._requests)}"
                )
            return list(self._requests)

    def assert_complete(self) -> None:
        """Fail (``AssertionError``) if answers of a list script were left unused.

        Call it at the end of a test: a script longer than the conversation it drove usually
        means the turn took a path the test did not mean. A function script is always complete.
        """
        with self._cond:
            if callable(self._script) or self._next >= len(self._script):
                return
            unused = list(self._script[self._next :])
            used = self._next
        raise AssertionError(
            f"the scripted model used {used} of its {used + len(unused)} answers; "
            f"unused: {unused!r}"
        )

    def close(self) -> None:
        """Nothing to release."""
