"""Admin operations of live repartition (``danube admin topics repartition | describe``)."""

from __future__ import annotations

import time
from typing import Any

from danube.metadata import keys
from danube.routing.repartition.controller import consumed_of, global_adoption
from danube.routing.repartition.model import CUTOVER
from danube.routing.repartition.store import RepartitionStore


async def repartition(broker: Any, topic: str, partitions: int) -> dict[str, Any]:
    """Grow or shrink ``topic`` to ``partitions``: marker, version bump (the cutover), adoption stamp."""
    keys.split_topic(topic)
    store = RepartitionStore(broker.metadata)
    await store.repartition(topic, partitions, now_ms=int(time.time() * 1000))
    return await describe(broker, topic)


async def describe(broker: Any, topic: str) -> dict[str, Any]:
    """Version, generation, marker and drain state; NotFoundError for a topic that is not partitioned."""
    store = RepartitionStore(broker.metadata)
    stored = await store.require(topic)
    state = stored.state
    t = state.transition
    drained = bool(t is not None and t.phase == CUTOVER
                   and (t.drain_complete_ms is not None
                        or state.drained(await consumed_of(broker.metadata, topic, state))))
    cluster = getattr(broker, "cluster", None)
    live = list(cluster.view.registered) if cluster is not None else [getattr(broker, "broker_id", "standalone")]
    return {"name": topic, "partitions": state.partitions, "partitioning_version": state.version,
            "generation": stored.revision, "marker": t.to_dict() if t is not None else None,
            "drained": drained, "retired": list(state.retired),
            "global_adoption": await global_adoption(broker.metadata, live),
            "adoption_generation": t.adoption_generation if t is not None else None}
