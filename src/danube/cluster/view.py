"""Every broker's view of the cluster: one watch on ``/cluster/`` kept in memory.

Loaded with one prefix read, then followed from the revision after that read
(no change is missed or seen twice, across etcd restarts too).  Holds the
registered brokers, topic assignments (topic → broker and broker → topics),
unassigned markers (with their mod_revision, for compare-and-swap), load
reports and the leader id.  Coroutines can wait for a condition on it
(:meth:`ClusterView.wait_for`); listeners get every event after it is applied.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable, Coroutine

from danube._tasks import cancel_and_wait
from danube.cluster.load_report import LoadReport
from danube.errors import InvalidArgumentError
from danube.metadata import keys
from danube.metadata.store import CompactedError, MetadataStore, WatchEvent

log = logging.getLogger(__name__)

CLUSTER_PREFIX = keys.cluster_prefix()


def _json(value: bytes | None) -> Any:
    if not value:
        return None
    try:
        return json.loads(value)
    except ValueError:
        return None


class ClusterView:
    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.registered: dict[str, dict] = {}  # broker id → registration info
        self.assignments: dict[str, str] = {}  # topic → broker id
        self.broker_topics: dict[str, set[str]] = {}  # broker id → topics
        self.broker_states: dict[str, str] = {}  # broker id → active | draining | drained
        self.unassigned: dict[str, tuple[Any, int]] = {}  # topic → (marker JSON or None, mod_revision)
        self.loads: dict[str, LoadReport] = {}  # broker id → latest LoadReport
        self.leader: str | None = None
        self.revision = 0
        self.listeners: list[Callable[[WatchEvent], None]] = []
        self._changed = asyncio.Event()
        self._owner_waiters: dict[str, list[asyncio.Future]] = {}  # topic → lookups waiting for an owner
        self._task: asyncio.Task | None = None
        self.ready = asyncio.Event()

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        revision = await self._load()
        self.ready.set()
        self._task = asyncio.get_running_loop().create_task(self._follow(revision + 1), name="cluster-view")

    async def _load(self) -> int:
        """(Re)read everything under /cluster/; the revision of that read."""
        kvs, revision = await self.store.get_prefix_with_revision(CLUSTER_PREFIX)
        self.registered.clear()
        self.assignments.clear()
        self.broker_topics.clear()
        self.broker_states.clear()
        self.unassigned.clear()
        self.loads.clear()
        self.leader = None
        for kv in kvs:
            self._apply("put", kv.key, kv.value, kv.mod_revision)
        self.revision = revision
        return revision

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _follow(self, start: int) -> None:
        while True:
            try:
                async for event in self.store.watch(CLUSTER_PREFIX, start_revision=start):
                    self._apply(event.kind, event.key, event.value, event.revision)
                    self.revision = max(self.revision, event.revision)
                    start = event.revision + 1
                    for listener in list(self.listeners):
                        try:
                            listener(event)
                        except Exception:  # noqa: BLE001
                            log.exception("cluster view listener failed")
                    self._notify()
            except asyncio.CancelledError:
                raise
            except CompactedError:
                log.warning("cluster view: history before revision %d was compacted; reloading", start)
                try:
                    start = await self._load() + 1
                    self._notify()
                except Exception as exc:  # noqa: BLE001
                    log.warning("cluster view reload failed: %s", exc)
                    await asyncio.sleep(0.5)
            except Exception as exc:  # noqa: BLE001 - keep following
                log.warning("cluster view watch failed: %s; resuming from revision %d", exc, start)
                await asyncio.sleep(0.5)

    # ------------------------------------------------------------ waiting

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for(self, predicate: Callable[[], Any], timeout: float) -> Any:
        """The first truthy ``predicate()`` result, re-checked after every change; TimeoutError after ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            result = predicate()
            if result:
                return result
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError
            waiter = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait({waiter}, timeout=remaining)  # not wait_for: see LoadManager._run
            finally:
                if not waiter.done():
                    waiter.cancel()

    async def wait_owner(self, topic: str, timeout: float) -> str:
        """The broker ``topic`` is assigned to, once it is (TimeoutError after ``timeout``).  Woken by
        that topic's assignment only, so a burst of lookups costs nothing per unrelated event."""
        owner = self.assignments.get(topic)
        if owner is not None:
            return owner
        future = asyncio.get_running_loop().create_future()
        self._owner_waiters.setdefault(topic, []).append(future)
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            waiters = self._owner_waiters.get(topic)
            if waiters is not None:
                if future in waiters:
                    waiters.remove(future)
                if not waiters:
                    del self._owner_waiters[topic]

    def changed(self) -> Coroutine[Any, Any, bool]:
        """Resolves at the next change after *this call*: the event is bound now, not when the
        coroutine first runs (a task made from it would otherwise miss a change that lands before it
        starts, and its waiter would sleep until its timeout)."""
        return self._changed.wait()

    # ------------------------------------------------------------ applying changes

    def assign_local(self, topic: str, broker_id: str) -> None:
        """Record an assignment this process just wrote (its watch event follows and is idempotent)."""
        self._apply("put", keys.broker_topic(broker_id, topic), b"null", 0)

    def _apply(self, kind: str, key: str, value: bytes | None, revision: int) -> None:
        parts = key.split("/")  # "", "cluster", section, ...
        if len(parts) < 3:
            return
        section = parts[2]
        if section == "register" and len(parts) == 4:
            if kind == "put":
                self.registered[parts[3]] = _json(value) or {}
            else:
                self.registered.pop(parts[3], None)
        elif section == "brokers" and len(parts) == 6:
            broker, topic = parts[3], f"/{parts[4]}/{parts[5]}"
            if kind == "put":
                previous = self.assignments.get(topic)
                if previous is not None and previous != broker:
                    self.broker_topics.get(previous, set()).discard(topic)
                self.assignments[topic] = broker
                self.broker_topics.setdefault(broker, set()).add(topic)
                for future in self._owner_waiters.pop(topic, ()):
                    if not future.done():
                        future.set_result(broker)
            else:
                if self.assignments.get(topic) == broker:
                    del self.assignments[topic]
                self.broker_topics.get(broker, set()).discard(topic)
        elif section == "brokers" and len(parts) == 5 and parts[4] == "state":
            if kind == "put":
                self.broker_states[parts[3]] = str(_json(value) or "active")
            else:
                self.broker_states.pop(parts[3], None)
        elif section == "unassigned" and len(parts) == 5:
            topic = f"/{parts[3]}/{parts[4]}"
            if kind == "put":
                self.unassigned[topic] = (_json(value), revision)
            else:
                self.unassigned.pop(topic, None)
        elif section == "load" and len(parts) == 4:
            if kind == "put":
                try:
                    self.loads[parts[3]] = LoadReport.from_json(value or b"")
                except InvalidArgumentError:
                    log.warning("ignoring unreadable load report of broker %s", parts[3])
            else:
                self.loads.pop(parts[3], None)
        elif section == "leader" and len(parts) == 3:
            self.leader = value.decode() if kind == "put" and value else None

    # ------------------------------------------------------------ queries

    def owner(self, topic: str) -> str | None:
        return self.assignments.get(topic)

    def broker_url(self, broker_id: str) -> str | None:
        info = self.registered.get(broker_id)
        return info.get("broker_url") if info else None

    def active_brokers(self) -> list[str]:
        """Registered brokers whose state is active (no state key = active)."""
        return sorted(b for b in self.registered if self.broker_states.get(b, "active") == "active")
