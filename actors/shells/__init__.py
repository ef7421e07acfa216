"""The shells: what a person runs on top of the runtime.

``cli`` (the ``loopd`` command), ``repl`` (``loopd repl``), ``serve`` (``loopd serve``),
``service`` (its HTTP API and page, ``loopd serve --listen``), ``demo`` (the scripted demo),
``render`` (turn events as the live tree's lines) and ``views`` (stored sessions as a person
sees them).

Imports: anything below (``actors.runtime``, ``actors.aio``, ``actors.testing``, the adapters,
``core``, ``messages``); nothing imports the shells.
"""
