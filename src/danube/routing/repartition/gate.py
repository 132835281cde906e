"""The delivery gate: a target partition holds moved keys until their sources drained.

During a cutover, every target partition ``t`` served by this broker gets this gate as
``topic.delivery_gate``; the broker's subscriptions consult it once per fresh read
(``Subscription.read_fresh``: what is readable is cut at the gate's offset).  Per subscription the
gate holds offsets ``>= new_start[t]`` (everything unread while ``new_start`` is not recorded yet)
until every source of ``t`` has been consumed by that subscription up to its ``old_end``: on a grow
the new partition holds the moved keys until the source's pre-cutover backlog drained; on a
shrink the surviving partition holds offsets at/after the cutover until its merge sources drained.

Source progress is read from the live subscription when the source is served here, else from the
persisted cursor (``/topics/.../subscriptions/{sub}/cursor``, written every cursor flush interval).

A finalized transition's pending holds (``PartitioningState.pending``) gate the same way, for their
subscriptions only; a subscription is held from the lowest offset any of its gates holds.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from danube.metadata import keys

if TYPE_CHECKING:
    from danube.broker.service import BrokerService
from danube.routing.repartition.model import CUTOVER, PartitioningState, Transition

log = logging.getLogger(__name__)

_HOLD_ALL = -1


class PartitionGate:
    """Installed on one target partition's Topic for the duration of one cutover."""

    def __init__(self, topic_name: str, index: int, to_version: int | frozenset[int]) -> None:
        self.topic_name = topic_name
        self.index = index
        self.to_version = to_version  # what it gates on: the versions of the transitions (a new one: a new gate)
        self.holds: dict[str, int | None] = {}  # subscription -> hold-from offset (-1: all unread), None: released
        self.held_reads = 0

    def readable(self, sub: Any, readable_next: int) -> int:
        hold = self.holds.get(sub.name, _HOLD_ALL)
        if hold is None:
            return readable_next
        self.held_reads += 1
        if hold == _HOLD_ALL:
            return min(readable_next, sub.next_read)
        return min(readable_next, max(hold, sub.next_read))


class DeliveryGates:
    def __init__(self, broker: BrokerService, metadata: Any) -> None:
        self.broker = broker
        self.metadata = metadata
        self.gates: dict[str, PartitionGate] = {}  # partition topic name -> gate

    def install(self, base: str, state: PartitioningState | None) -> None:
        """At once (the fence's listener, before any batch under the new version is stored): a gate
        holding everything unread on every target partition of ``base`` served here."""
        t = state.transition if state is not None else None
        if state is None or t is None or t.phase != CUTOVER:
            return
        versions = _versions(state)
        for target in t.targets:
            self._install(f"{base}-part-{target}", target, versions)

    def _install(self, name: str, target: int, versions: frozenset[int]) -> PartitionGate | None:
        topic = self.broker.topics.get(name)
        if topic is None:
            return None
        gate = self.gates.get(name)
        if gate is None or not versions <= _as_set(gate.to_version):
            # a new cutover: every subscription held until evaluated; a hold that ended keeps the gate
            gate = self.gates[name] = PartitionGate(name, target, versions)
        if topic.delivery_gate is not gate:
            topic.delivery_gate = gate
        return gate

    def ensure(self, name: str, states: dict[str, PartitioningState]) -> None:
        """A partition was just opened or stored a batch: gate it if it is a target (a partition
        opened again is a new Topic: its gate goes on it, holds kept)."""
        gate = self.gates.get(name)
        served = self.broker.topics.get(name)
        if gate is not None and served is not None and served.delivery_gate is gate:
            return
        base, sep, index = name.rpartition("-part-")
        state = states.get(base) if sep else None
        if state is None or not index.isdigit():
            return
        if any(int(index) in t.targets for t, _ in state.gates()):
            self._install(name, int(index), _versions(state))

    async def tick(self, states: dict[str, PartitioningState]) -> None:
        wanted: set[str] = set()
        for base, state in list(states.items()):
            gates = state.gates()
            targets = {target for t, _ in gates for target in t.targets}
            for target in sorted(targets):
                name = f"{base}-part-{target}"
                gate = self._install(name, target, _versions(state))
                if gate is None:
                    continue
                wanted.add(name)
                await self._evaluate(base, gates, target, self.broker.topics[name], gate)
        for name in [n for n in self.gates if n not in wanted]:
            self._remove(name)

    async def _evaluate(
        self,
        base: str,
        gates: list[tuple[Transition, frozenset[str] | None]],
        target: int,
        topic: Any,
        gate: PartitionGate,
    ) -> None:
        for sub in list(topic.subscriptions.values()):
            if gate.holds.get(sub.name, _HOLD_ALL) is None:
                continue  # released: sources only move forward, gates only go away
            hold: int | None = None
            for t, subs in gates:
                if target not in t.targets or (subs is not None and sub.name not in subs):
                    continue
                if await self._drained(base, t, target, sub.name):
                    continue
                start = t.new_start.get(target)
                here = start if start is not None else _HOLD_ALL
                hold = here if hold is None else (_HOLD_ALL if _HOLD_ALL in (hold, here) else min(hold, here))
            if hold is None:
                gate.holds[sub.name] = None
                log.info("repartition: %s releases subscription %s (sources drained)", topic.name, sub.name)
                sub.notify()
            else:
                gate.holds[sub.name] = hold

    async def _drained(self, base: str, t: Transition, target: int, sub_name: str) -> bool:
        for source in t.sources_of(target):
            end = t.old_end.get(source)
            if end is None:
                return False
            consumed = await self._consumed(f"{base}-part-{source}", sub_name)
            if consumed is not None and consumed < end:
                return False
        return True

    async def _consumed(self, partition: str, sub_name: str) -> int | None:
        """The offset below which ``sub_name`` acked everything on ``partition`` (None: no such subscription)."""
        topic = self.broker.topics.get(partition)
        if topic is not None and not topic.closed:
            sub = topic.subscriptions.get(sub_name)
            if sub is not None:
                return sub.tracker.cursor + 1
        raw = await self.metadata.get(keys.subscription_cursor(partition, sub_name))
        if raw is None:
            return None
        try:
            return int(json.loads(raw.value)) + 1
        except (ValueError, TypeError):
            return None

    def _remove(self, name: str) -> None:
        self.gates.pop(name, None)
        topic = self.broker.topics.get(name)
        if topic is not None and topic.delivery_gate is not None:
            topic.delivery_gate = None
            for sub in list(topic.subscriptions.values()):
                sub.notify()


def _versions(state: PartitioningState) -> frozenset[int]:
    return frozenset(t.to_version for t, _ in state.gates())


def _as_set(versions: int | frozenset[int]) -> frozenset[int]:
    return versions if isinstance(versions, frozenset) else frozenset((versions,))
