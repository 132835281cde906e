"""A local cluster for tests: a real etcd and N `danube broker --etcd` subprocesses on loopback.

Built on ``danube.cli.cluster.LocalCluster`` (what `danube cluster up` runs); every process is
stopped by its own PID, even when the test fails.  Short leases (3 s) keep failover tests quick.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Iterator

import grpc

from danube.cli.cluster import LocalCluster, read_state
from danube.proto.danube import DanubeApi_pb2 as pb
from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc
from tests.support import waiting


@contextlib.contextmanager
def local_cluster(base_dir: str, *, brokers: int = 3, lease_ttl: int = 3, **kwargs) -> Iterator[LocalCluster]:
    cluster = LocalCluster(brokers=brokers, base_dir=base_dir, lease_ttl=lease_ttl, load_report_interval=1.0, **kwargs)
    cluster.start(timeout=90)
    try:
        yield cluster
    except BaseException:
        for p in cluster.procs:  # the logs explain most cluster failures
            print(f"----- {p.broker_id} log (tail)\n{p.log()[-3000:]}")
        raise
    finally:
        cluster.stop()


async def lookup(url: str, topic: str, timeout: float = 30.0) -> tuple[str, str]:
    """(kind, owner URL) as broker ``url`` answers a TopicLookup: kind is connect|redirect|failed."""
    async with grpc.aio.insecure_channel(url.split("://", 1)[-1]) as channel:
        reply = await pb_grpc.DiscoveryStub(channel).TopicLookup(
            pb.TopicLookupRequest(request_id=1, topic=topic), timeout=timeout
        )
    kind = {pb.TopicLookupResponse.Connect: "connect", pb.TopicLookupResponse.Redirect: "redirect"}.get(
        reply.response_type, "failed"
    )
    return kind, (url if kind == "connect" else reply.broker_url)


async def owners_seen_by_each_broker(cluster: LocalCluster, topics: list[str]) -> dict[str, list[str]]:
    """topic → the owner URL each live broker answers, in broker order."""
    urls = [p.url for p in cluster.procs if p.alive()]
    result = {}
    for topic in topics:
        answers = await asyncio.gather(*(lookup(u, topic) for u in urls))
        result[topic] = [owner for _, owner in answers]
    return result


def state(cluster: LocalCluster) -> dict:
    return asyncio.run(read_state(cluster.etcd.url))


def wait_until(predicate, timeout: float, what: str, interval: float = 0.2):
    """Cluster predicates make calls: polled every 0.2 s rather than waiting.py's 0.05."""
    return waiting.wait_until(predicate, timeout, what, interval)
