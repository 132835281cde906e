"""Danube's admin gRPC service (package ``danube_admin``) for one broker.

``add_to_server(server, broker)`` registers BrokerAdmin, NamespaceAdmin and
TopicAdmin on a ``grpc.aio`` server (the admin port, 50051 by default).
Topic and namespace listings read the metadata store (every topic the cluster
knows), the cluster view's assignments and the broker (topics served here), so
every broker of a cluster gives the same answer.  Calls the topic's owner must
act on (describe, subscriptions, unsubscribe, delete; unload through the
cluster node) are forwarded to the owner's admin port (the view has its
admin_url), marked so the owner answers itself.  Drain/rebalancing calls
answer UNIMPLEMENTED on a standalone broker.

The services live in ``admin_cluster.py`` (brokers, namespaces) and ``admin_topics.py`` (topics);
what they share (listings, forwarding to the owner) in ``admin_context.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from danube.proto.danube_admin import admin_pb2_grpc as pb_grpc
from danube.server.admin_cluster import BrokerAdmin, NamespaceAdmin
from danube.server.admin_context import FORWARDED, AdminContext, namespace_name
from danube.server.admin_topics import TopicAdmin

if TYPE_CHECKING:
    from danube.broker.service import BrokerService

__all__ = ["BrokerAdmin", "NamespaceAdmin", "TopicAdmin", "add_to_server", "namespace_name"]

# The metadata key of a call forwarded to the topic's owner (the scalable service marks its own so).
_FORWARDED = FORWARDED


def add_to_server(server: grpc.aio.Server, broker: BrokerService) -> None:
    """Register Danube's admin services for ``broker`` (a BrokerService) on ``server``."""
    admin = AdminContext(broker)
    pb_grpc.add_BrokerAdminServicer_to_server(BrokerAdmin(admin), server)
    pb_grpc.add_NamespaceAdminServicer_to_server(NamespaceAdmin(admin), server)
    pb_grpc.add_TopicAdminServicer_to_server(TopicAdmin(admin), server)
