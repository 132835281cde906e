"""Adoption labels and the finalizer.

Every broker writes its adoption label ``/routing/adoption/{broker_id}`` =
``{"lowest": <lowest acked generation or null>, "at": <ms>}`` whenever its tracker changes and at
every report interval.  The finalizer runs on the cluster leader (on a standalone broker: itself)
and for every topic in transition:

1. reads the persisted cursors of the transition's source partitions (every subscription);
   ``drained`` when every source is consumed up to its ``old_end``: stamps ``drain_complete_ms``;
2. ``global_adoption`` = the minimum label over *live* brokers (registered in the cluster view;
   a dead broker's frozen label is ignored; no label anywhere: None);
3. finalizes once ``drained and (adopted or adoption timed out)`` (model.can_finalize), with the
   leader guard on every write.

A subscription nobody consumes would keep a transition from ever draining.  One whose consumed
position on the sources has not moved for the idle window (the adoption timeout) counts as idle:
the grow or shrink drains without it and finalizes with it as a pending hold (its gate stays, for
it only, until it consumed the sources; then the finalizer drops it).  A consumer that comes back
after a shrink finalized attaches to the retired partitions too (they stay listed), so it drains
them (docs/repartition.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Callable, Iterable, Mapping

from danube.metadata import keys
from danube.metadata.store import Compare, MetadataStore
from danube.routing.repartition.model import (
    CUTOVER,
    DEFAULT_ADOPTION_TIMEOUT_MS,
    PartitioningState,
    Transition,
    lagging,
    waiting_for,
)
from danube.routing.repartition.store import RepartitionStore
from danube.routing.repartition.topology import AdoptionTracker

log = logging.getLogger(__name__)

STALL_LOG_MS = 10_000  # a subscription not moving on the sources for this long is named in the log


def now_ms() -> int:
    return int(time.time() * 1000)


async def global_adoption(metadata: MetadataStore, live: Iterable[str]) -> int | None:
    """The minimum adoption label over the live brokers that have one (None: no signal)."""
    live = set(live)
    lowest: int | None = None
    for kv in await metadata.get_prefix(keys.routing_adoption_prefix()):
        broker_id = kv.key.rsplit("/", 1)[-1]
        if broker_id not in live:
            continue  # a dead broker's label is frozen at its departed clients: ignored
        try:
            value = json.loads(kv.value).get("lowest")
        except (ValueError, AttributeError):
            continue
        if isinstance(value, int) and (lowest is None or value < lowest):
            lowest = value
    return lowest


async def consumed_of(
    metadata: MetadataStore, topic: str, state: PartitioningState | Transition
) -> dict[str, dict[int, int]]:
    """Per subscription, per source partition of the transition (of ``state``): the offset below
    which everything is acked (persisted cursor + 1)."""
    t = state.transition if isinstance(state, PartitioningState) else state
    out: dict[str, dict[int, int]] = {}
    if t is None:
        return out
    for s in sorted(t.sources):
        part = f"{topic}-part-{s}"
        prefix = keys.topic_subscriptions(part)
        for kv in await metadata.get_prefix(prefix):
            rest = kv.key[len(prefix) :]
            if not rest.endswith("/cursor") or rest.count("/") != 1:
                continue
            sub = rest.split("/", 1)[0]
            try:
                cursor = json.loads(kv.value)
            except ValueError:
                continue
            if isinstance(cursor, int):
                out.setdefault(sub, {})[s] = cursor + 1
    # a subscription known on some source but absent on another has nothing there: drained there
    return out


class AdoptionReporter:
    """Writes this broker's adoption label on change and every ``interval_s``."""

    def __init__(
        self, metadata: MetadataStore, broker_id: str, tracker: AdoptionTracker, *, interval_s: float = 5.0
    ) -> None:
        self.metadata = metadata
        self.broker_id = broker_id
        self.tracker = tracker
        self.interval_s = interval_s
        self.written: int | None | str = "never"

    async def report_once(self) -> None:
        lowest = self.tracker.lowest()
        await self.metadata.put_json(keys.routing_adoption(self.broker_id), {"lowest": lowest, "at": now_ms()})
        self.written = lowest

    async def run(self) -> None:
        while True:
            self.tracker.changed.clear()
            try:
                await self.report_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001
                log.warning("writing the adoption label failed", exc_info=True)
            try:  # asyncio.timeout, not wait_for: 3.11's wait_for can swallow the stop's cancellation (gh-86296)
                async with asyncio.timeout(self.interval_s):
                    await self.tracker.changed.wait()
            except TimeoutError:
                pass


