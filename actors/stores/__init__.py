"""Session stores: where sessions, their transcripts and counters are kept.

``base`` is the interface (:class:`StoreBackend`, the store errors and records); ``sql`` the
session logic of both SQL stores, written once over the small ``dialect`` of each database
(with ``background_rows``, the rows of background subagents, and ``remote_rows``, the rows of
remote A2A children); beside them ``sqlite`` (the
default, one file under ``home``), ``postgres`` (``[store] url``), ``reader`` (a read-only
SQLite view for commands that only read), ``memory`` (the ``MEMORY.md`` source and the entry
checks of ``remember``), ``lock`` (one runtime per home) and ``open`` (the only module that
picks a dialect).

Imports: ``core`` and ``messages``; never an actor plane.
"""
