"""A shard's outbox on a real PostgreSQL: an event reaches the driver only once it is stored;
what a dead shard process left unacknowledged is handed over by the next one, each event once;
a clean stop leaves the outbox empty."""

from __future__ import annotations

import msgspec
import psycopg
import pytest

from actors.cluster.shard import EventLog
from actors.stores.postgres import PgSessionStore
from messages import TurnStarted

WAIT = 30.0

pytestmark = pytest.mark.timeout(120)


def started(n: int) -> TurnStarted:
    return TurnStarted(session=f"s{n}", slot=None)


def sessions(items: list[bytes]) -> list[str]:
    return [msgspec.msgpack.decode(data, type=TurnStarted).session for data in items]


def rows(url: str, owner: str) -> list[int]:
    with psycopg.connect(url) as conn:
        found = conn.execute(
            "SELECT seq FROM loopd_outbox WHERE owner = %s ORDER BY seq", (owner,)
        ).fetchall()
    return [seq for (seq,) in found]


def test_a_dead_shards_unacknowledged_events_are_handed_over_once(pg_url: str) -> None:
    first = EventLog(outbox=PgSessionStore(pg_url), owner="home/shard-0")
    assert first.base == 0
    for n in range(1, 6):
        first.append(started(n))
    last, items = first.since(0, WAIT)  # handed over only once stored
    assert last == 5 and sessions(items) == ["s1", "s2", "s3", "s4", "s5"]
    assert rows(pg_url, "home/shard-0") == [1, 2, 3, 4, 5]

    # The driver asks after 2: it acknowledges s1 and s2, whose rows go.
    first.since(2, 0.0)
    assert first.flush(WAIT) == 5
    assert rows(pg_url, "home/shard-0") == [3, 4, 5]

    # The process dies here (nothing closed). Its next process reads what is left...
    second = EventLog(outbox=PgSessionStore(pg_url), owner="home/shard-0")
    assert (second.base, second.handed_over) == (5, 3)
    second.append(started(6))  # ...and numbers on after it
    assert second.flush(WAIT) == 6
    # A driver that had acknowledged 2 gets s3 to s6; one that had seen s5 gets s6 alone.
    last, items = second.since(2, WAIT)
    assert last == 6 and sessions(items) == ["s3", "s4", "s5", "s6"]
    assert sessions(second.since(5, 0.0)[1]) == ["s6"]
    # Another shard's rows are its own.
    other = EventLog(outbox=PgSessionStore(pg_url), owner="home/shard-1")
    assert other.base == 0 and other.since(0, 0.0) == (0, [])
    other.close(0, WAIT)

    # A clean close acknowledges everything: nothing is left to hand over.
    second.close(6, WAIT)
    assert rows(pg_url, "home/shard-0") == []
    third = EventLog(outbox=PgSessionStore(pg_url), owner="home/shard-0")
    assert (third.base, third.handed_over) == (0, 0)
    third.close(0, WAIT)


def test_an_event_waits_for_a_store_that_is_back(pg_url: str) -> None:
    store = PgSessionStore(pg_url)
    log = EventLog(outbox=store, owner="home/shard-0")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # Every write of the outbox fails while the table is locked away from it.
        conn.execute("BEGIN")
        conn.execute("LOCK TABLE loopd_outbox IN ACCESS EXCLUSIVE MODE")
        log.append(started(1))
        assert log.since(0, 0.5) == (0, [])  # not stored: not handed over
        conn.execute("COMMIT")
    last, items = log.since(0, WAIT)
    assert last == 1 and sessions(items) == ["s1"]
    log.close(1, WAIT)
