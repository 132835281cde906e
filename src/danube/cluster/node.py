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

This module holds the node's state, its lifecycle and its watch of the cluster view; its jobs are
base classes in sibling modules: lookups and ownership checks (``node_lookups``), moves and
drain (``node_moves``), the fence (``node_fence``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from danube import movetrace
from danube.broker.service import BrokerService
from danube.cluster.forward_publish import ForwardPublisher
from danube.cluster.leader import LeaderElection
from danube.cluster.load_manager import DEFAULT_BATCH, LoadManager
from danube.cluster.load_report import LoadReporter, build_load_report, encode_report
from danube.cluster.membership import Membership
from danube.cluster.node_fence import Fencing
from danube.cluster.node_lookups import Lookups
from danube.cluster.node_moves import Moves
from danube.cluster.view import ClusterView
from danube.errors import MetadataError
from danube.metadata import keys
from danube.metadata.store import MetadataStore, WatchEvent

log = logging.getLogger(__name__)


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


class ClusterNode(Lookups, Moves, Fencing):
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

    async def _reregistered(self) -> None:
        await self.election.campaign()


if TYPE_CHECKING:
    from danube.broker.contracts import Cluster

    def _is_the_brokers_cluster(node: ClusterNode) -> Cluster:  # mypy: the node fills BrokerService.cluster
        return node
