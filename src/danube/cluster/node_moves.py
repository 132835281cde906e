"""The cluster node's moves: unload a topic (seal here, hand it to the leader), hand every topic
over when leaving, forward an unload or a drain to the owner's admin port, drain and activate a
broker, and follow an assignment that the leader (or another broker) took away.

A base class of :class:`~danube.cluster.node.ClusterNode` (``cluster/node.py``), which holds the
state; its methods are moved here whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING

import grpc

from danube import movetrace
from danube.cluster import peers
from danube.errors import AuthenticationError, NotFoundError, NotServedHereError, PermissionDeniedError
from danube.metadata import keys
from danube.metadata.store import Compare, MetadataStore, Op
from danube.proto.danube_admin import admin_pb2 as apb
from danube.proto.danube_admin import admin_pb2_grpc as apb_grpc

if TYPE_CHECKING:
    from danube.broker.service import BrokerService
    from danube.cluster.load_report import LoadReporter
    from danube.cluster.rebalancing import RebalancingMetrics
    from danube.cluster.view import ClusterView

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


class Moves:
    if TYPE_CHECKING:  # what this part uses of the rest of ClusterNode
        store: MetadataStore
        broker: BrokerService
        view: ClusterView
        reporter: LoadReporter | None
        rebalancing_metrics: RebalancingMetrics | None
        broker_id: str
        _unloading: set[str]

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
