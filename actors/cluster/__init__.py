"""loopd on a Ray cluster: shard actors that host runtimes over a shared PostgreSQL store.

``Runtime.start(config)`` with ``[cluster] engine = "ray"`` returns a :class:`ClusterRuntime`;
see docs/cluster.md. The runtime finds :class:`ClusterRuntime` through the ``loopd.engines``
entry point, never by import.

Imports: ``actors.runtime`` and everything below it.
"""

from actors.cluster.routing import family_root, shard_of
from actors.cluster.runtime import ClusterRuntime, ShardStartError

__all__ = ["ClusterRuntime", "ShardStartError", "family_root", "shard_of"]
