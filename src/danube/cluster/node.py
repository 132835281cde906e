"""A broker's part in a cluster: membership, leader election, load manager, lookups, ownership.

``ClusterNode`` is what :class:`danube.broker.service.BrokerService` consults when
it runs in cluster mode (``broker.cluster``):

- ``await lookup(topic)``: the owner from the cluster view; a topic with no owner
  gets an unassigned marker and the lookup waits (``lookup_timeout_s``) until the
  leader has placed it.  Connect when this broker owns it, Redirect with the
  owner's registered URL otherwise (every broker answers the same);
- ``await check_owner(topic)``: before a topic is opened here; NotServedHereError
  (UNAVAILABLE, the client looks the topic up again) unless the assignment
  ``/cluster/brokers/{me}/{ns}/{topic}`` exists and this broker is not fenced;
- ``await unload(topic)``: a topic move (``danube admin topics unload``): seal
  here first, then in one transaction delete the assignment and write the
  ``{"reason": "unload", "from_broker": me}`` marker; the leader places it on
  another broker, whose storage resumes at the sealed offset + 1;
- an assignment of a served topic that disappears (failover by the leader, a
  move requested elsewhere) closes it here; when the lease is lost, every
  served topic is closed (not sealed: another broker may own it already);
- cut off from etcd (the fence, danube.cluster.membership): writes refused at
  2/3 ttl; one ttl after the last renewal every reliable topic turns read-only
  (its WAL released for a next owner, its stored offsets still delivered); the
  lease renewed again reopens them for writing, a lost lease closes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from typing import TYPE_CHECKING, Any

import grpc

from danube import movetrace
from danube.broker.service import BrokerService, LookupResult
from danube.cluster import peers
from danube.cluster.forward_publish import ForwardPublisher
from danube.cluster.leader import LeaderElection
from danube.cluster.load_manager import DEFAULT_BATCH, LoadManager
from danube.cluster.load_report import LoadReporter, build_load_report, encode_report
from danube.cluster.membership import Membership
from danube.cluster.view import ClusterView
from danube.errors import AuthenticationError, MetadataError, NotFoundError, NotServedHereError, PermissionDeniedError
from danube.metadata import keys
from danube.metadata.store import Compare, MetadataStore, Op, WatchEvent
from danube.proto.danube_admin import admin_pb2 as apb
from danube.proto.danube_admin import admin_pb2_grpc as apb_grpc

log = logging.getLogger(__name__)


def _forward_error(what: str, exc, channels: peers.Peers | None = None, *, as_broker: bool = False) -> Exception:
    """A DanubeError for a failed call forwarded to another broker's admin port (a refusal keeps
    its code, with what to configure when the broker's own identity was refused)."""
    if exc.code() == grpc.StatusCode.NOT_FOUND:
        return NotFoundError(f"{what}: {exc.details()}")
    details = channels.explain(exc, as_broker=as_broker) if channels is not None else exc.details()
    if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDeniedError(f"{what} refused: {details}")
    if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
        return AuthenticationError(f"{what} refused: {details}")
    return NotServedHereError(f"{what} failed: {exc.code().name} {details}")


class ClusterLoadReporter(LoadReporter):
    """LoadReports into etcd (``/cluster/load/{broker_id}``, under the broker's lease) for the leader."""

    def __init__(self, broker: BrokerService, store: MetadataStore, membership: Membership, interval_s: float) -> None:
        super().__init__(broker, interval_s, broker_id=membership.broker_id)
        self._store = store
        self._membership = membership

    async def report_once(self):
        resources = await asyncio.to_thread(self._monitor.sample)
        stats = self._broker.stats()
        # A system topic (this very report's) is broker-local, never assigned or moved: the leader
        # must not see it (it would count it, and could pick it as the lightest topic to move).
        stats = dataclasses.replace(
            stats, topics={n: t for n, t in stats.topics.items() if not n.startswith("/system/")}
        )
        report = build_load_report(self.broker_id, stats, resources=resources, rates=self._rates)
        lease = self._membership.lease_id
        if not lease:
            raise MetadataError("no lease: load report skipped")
        # Into the history topic that `danube spark load-stats` reads, as a standalone broker does
        # (each broker's own copy, docs/load-reports.md); a local storage fault must not keep the
        # leader from this broker's load, so it is logged and the report still goes to etcd.
        try:
            await self._broker.publish_system(self.topic, encode_report(report))
        except Exception as exc:  # noqa: BLE001
            log.warning("load report of %s not appended to %s: %s", self.broker_id, self.topic, exc)
        await self._store.put(keys.load_report(self.broker_id), report.to_json(), lease=lease)
        self.reports_published += 1
        self.last_report = report
        return report