class Finalizer:
    def __init__(
        self,
        store: RepartitionStore,
        states: Callable[[], Mapping[str, PartitioningState]],
        *,
        is_leader: Callable[[], bool],
        live_brokers: Callable[[], Iterable[str]],
        guard: Callable[[], list[Compare]] = list,
        adoption_timeout_ms: int = DEFAULT_ADOPTION_TIMEOUT_MS,
        interval_s: float = 0.25,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.store = store
        self.metadata = store.metadata
        self._states = states
        self._is_leader = is_leader
        self._live = live_brokers
        self._guard = guard
        self.adoption_timeout_ms = adoption_timeout_ms
        self.interval_s = interval_s
        self._clock = clock
        self.finalized: list[dict[str, Any]] = []
        # (topic, to_version, subscription) -> (its consumed positions on the sources, since when)
        self._progress: dict[tuple[str, int, str], tuple[tuple, int]] = {}
        self.stall_log_ms = STALL_LOG_MS
        # (topic, to_version, subscription) -> (its position on the sources, unchanged since, last logged)
        self._stalls: dict[tuple[str, int, str], tuple[tuple, int, int]] = {}

    def _idle(
        self, topic: str, t: Transition, subs: list[str], consumed: Mapping[str, Mapping[int, int]], now: int
    ) -> bool:
        """Every one of ``subs`` has not moved on the sources for the idle window (as seen here)."""
        idle = True
        for sub in subs:
            key = (topic, t.to_version, sub)
            position = tuple(sorted(consumed.get(sub, {}).items()))
            seen = self._progress.get(key)
            if seen is None or seen[0] != position:
                self._progress[key] = (position, now)
                idle = False
            elif now - seen[1] < self.adoption_timeout_ms:
                idle = False
        return idle

    async def tick(self) -> list[str]:
        """One pass over the topics in transition; the topics it finalized."""
        if not self._is_leader():
            return []
        done = []
        for topic, state in list(self._states().items()):
            if state.pending:
                await self._release_holds(topic, state)
            t = state.transition
            if t is None:
                continue
            if t.phase != CUTOVER:
                await self.store.resume(topic, compare=self._guard())  # a marker left by a crash
                continue
            now = self._clock()
            behind: list[str] = []
            if t.offsets_recorded:
                consumed = await consumed_of(self.metadata, topic, t)
                behind = lagging(t, consumed)
                if t.drain_complete_ms is None:
                    self._report_stalls(topic, t, consumed, now, "the cutover")
            if t.drain_complete_ms is None:
                if not t.offsets_recorded:
                    continue
                if behind and not self._idle(topic, t, behind, consumed, now):
                    continue
                state = (await self.store.mark_drain_complete(topic, now, compare=self._guard())).state
                log.info(
                    "repartition of %s to %d partitions: drained%s",
                    topic,
                    t.to_partitions,
                    f" but for idle subscriptions {behind}" if behind else "",
                )
            adoption = await global_adoption(self.metadata, self._live())
            if state.can_finalize(now, adoption, adoption_timeout_ms=self.adoption_timeout_ms):
                adopted = state.adopted(adoption)
                held = behind
                await self.store.finalize(topic, lagging=held, compare=self._guard())
                self.finalized.append(
                    {
                        "topic": topic,
                        "to_partitions": t.to_partitions,
                        "adopted": adopted,
                        "global_adoption": adoption,
                        "at": now,
                        "held": held,
                    }
                )
                log.info(
                    "repartition of %s to %d partitions finalized (%s)%s",
                    topic,
                    t.to_partitions,
                    "adopted" if adopted else "adoption timed out",
                    f"; the gate stays for {held} until they drained" if held else "",
                )
                done.append(topic)
                for key in [k for k in self._progress if k[0] == topic and k[1] == t.to_version]:
                    del self._progress[key]
                for key in [k for k in self._stalls if k[:2] == (topic, t.to_version) and k[2] not in held]:
                    del self._stalls[key]
        return done

    def _report_stalls(
        self,
        topic: str,
        t: Transition,
        consumed: Mapping[str, Mapping[int, int]],
        now: int,
        what: str,
        only: Iterable[str] | None = None,
    ) -> None:
        """Names in the log a subscription whose consumed position on the sources has not moved for
        ``stall_log_ms``, with the offsets it waits for (again every 6 windows while it lasts)."""
        behind: dict[str, list[dict[str, Any]]] = {}
        for w in waiting_for(t, consumed):
            if only is None or w["subscription"] in only:
                behind.setdefault(w["subscription"], []).append(w)
        for key in [k for k in self._stalls if k[:2] == (topic, t.to_version) and k[2] not in behind]:
            del self._stalls[key]
        for sub, waits in behind.items():
            key = (topic, t.to_version, sub)
            position = tuple((w["partition"], w["consumed"]) for w in waits)
            seen = self._stalls.get(key)
            if seen is None or seen[0] != position:
                self._stalls[key] = (position, now, now)
                continue
            _, since, logged = seen
            # named once the window passed, then once a minute or so (a pending hold may last days)
            if now - since >= self.stall_log_ms and (logged == since or now - logged >= 6 * self.stall_log_ms):
                self._stalls[key] = (position, since, now)
                log.warning(
                    "repartition of %s to %d partitions: %s waits for subscription %s, not moved for %.0f s: %s",
                    topic,
                    t.to_partitions,
                    what,
                    sub,
                    (now - since) / 1000,
                    "; ".join(
                        f"partition {w['partition']} consumed below {w['consumed']}, needs {w['old_end']}"
                        for w in waits
                    ),
                )

    async def _release_holds(self, topic: str, state: PartitioningState) -> None:
        consumed = {
            h.transition.to_version: await consumed_of(self.metadata, topic, h.transition) for h in state.pending
        }
        for h in state.pending:
            self._report_stalls(
                topic,
                h.transition,
                consumed[h.transition.to_version],
                self._clock(),
                "a pending hold",
                only=h.subscriptions,
            )
        if state.release_holds(consumed) != state:
            new = (await self.store.release_holds(topic, consumed, compare=self._guard())).state
            log.info(
                "repartition of %s: pending holds now %s",
                topic,
                [(h.transition.to_version, h.subscriptions) for h in new.pending],
            )

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001
                log.warning("repartition finalizer pass failed", exc_info=True)
            await asyncio.sleep(self.interval_s)
