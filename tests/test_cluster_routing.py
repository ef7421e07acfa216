"""Which shard hosts what: plain functions, no Ray or PostgreSQL needed (the default suite)."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from actors import Config
from actors.cluster.routing import family_root, shard_of
from actors.cluster.shard import EventLog, shard_config
from actors.core.config import ClusterConfig, ConfigError, CronJob, HeartbeatConfig, StoreConfig
from messages import TurnEnded, TurnEvent, TurnStarted


@pytest.mark.parametrize(
    ("session", "root"),
    [
        ("mm-thread", "mm-thread"),
        ("sub-mm-thread-1", "mm-thread"),
        ("sub-sub-mm-thread-1-12", "mm-thread"),
        ("sub-a-b-3", "a-b"),
        ("sub-x", "sub-x"),  # not a child id: no number
        ("sub--1", "sub--1"),  # nothing between: not a child id
    ],
)
def test_a_family_root_is_the_top_level_id(session: str, root: str) -> None:
    assert family_root(session) == root


def test_a_family_lives_on_one_shard_and_families_spread() -> None:
    for shards in (1, 2, 3, 8):
        for top in ("mm-thread", "a", "x.y_z"):
            family = [top, f"sub-{top}-1", f"sub-sub-{top}-1-2", f"sub-{top}-40"]
            assert len({shard_of(s, shards) for s in family}) == 1
    spread = Counter(shard_of(f"family-{n}", 2) for n in range(1000))
    assert set(spread) == {0, 1} and min(spread.values()) > 400
    with pytest.raises(ValueError, match="shards must be >= 1"):
        shard_of("a", 0)


def test_each_scheduled_job_runs_on_exactly_one_shard(tmp_path) -> None:
    jobs = tuple(
        CronJob(session=f"job-{n}", schedule="0 7 * * *", prompt="morning") for n in range(20)
    )
    config = Config(
        home=str(tmp_path),
        store=StoreConfig(url="postgresql://loopd@127.0.0.1/loopd"),
        cluster=ClusterConfig(engine="ray", shards=3),
        cron=jobs,
        heartbeat=HeartbeatConfig(session="watch", every_s=60),
    )
    shards = [shard_config(config, i, 3) for i in range(3)]
    assert sorted(j.session for s in shards for j in s.cron) == sorted(j.session for j in jobs)
    assert [s.heartbeat is not None for s in shards].count(True) == 1
    for i, shard in enumerate(shards):
        assert shard.cluster.engine == "none"  # a shard runs one process's runtime
        assert shard.home == str(tmp_path / f"shard-{i}")
        assert all(shard_of(j.session, 3) == i for j in shard.cron)


def test_a_cluster_needs_a_shared_store() -> None:
    with pytest.raises(ConfigError, match=r"cluster\.engine needs a shared store"):
        Config.from_toml('[cluster]\nengine = "ray"\n')
    with pytest.raises(ConfigError, match=r"engine must be 'none' or 'ray'.*\$\.cluster"):
        Config.from_toml('[cluster]\nengine = "k8s"\n')
    with pytest.raises(ConfigError, match=r"url must start with postgresql://.*\$\.store"):
        Config.from_toml('[store]\nurl = "mysql://db/loopd"\n')


def test_the_event_log_hands_out_events_in_order_once() -> None:
    log = EventLog(kept=3)
    assert log.since(0, 0.0) == (0, [])
    events = [TurnStarted(session=f"s{n}", slot=0) for n in range(4)]
    events.append(TurnEnded(session="s3", completed=True))
    for event in events:
        log.append(event)
    last, items = log.since(0, 0.0)
    assert last == 5  # the oldest two were dropped: 3 are kept, as msgpack bytes
    assert [msgspec.msgpack.decode(b, type=TurnEvent) for b in items] == events[2:]
    last, items = log.since(4, 0.0)
    assert (last, len(items)) == (5, 1)
    assert log.since(5, 0.01) == (5, [])