class ClusterNode:
    def __init__(
        self,
        store: MetadataStore,
        broker: BrokerService,
        *,
        broker_id: str,
        broker_url: str,
        admin_url: str | None = None,
        metrics_url: str | None = None,
        lease_ttl_s: int = 10,
        strategy: str = "fair",
        load_report_interval_s: float = 30.0,
        lookup_timeout_s: float = 10.0,
        batch_size: int = DEFAULT_BATCH,
        cluster_name: str = "danube",
        rebalancing: Any = None,
        metrics: Any = None,
        client_proxy: bool = True,
    ) -> None:
        self.store = store
        self.broker = broker
        self.broker_id = broker_id
        self.broker_url = broker_url
        self.cluster_name = cluster_name
        self.lookup_timeout_s = lookup_timeout_s
        self.view = ClusterView(store)
        self.membership = Membership(
            store,
            broker_id,
            {
                "broker_url": broker_url,
                "admin_url": admin_url,
                "metrics_url": metrics_url,
                "cluster_name": cluster_name,
            },
            lease_ttl_s=lease_ttl_s,
            fence=self,
            on_lease_lost=self._lease_lost,
            on_reregistered=self._reregistered,
        )
        self.election = LeaderElection(
            store, broker_id, self.membership, on_elected=self._elected, on_deposed=self._deposed
        )
        # the load manager's and the rebalancer's metrics (docs/rebalancing.md) in the broker's Prometheus
        # registry (``metrics``: danube.server.metrics.PrometheusMetrics), set while this broker leads;
        # danube_broker_topics_owned is the broker's own family, labelled broker_id in cluster mode
        self.rebalancing_metrics = None
        registry = getattr(metrics, "registry", None)
        if registry is not None:
            from danube.cluster.rebalancing import RebalancingMetrics

            self.rebalancing_metrics = rm = RebalancingMetrics(registry, topics_owned_gauge=False)
            if hasattr(metrics, "label_topics_owned"):
                metrics.label_topics_owned(broker_id, lambda: rm.topics_owned_values if self.election.is_leader else {})
        self.load_manager = LoadManager(
            store,
            self.view,
            self.election,
            strategy=strategy,
            batch_size=batch_size,
            orphan_grace_s=lease_ttl_s,
            metrics=self.rebalancing_metrics,
        )
        self.reporter = (
            ClusterLoadReporter(broker, store, self.membership, load_report_interval_s)
            if load_report_interval_s and load_report_interval_s > 0
            else None
        )
        # automated rebalancing (docs/rebalancing.md): one Rebalancer per broker, acting only while this
        # broker leads; it is also what the admin service's balance / rebalance commands use
        from danube.cluster.rebalancing import Rebalancer, RebalancingConfig

        if rebalancing is None:
            rebalancing = RebalancingConfig.from_dict(None, strategy=strategy)
        self.rebalancer = Rebalancer(
            store,
            rebalancing,
            is_leader=lambda: self.election.is_leader,
            guard=self.election.guard,
            view=self.view,
            metrics=self.rebalancing_metrics,
            count_assign=False,
        )
        broker.rebalancer = self.rebalancer
        broker.remote_publisher = ForwardPublisher(broker)
        self._unloading: set[str] = set()
        self._tasks: set[asyncio.Task] = set()
        self._pending_markers: dict[str, asyncio.Future] = {}
        self._marker_writer: asyncio.Task | None = None
        self.view.listeners.append(self._on_event)
        broker.lease_fresh = self.membership.lease_fresh
        # Danube's proxy mode (danube.cluster.client_proxy): a held call outlives a dead owner's lease
        # (ttl), the leader's reassignment and the new owner's open
        self.client_proxy = None
        if client_proxy:
            from danube.cluster.client_proxy import ClientProxy

            self.client_proxy = ClientProxy(
                self, hold_s=2 * lease_ttl_s + lookup_timeout_s, attempt_timeout_s=max(5.0, float(lease_ttl_s))
            )

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.view.start()
        await self.membership.register_waiting(timeout=self.membership.lease_ttl_s + 5)
        self.membership.start()
        self.election.start()
        self.rebalancer.start()
        if self.reporter is not None:
            self.reporter.start()
        log.info("broker %s joined cluster %s at %s", self.broker_id, self.cluster_name, self.store_endpoint)

    @property
    def store_endpoint(self) -> str:
        return getattr(self.store, "endpoints", type(self.store).__name__)

    async def stop(self) -> None:
        await self.rebalancer.stop()
        log.debug("leaving: rebalancer stopped")
        if self.reporter is not None:
            await self.reporter.stop()
        log.debug("leaving: load reporter stopped")
        await self.load_manager.stop()
        log.debug("leaving: load manager stopped")
        # leaving is best effort: with etcd unreachable the lease simply expires
        saved = getattr(self.store, "retry_timeout", None)
        if saved is not None:
            self.store.retry_timeout = min(saved, 2.0)
        await self.election.stop(resign=True)
        log.debug("leaving: election stopped")
        await self.membership.stop(revoke=True)
        log.debug("leaving: lease revoked")
        await self.view.stop()
        log.debug("leaving: view stopped")
        if self.client_proxy is not None:
            await self.client_proxy.close()
        for task in list(self._tasks) + [self._marker_writer]:
            if task is not None:
                task.cancel()

    async def _elected(self) -> None:
        self.load_manager.start()

    async def _deposed(self) -> None:
        await self.load_manager.stop()

    # ------------------------------------------------------------ lookups and ownership

    async def lookup(self, topic: str):
        keys.split_topic(topic)
        owner = self.view.owner(topic)
        if owner is None and topic not in self.view.unassigned:
            owner = await self._request_placement(topic)
        if owner is None:
            try:
                owner = await self.view.wait_owner(topic, self.lookup_timeout_s)
            except TimeoutError:
                log.warning(
                    "lookup of %s: no broker was assigned within %.0f s (leader: %s)",
                    topic,
                    self.lookup_timeout_s,
                    self.view.leader or "none",
                )
                return LookupResult("failed", "", "")
        if owner == self.broker_id:
            return LookupResult("connect", self.broker_url, self.broker_url)
        url = self.view.broker_url(owner)
        if url is None:
            try:
                url = await self.view.wait_for(lambda: self.view.broker_url(owner), 2.0)
            except TimeoutError:
                return LookupResult("failed", "", "")
        if self.client_proxy is not None:
            # the client keeps talking to this broker, which forwards to the owner and follows the
            # topic when the owner moves it, stops or dies (danube.cluster.client_proxy)
            return LookupResult("redirect", url, self.broker_url, proxy=True)
        return LookupResult("redirect", url, url)

    async def _request_placement(self, topic: str) -> str | None:
        """Write the unassigned marker of ``topic`` unless a broker holds it (then its id).

        Concurrent lookups share transactions: every topic asked for while one is in flight goes
        into the next (``_write_markers``), so a burst of new topics costs a few round trips."""
        future = self._pending_markers.get(topic)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self._pending_markers[topic] = future
            if self._marker_writer is None or self._marker_writer.done():
                self._marker_writer = asyncio.get_running_loop().create_task(self._flush_markers())
        return await asyncio.shield(future)

    async def _flush_markers(self) -> None:
        while self._pending_markers:
            limit = max(1, 120 // (len(self.view.registered) + 1))  # compares per txn under etcd's 128
            batch = list(self._pending_markers.items())[:limit]
            for topic, _ in batch:
                del self._pending_markers[topic]
            try:
                owners = await self._write_markers([topic for topic, _ in batch])
            except Exception as exc:  # noqa: BLE001 - every waiting lookup gets the error
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for topic, future in batch:
                if not future.done():
                    future.set_result(owners.get(topic))

    async def _write_markers(self, topics: list[str]) -> dict[str, str]:
        """In one transaction: no broker holds any of ``topics`` and none has a marker → write their
        markers.  Otherwise topic by topic (the view may lag: no stale marker for an assigned topic).
        Returns the owners found."""
        brokers = sorted(self.view.registered)

        def compares(topic):
            return [Compare.version(keys.broker_topic(b, topic), "==", 0) for b in brokers] + [
                Compare.version(keys.unassigned(topic), "==", 0)
            ]

        if len(topics) > 1:
            result = await self.store.txn(
                [c for t in topics for c in compares(t)], [Op.put(keys.unassigned(t), b"null") for t in topics]
            )
            if result.succeeded:
                return {}
        owners: dict[str, str] = {}
        for topic in topics:
            result = await self.store.txn(
                compares(topic),
                [Op.put(keys.unassigned(topic), b"null")],
                [Op.get(keys.broker_topic(b, topic)) for b in brokers],
            )
            if not result.succeeded:
                owner = next((b for b, kv in zip(brokers, result.results) if kv is not None), None)
                if owner is not None:
                    owners[topic] = owner
        return owners

    def unreachable(self, what: str) -> str:
        """Why ``what`` (e.g. "writes to /ns/t are refused") while fenced."""
        return (
            f"broker {self.broker_id} cannot reach the metadata store (etcd) for "
            f"{self.membership.unrenewed_s():.0f} s (its cluster lease is not renewed): {what} until it is back"
        )

    def write_refusal(self, topic: str | None = None) -> str:
        """Why a write (a publish, a new topic, producer or subscription) is refused while fenced."""
        what = f"writes to {topic} are refused" if topic else "writes are refused"
        return self.unreachable(what) + "; consumers go on reading what is stored"

    async def check_owner(self, topic: str) -> None:
        if self.membership.fenced:
            raise NotServedHereError(self.write_refusal(topic))
        if topic in self._unloading:
            raise NotServedHereError(f"topic {topic} is moving away from this broker; look it up again")
        if self.view.owner(topic) == self.broker_id:
            return
        # the view may lag behind the leader's write: ask the store
        if await self.store.get(keys.broker_topic(self.broker_id, topic)) is not None:
            return
        owner = self.view.owner(topic)
        url = self.view.broker_url(owner) if owner else None
        where = f"broker {owner} ({url})" if owner else "no broker yet"
        error = NotServedHereError(
            f"topic {topic} is not served by broker {self.broker_id}: owner is {where}; look it up again"
        )
        if url:
            error.owner_url = url  # sent as trailing metadata x-danube-broker-url (danube.server.status)
        raise error

    # ------------------------------------------------------------ moves

    async def unload(self, topic: str) -> int | None:
        """Move ``topic`` away from this broker: seal, then hand it to the leader (excluding this broker)."""
        keys.split_topic(topic)
        assignment = keys.broker_topic(self.broker_id, topic)
        if await self.store.get(assignment) is None:
            raise NotFoundError(f"topic {topic} is not assigned to broker {self.broker_id}")
        self._unloading.add(topic)
        movetrace.step(topic, "source.unload")
        try:
            last = None
            # not "if topic in broker.topics": an open that passed check_owner before the unload
            # began is still running; unload_topic waits for it (the topic's opening lock) and seals
            # what it opened, so the next owner never finds the WAL still held here
            with contextlib.suppress(NotFoundError):
                last = await self.broker.unload_topic(topic, local=True)
            movetrace.step(topic, "source.sealed")
            marker = json.dumps(
                {"reason": "unload", "from_broker": self.broker_id, "sealed": True, "last_offset": last}, sort_keys=True
            ).encode()
            result = await self.store.txn(
                [Compare.version(assignment, ">", 0)], [Op.delete(assignment), Op.put(keys.unassigned(topic), marker)]
            )
            if not result.succeeded:
                raise NotFoundError(f"topic {topic} was reassigned while it was being unloaded")
            movetrace.step(topic, "source.handed_over")
            # Until this broker's view has seen its assignment go, check_owner would still pass and a
            # client's call could reopen the sealed topic here: stay "unloading" until then.
            try:
                await self.view.wait_for(lambda: self.view.owner(topic) != self.broker_id, 2.0)
            except TimeoutError:
                log.warning("topic %s: the view still shows broker %s as its owner after 2 s", topic, self.broker_id)
            if self.rebalancing_metrics is not None:
                self.rebalancing_metrics.assignment(self.broker_id, "unassign")
            log.info(
                "topic %s unloaded from broker %s (sealed at %s); the leader places it elsewhere",
                topic,
                self.broker_id,
                last,
            )
            return last
        finally:
            self._unloading.discard(topic)

    async def leave(self, timeout: float = 10.0) -> int:
        """Graceful shutdown: hand every topic served here to the leader, sealed, so another broker
        resumes it at the sealed offset + 1 (instead of a failover without a seal once the lease is
        revoked).  Bounded by ``timeout``; whatever is left goes through failover.  Returns how many."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self.reporter is not None:
            await self.reporter.stop()  # its history topic closes with the broker: no report after that
        moved = 0
        for topic in sorted(t for t in self.broker.topics if not t.startswith("/system/")):
            if loop.time() >= deadline:
                log.warning("leaving: out of time, the remaining topics go through failover")
                break
            try:
                async with asyncio.timeout(max(0.1, deadline - loop.time())):
                    await self.unload(topic)
                moved += 1
            except Exception as exc:  # noqa: BLE001 - hand over the others anyway
                log.warning("leaving: could not hand over %s: %s", topic, exc)
        if moved:
            log.info("broker %s handed %d topic(s) over before leaving the cluster", self.broker_id, moved)
        return moved

    async def unload_anywhere(self, topic: str, *, caller: str | None = None) -> int | None:
        """``danube admin topics unload`` on any broker: the owner unloads (moves) it; a request that
        reached another broker is forwarded to the owner's admin port, as ``caller`` (the
        admin call's ``authorization`` header, danube.cluster.peers) or else as this broker."""
        keys.split_topic(topic)
        owner = self.view.owner(topic)
        if owner is None and await self.store.get(keys.broker_topic(self.broker_id, topic)) is not None:
            owner = self.broker_id
        if owner is None:
            raise NotFoundError(f"topic {topic} is not assigned to any broker")
        if owner == self.broker_id:
            return await self.unload(topic)
        admin_url = (self.view.registered.get(owner) or {}).get("admin_url")
        if not admin_url:
            raise NotServedHereError(f"topic {topic} is owned by broker {owner}, which has no admin port registered")
        channels = peers.for_broker(self.broker)
        try:
            async with channels.channel(admin_url, caller=caller) as channel:
                await apb_grpc.TopicAdminStub(channel).UnloadTopic(apb.TopicRequest(name=topic), timeout=60)
        except grpc.aio.AioRpcError as exc:
            raise _forward_error(
                f"unload of {topic} at broker {owner}", exc, channels, as_broker=channels.runs_as_broker(caller)
            ) from exc
        return None

    # ------------------------------------------------------------ drain (admin brokers unload / activate)

    async def drain(
        self,
        broker_id: str,
        *,
        dry_run: bool = False,
        include: tuple = (),
        exclude: tuple = (),
        timeout_s: float = 60.0,
        caller: str | None = None,
    ) -> dict:
        """Move every topic assigned to ``broker_id`` away and mark it ``draining`` then ``drained``, so
        the leader assigns it nothing new until :meth:`activate`.  Another broker's drain is sent to
        that broker's admin port (it has to seal its own topics).  ``include`` / ``exclude`` filter
        by namespace.  ``caller``: the admin call's ``authorization`` header, which another broker's
        drain carries (danube.cluster.peers).  Returns total / succeeded / failed / pending / failed_topics."""
        if broker_id and broker_id != self.broker_id:
            return await self._drain_remote(
                broker_id, dry_run=dry_run, include=include, exclude=exclude, timeout_s=timeout_s, caller=caller
            )

        def wanted(topic: str) -> bool:
            ns = topic.split("/")[1]
            return (not include or ns in include) and ns not in exclude

        assigned = await self.store.get_prefix(f"/cluster/brokers/{self.broker_id}/")
        topics = sorted(
            f"/{p[4]}/{p[5]}"
            for p in (kv.key.split("/") for kv in assigned)
            if len(p) == 6 and wanted(f"/{p[4]}/{p[5]}")
        )
        result = {"total": len(topics), "succeeded": 0, "failed": 0, "pending": len(topics), "failed_topics": []}
        if dry_run:
            return result
        await self.store.put_json(keys.broker_state(self.broker_id), "draining")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        for topic in topics:
            if loop.time() >= deadline:
                break
            try:
                async with asyncio.timeout(max(0.1, deadline - loop.time())):
                    await self.unload(topic)
                result["succeeded"] += 1
            except Exception as exc:  # noqa: BLE001 - move the others anyway
                log.warning("drain of broker %s: %s stays: %s", self.broker_id, topic, exc)
                result["failed"] += 1
                result["failed_topics"].append(topic)
            result["pending"] -= 1
        if not result["failed"] and not result["pending"]:
            await self.store.put_json(keys.broker_state(self.broker_id), "drained")
        log.info("broker %s drained: %s", self.broker_id, result)
        return result

    async def activate(self, broker_id: str) -> None:
        """Back to ``active``: the leader places topics on it again."""
        await self.store.put_json(keys.broker_state(broker_id or self.broker_id), "active")

    async def _drain_remote(self, broker_id: str, **kw) -> dict:
        info = self.view.registered.get(broker_id)
        admin_url = (info or {}).get("admin_url")
        if not admin_url:
            raise NotFoundError(f"broker {broker_id} is not registered (or has no admin port)")
        request = apb.UnloadBrokerRequest(
            broker_id=broker_id,
            dry_run=kw["dry_run"],
            namespaces_include=list(kw["include"]),
            namespaces_exclude=list(kw["exclude"]),
            timeout_seconds=int(kw["timeout_s"]),
        )
        channels = peers.for_broker(self.broker)
        caller = kw.get("caller")
        try:
            async with channels.channel(admin_url, caller=caller) as channel:
                reply = await apb_grpc.BrokerAdminStub(channel).UnloadBroker(request, timeout=kw["timeout_s"] + 10)
        except grpc.aio.AioRpcError as exc:
            raise _forward_error(
                f"drain of broker {broker_id}", exc, channels, as_broker=channels.runs_as_broker(caller)
            ) from exc
        return {
            "total": reply.total,
            "succeeded": reply.succeeded,
            "failed": reply.failed,
            "pending": reply.pending,
            "failed_topics": list(reply.failed_topics),
        }

    def _on_event(self, event: WatchEvent) -> None:
        parts = event.key.split("/")
        if event.kind == "delete" and len(parts) == 4 and parts[2] == "register":
            self.load_manager.note_deregistered(parts[3])
        elif event.kind == "put" and len(parts) == 4 and parts[2] == "register":
            self.load_manager.note_registered(parts[3])
        elif event.kind == "delete" and len(parts) == 6 and parts[2] == "brokers" and parts[3] == self.broker_id:
            topic = f"/{parts[4]}/{parts[5]}"
            if topic not in self._unloading:
                movetrace.step(f"/{parts[4]}/{parts[5]}", "source.saw_removal")
                self._spawn(self._assignment_removed(topic))
        elif event.kind == "put" and len(parts) == 6 and parts[2] == "brokers" and parts[3] == self.broker_id:
            movetrace.step(f"/{parts[4]}/{parts[5]}", "dest.saw_assignment")

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _assignment_removed(self, topic: str) -> None:
        """The leader (a rebalance) or someone else took the topic from this broker.  A move marker
        naming this broker: seal here, then confirm with ``"sealed": true`` so the leader places it;
        anything else (failover): just close it, another broker may own it already."""
        marker_key = keys.unassigned(topic)
        try:
            entry = await self.view.wait_for(lambda: self.view.unassigned.get(topic), 1.0)
        except TimeoutError:
            entry = None
        marker, revision = entry if entry else (None, 0)
        moving = (
            isinstance(marker, dict)
            and marker.get("reason") in ("rebalance", "unload")
            and marker.get("from_broker") == self.broker_id
            and not marker.get("sealed")
        )
        if not moving:  # (also when an open is still running: _drop waits for it)
            await self._drop(topic, "its assignment to this broker was removed")
            return
        last = None
        self._unloading.add(topic)
        try:  # also when an open is still running (see unload)
            last = await self.broker.unload_topic(topic, local=True)
            movetrace.step(topic, "source.sealed")
        except NotFoundError:
            pass
        except Exception:  # noqa: BLE001 - confirm anyway: the leader would place it after a timeout
            log.exception("sealing %s for its move failed", topic)
        finally:
            self._unloading.discard(topic)
        confirmed = dict(marker, sealed=True, last_offset=last)
        result = await self.store.txn(
            [Compare.mod_revision(marker_key, "==", revision)], [Op.put_json(marker_key, confirmed)]
        )
        movetrace.step(topic, "source.handed_over")
        log.info(
            "topic %s handed over by broker %s (%s, sealed at %s)%s",
            topic,
            self.broker_id,
            marker.get("reason"),
            last,
            "" if result.succeeded else "; the marker changed meanwhile",
        )

    async def _drop(self, topic: str, why: str, *, flush: bool = True) -> None:
        try:
            await self.broker.unload_topic(topic, local=True, seal=False, flush=flush)
        except NotFoundError:
            return  # not served here
        except Exception:  # noqa: BLE001
            log.exception("closing topic %s failed", topic)
            return
        log.warning("closed topic %s on broker %s: %s", topic, self.broker_id, why)

    # ------------------------------------------------------------ the fence (membership.Fence)

    def fence(self, reason: str) -> None:
        """No lease renewal for 2/3 ttl: refuse writes now; once the lease may have expired (ttl
        after the last good keepalive was sent) and the broker is still fenced, turn every topic
        read-only, which releases its WAL (writer and lock) so the topic's next owner can open it
        — a broker cut off from etcd cannot learn that it lost the topic — while consumers go on
        reading what was stored."""
        self.broker.refuse_writes(reason)
        self._spawn(self._read_only_when_lease_may_expire())

    def unfence(self) -> None:
        """The lease was renewed: it never expired, so nobody else was given this broker's topics;
        the read-only ones are opened for writing again.  (A lost lease closes them first:
        ``_lease_lost`` runs before the re-registration unfences.)"""
        self.broker.allow_writes()
        if any(t.read_only for t in self.broker.topics.values()):
            self._spawn(self._reopen_read_only())

    async def _read_only_when_lease_may_expire(self) -> None:
        m = self.membership
        since = m.last_ok_sent
        await asyncio.sleep(max(since + m.lease_ttl_s - m._clock(), 0.0))
        if not m.fenced or m.last_ok_sent != since:
            return
        served = [t for t in list(self.broker.topics) if not t.startswith("/system/")]
        log.warning(
            "broker %s: still fenced one lease ttl after its last renewal; %d topic(s) read-only, their WALs released",
            self.broker_id,
            len(served),
        )
        reason = (
            f"broker {self.broker_id} cannot reach the metadata store (etcd) and gave the topic's WAL up "
            "when its cluster lease could expire"
        )
        for name in served:
            if not m.fenced or m.last_ok_sent != since:
                break  # renewed (or re-registered) meanwhile: the rest stays writable
            try:
                await self.broker.make_read_only(name, reason)
            except Exception:  # noqa: BLE001 - release the others anyway
                log.exception("making %s read-only failed; closing it", name)
                await self._drop(name, "it could not be made read-only", flush=False)
        if not m.fenced and any(t.read_only for t in self.broker.topics.values()):
            self._spawn(self._reopen_read_only())  # unfenced while this ran: nobody else reopens them

    async def _reopen_read_only(self) -> None:
        for name in [n for n, t in list(self.broker.topics.items()) if t.read_only]:
            if not self.membership.lease_fresh():
                return  # fenced again: the next renewal reopens what is left
            try:
                await self.broker.reopen_for_writing(name)
            except Exception:  # noqa: BLE001 - its clients look it up again and reopen it
                log.exception("reopening %s for writing failed; closing it", name)
                await self._drop(name, "it could not be reopened for writing", flush=False)

    async def _lease_lost(self) -> None:
        # the cursors stay as they are in etcd: the topics' next owners may have moved them, or
        # (local storage) issued their offsets again
        for topic in [t for t in list(self.broker.topics) if not t.startswith("/system/")]:
            await self._drop(topic, "this broker lost its cluster lease", flush=False)

    async def _reregistered(self) -> None:
        await self.election.campaign()


if TYPE_CHECKING:
    from danube.broker.contracts import Cluster

    def _is_the_brokers_cluster(node: ClusterNode) -> Cluster:  # mypy: the node fills BrokerService.cluster
        return node
