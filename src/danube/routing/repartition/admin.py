"""Admin operations of live repartition (``danube admin topics repartition | describe``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from danube.metadata import keys
from danube.routing.repartition.controller import consumed_of, global_adoption
from danube.routing.repartition.model import CUTOVER, PartitioningState, waiting_for
from danube.routing.repartition.store import RepartitionStore

if TYPE_CHECKING:
    from danube.broker.service import BrokerService


async def repartition(broker: BrokerService, topic: str, partitions: int) -> dict[str, Any]:
    """Grow or shrink ``topic`` to ``partitions``: marker, version bump (the cutover), adoption stamp."""
    keys.split_topic(topic)
    store = RepartitionStore(broker.metadata)
    await store.repartition(topic, partitions, now_ms=int(time.time() * 1000))
    return await describe(broker, topic)


async def describe(broker: BrokerService, topic: str) -> dict[str, Any]:
    """Version, generation, marker and drain state; NotFoundError for a topic that is not partitioned."""
    store = RepartitionStore(broker.metadata)
    stored = await store.require(topic)
    state = stored.state
    t = state.transition
    drained = bool(
        t is not None
        and t.phase == CUTOVER
        and (t.drain_complete_ms is not None or state.drained(await consumed_of(broker.metadata, topic, state)))
    )
    cluster = broker.cluster
    live = list(cluster.view.registered) if cluster is not None else [broker.broker_id]
    adoption = await global_adoption(broker.metadata, live)
    return {
        "name": topic,
        "partitions": state.partitions,
        "partitioning_version": state.version,
        "generation": stored.revision,
        "marker": t.to_dict() if t is not None else None,
        "drained": drained,
        "retired": list(state.retired),
        "global_adoption": adoption,
        "adoption_generation": t.adoption_generation if t is not None else None,
        "progress": await progress(broker.metadata, topic, state, adoption),
    }


async def progress(metadata: Any, topic: str, state: PartitioningState, adoption: int | None) -> dict[str, Any]:
    """What the transition in cutover waits for and the pending holds, each subscription still behind
    named with its offsets (``waiting_for``, model.waiting_for)."""
    out: dict[str, Any] = {}
    t = state.transition
    if t is not None and t.phase == CUTOVER:
        unrecorded = {
            "old_end": sorted(s for s in t.sources if s not in t.old_end),
            "new_start": sorted(x for x in t.targets if x not in t.new_start),
        }
        if unrecorded["old_end"] or unrecorded["new_start"]:
            out["unrecorded"] = unrecorded
        if t.drain_complete_ms is None:
            out["waiting"] = waiting_for(t, await consumed_of(metadata, topic, t))
        elif not state.adopted(adoption):
            out["adoption"] = {
                "wanted": t.adoption_generation,
                "fleet": adoption,
                "drain_complete_ms": t.drain_complete_ms,
            }
    if state.pending:
        out["pending"] = []
        for hold in state.pending:
            behind = waiting_for(hold.transition, await consumed_of(metadata, topic, hold.transition))
            out["pending"].append(
                {
                    "to_version": hold.transition.to_version,
                    "to_partitions": hold.transition.to_partitions,
                    "subscriptions": list(hold.subscriptions),
                    "waiting": [w for w in behind if w["subscription"] in hold.subscriptions],
                }
            )
    return out
