"""Dispatched pykka actors: many actors on a small shared pool of threads.

A :class:`pykka.ThreadingActor` owns one OS thread for its whole life. A
:class:`DispatchedActor` owns none: its messages wait in its mailbox, and when there are some,
the mailbox is queued on its :class:`Dispatcher`, whose few threads take mailboxes in turn and
run each for at most ``throughput`` messages before queuing it again behind the others (the way
Akka's dispatchers work). So ten thousand idle actors cost memory, not threads, and one busy
actor cannot starve the rest. A message a handler sends to another actor is run next on the
same thread (a run-next slot, as in Go's and Tokio's schedulers), not handed to a sleeping
thread: a chain of actors telling each other costs no thread wake-ups, and after
``RUN_NEXT_LIMIT`` links the chain waits its turn in the queue like everyone else.

Every pykka promise holds: ``ActorRef``, ``tell``, ``ask``, proxies, the ``ActorRegistry``,
``on_start`` / ``on_stop`` / ``on_failure``, one message at a time per actor, messages in the
order they were sent, and ``ActorDeadError`` for a dead actor. One actor never runs on two
threads at once (it may run on different threads over its life). A handler must not block for
long: it holds a thread other actors need. Blocking work belongs to an actor with a thread of
its own.

Beside the dispatcher stand ``directory`` (addresses: how actors name each other in messages),
``inbox`` (a pykka inbox on a C ``SimpleQueue`` for the actors that own a thread), ``caller``
(a waiting caller's own thread lent to the dispatcher, Ctrl-C held while handlers run on it)
and ``loop_inbox`` (messages told from any thread to an asyncio loop, one wake-up a burst).

This package is loopd's, but it imports nothing of loopd: only pykka and the standard library.
"""

from actors.dispatcher._actor import DispatchedActor
from actors.dispatcher._pool import (
    DEFAULT_THROUGHPUT,
    RUN_NEXT_LIMIT,
    Dispatcher,
    DispatcherClosed,
    TimerHandle,
    default_threads,
)

__all__ = [
    "DEFAULT_THROUGHPUT",
    "RUN_NEXT_LIMIT",
    "DispatchedActor",
    "Dispatcher",
    "DispatcherClosed",
    "TimerHandle",
    "default_threads",
]
