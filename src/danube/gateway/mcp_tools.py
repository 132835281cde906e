"""`danube admin serve --mode mcp`: the admin API as MCP tools over stdio (the `mcp` SDK, extra `gateway`).

Tool names are Danube's (``danube-admin`` MCP).  Reading tools always work; tools that change the
cluster are listed too but refuse unless the server was started with ``--mcp-allow-actions``, and
the broker's own RBAC still judges each call (its refusal comes back as the tool's error).  Security
is read-only here: roles and bindings can be listed, never changed, and no token is ever signed.
"""

from __future__ import annotations

import json
from typing import Any

from danube.errors import DanubeError
from danube.gateway import mcp_guides
from danube.gateway.actions import COMPATIBILITY_MODES, normalize_topic
from danube.gateway.backend import AdminBackend, pb, spb
from danube.gateway.config import GatewayConfig
from danube.gateway.metrics import MetricsHub
from danube.gateway.pages import Pages, _dict
from danube.metadata.keys import check_name, check_namespace
from danube.schema.registry import check_subject
from danube.server import failure_policy_wire

SECURITY_SERVICE = "danube_admin.SecurityAdmin"  # the JSON-coded service `danube admin security` calls


def _sdk():
    """(server class, ToolError) of the installed SDK: MCPServer in mcp 2, FastMCP in mcp 1."""
    try:
        from mcp.server.mcpserver import MCPServer
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError:
        from mcp.server.fastmcp import FastMCP as MCPServer  # type: ignore[no-redef,attr-defined]
        from mcp.server.fastmcp.exceptions import ToolError  # type: ignore[no-redef]
    return MCPServer, ToolError


def _json(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=True)


class AdminTools:
    """The tools, as plain coroutines (the MCP layer only wraps them)."""

    def __init__(self, cfg: GatewayConfig, allow_actions: bool) -> None:
        self.cfg = cfg
        self.allow_actions = allow_actions
        self.backend = AdminBackend(cfg)
        self.metrics = MetricsHub(cfg)
        self.pages = Pages(self.backend, self.metrics)

    def _may_change(self, what: str) -> None:
        if not self.allow_actions:
            raise PermissionError(
                f"{what} changes the cluster: this MCP server is read-only "
                "(start it with --mcp-allow-actions to allow it)"
            )

    async def _security(self, method: str) -> Any:
        call = self.backend.channel.unary_unary(
            f"/{SECURITY_SERVICE}/{method}",
            request_serializer=lambda d: json.dumps(d).encode(),
            response_deserializer=lambda b: json.loads(b.decode()) if b else {},
        )
        return await self.backend.call(call, {})

    # ------------------------------------------------------------ cluster

    async def list_brokers(self) -> str:
        """Returns broker IDs, status (active or drained), role (leader or follower), client and admin
        addresses and metrics page of every broker. Use this first to discover the cluster."""
        return _json([_dict(b) for b in await self.backend.list_brokers()])

    async def get_leader(self) -> str:
        """The id of the cluster's leader broker."""
        return _json({"leader": await self.backend.leader()})

    async def get_cluster_balance(self) -> str:
        """Load per broker, the coefficient of variation and which brokers are over or under loaded."""
        return _json(await self.pages.balance())

    async def trigger_rebalance(self, dry_run: bool = True, max_moves: int | None = None) -> str:
        """Plan topic moves that even out the load; dry_run=true (default) only proposes them."""
        if not dry_run:
            self._may_change("executing a rebalance")
        request = pb.RebalanceRequest(dry_run=dry_run)
        if max_moves is not None:
            if not 1 <= max_moves <= 10_000:
                raise ValueError("max_moves must be from 1 to 10000")
            request.max_moves = max_moves
        return _json(_dict(await self.backend.call(self.backend.brokers.TriggerRebalance, request, timeout=60.0)))

    async def get_rebalancing_history(self, limit: int = 50) -> str:
        """The leader's most recent topic moves, newest last."""
        return _json(await self.pages.rebalancing_history(max(1, min(limit, 1000))))

    async def unload_broker(self, broker_id: str, dry_run: bool = True) -> str:
        """Drain a broker: move all its topics away (dry_run=true, the default, only counts them)."""
        check_name("broker", broker_id)
        if not dry_run:
            self._may_change("draining a broker")
        r = await self.backend.call(
            self.backend.brokers.UnloadBroker,
            pb.UnloadBrokerRequest(broker_id=broker_id, dry_run=dry_run, max_parallel=1, timeout_seconds=60),
            timeout=65.0,
        )
        return _json(_dict(r))

    async def activate_broker(self, broker_id: str) -> str:
        """Let a drained broker take topics again."""
        check_name("broker", broker_id)
        self._may_change("activating a broker")
        r = await self.backend.call(
            self.backend.brokers.ActivateBroker, pb.ActivateBrokerRequest(broker_id=broker_id, reason="mcp")
        )
        return _json(_dict(r))

    async def health_check(self) -> str:
        """Whether the broker answers and who leads, with the broker count."""
        health = await self.pages.health()
        brokers = await self.backend.list_brokers() if health["leader_reachable"] else []
        return _json(
            {
                **health,
                "brokers": len(brokers),
                "inactive": [b.broker_id for b in brokers if b.broker_status not in ("active", "")],
            }
        )

    # ------------------------------------------------------------ namespaces

    async def list_namespaces(self) -> str:
        """Every namespace of the cluster."""
        return _json(await self.backend.namespaces_list())

    async def get_namespace_policies(self, namespace: str) -> str:
        """A namespace's policies (limits on producers, consumers, message size, ...)."""
        r = await self.backend.call(
            self.backend.namespaces.GetNamespacePolicies, pb.NamespaceRequest(name=check_namespace(namespace))
        )
        return _json(json.loads(r.policies or "{}"))

    async def create_namespace(self, namespace: str) -> str:
        """Create a namespace."""
        check_namespace(namespace)
        self._may_change("creating a namespace")
        return _json(
            _dict(await self.backend.call(self.backend.namespaces.CreateNamespace, pb.NamespaceRequest(name=namespace)))
        )

    async def delete_namespace(self, namespace: str) -> str:
        """Delete an empty namespace."""
        check_namespace(namespace)
        self._may_change("deleting a namespace")
        return _json(
            _dict(await self.backend.call(self.backend.namespaces.DeleteNamespace, pb.NamespaceRequest(name=namespace)))
        )

    # ------------------------------------------------------------ topics

    async def list_topics(self, namespace: str) -> str:
        """The topics of a namespace with their broker and delivery (Reliable or NonReliable)."""
        return _json([_dict(t) for t in await self.backend.namespace_topics(check_namespace(namespace))])

    async def describe_topic(self, topic: str) -> str:
        """A topic's broker, delivery, schema, subscriptions, storage and live metrics."""
        await self._scrape()
        return _json(await self.pages.topic(normalize_topic(topic, None)))

    async def list_subscriptions(self, topic: str) -> str:
        """The subscriptions of a topic."""
        r = await self.backend.call(
            self.backend.topics.ListSubscriptions, pb.TopicRequest(name=normalize_topic(topic, None))
        )
        return _json(list(r.subscriptions))

    async def get_subscription_failure_policy(self, topic: str, subscription: str) -> str:
        """What happens to a subscription's unacked messages (redeliveries, dead letters)."""
        r = await self.backend.call(
            self.backend.topics.GetSubscriptionFailurePolicy,
            pb.GetSubscriptionFailurePolicyRequest(
                topic=normalize_topic(topic, None), subscription=check_name("subscription", subscription)
            ),
        )
        return _json(
            {
                "subscription_type": failure_policy_wire.SUB_TYPE_NAMES.get(r.subscription_type, "Exclusive"),
                "failure_policy": failure_policy_wire.to_json(r.failure_policy)
                if r.HasField("failure_policy")
                else None,
            }
        )

    async def create_topic(self, topic: str, partitions: int = 0, reliable: bool = True) -> str:
        """Create a topic (partitions > 0: a partitioned topic); reliable=true keeps it in the WAL."""
        name = normalize_topic(topic, None)
        self._may_change("creating a topic")
        strategy = pb.Reliable if reliable else pb.NonReliable
        if partitions:
            if not 1 <= partitions <= 4096:
                raise ValueError("partitions must be from 1 to 4096")
            r = await self.backend.call(
                self.backend.topics.CreatePartitionedTopic,
                pb.PartitionedTopicRequest(base_name=name, partitions=partitions, dispatch_strategy=strategy),
            )
        else:
            r = await self.backend.call(
                self.backend.topics.CreateTopic, pb.NewTopicRequest(name=name, dispatch_strategy=strategy)
            )
        return _json(_dict(r))

    async def delete_topic(self, topic: str) -> str:
        """Delete a topic and its data."""
        name = normalize_topic(topic, None)
        self._may_change("deleting a topic")
        return _json(_dict(await self.backend.call(self.backend.topics.DeleteTopic, pb.TopicRequest(name=name))))

    async def unload_topic(self, topic: str) -> str:
        """Unload a topic from its broker; its clients reconnect and it is placed again."""
        name = normalize_topic(topic, None)
        self._may_change("unloading a topic")
        return _json(_dict(await self.backend.call(self.backend.topics.UnloadTopic, pb.TopicRequest(name=name))))

    async def unsubscribe(self, topic: str, subscription: str) -> str:
        """Delete a subscription of a topic."""
        name = normalize_topic(topic, None)
        sub = check_name("subscription", subscription)
        self._may_change("deleting a subscription")
        return _json(
            _dict(
                await self.backend.call(
                    self.backend.topics.Unsubscribe, pb.SubscriptionRequest(topic=name, subscription=sub)
                )
            )
        )

    async def _scrape(self) -> None:
        await self.metrics.scrape(self.pages.metric_targets(await self.backend.list_brokers()))

    async def analyze_consumer_lag(self, topic: str | None = None) -> str:
        """Backlog (messages not yet acked) and unacked deliveries per subscription, from the brokers'
        metrics; one topic, or every topic that has subscriptions."""
        name = normalize_topic(topic, None) if topic else None
        await self._scrape()
        out = []
        for sample in self.metrics.latest.values():
            for t, ts in sample.topics.items():
                if (name is None or t == name) and ts.subscriptions:
                    out += [
                        {
                            "topic": t,
                            "subscription": s,
                            "backlog": v.get("backlog", 0),
                            "unacked": v.get("unacked", 0),
                            "consumers": int(ts.consumers),
                        }
                        for s, v in sorted(ts.subscriptions.items())
                    ]
        out.sort(key=lambda x: -x["backlog"])
        return _json({"subscriptions": out, "errors": self.metrics.errors()})

    # ------------------------------------------------------------ schemas

    async def list_subjects(self) -> str:
        """The schema subjects in use, with type, latest version and compatibility mode."""
        return _json((await self.pages.schemas())["subjects"])

    async def get_schema(self, subject: str) -> str:
        """A subject's latest schema and its version list."""
        return _json(await self.pages.schema(check_subject(subject)))

    async def list_schema_versions(self, subject: str) -> str:
        """The versions of a subject."""
        r = await self.backend.call(
            self.backend.schemas.ListVersions, spb.ListVersionsRequest(subject=check_subject(subject))
        )
        return _json([_dict(v) for v in r.versions])

    async def set_schema_compatibility_mode(self, subject: str, mode: str) -> str:
        """Set a subject's compatibility mode: NONE, BACKWARD, FORWARD or FULL."""
        check_subject(subject)
        if mode.upper() not in COMPATIBILITY_MODES:
            raise ValueError(f"mode must be one of {', '.join(COMPATIBILITY_MODES)}")
        self._may_change("changing a compatibility mode")
        return _json(
            _dict(
                await self.backend.call(
                    self.backend.schemas.SetCompatibilityMode,
                    spb.SetCompatibilityModeRequest(subject=subject, compatibility_mode=mode.upper()),
                )
            )
        )

    # ------------------------------------------------------------ security (read-only)

    async def list_roles(self) -> str:
        """The broker's roles and their permissions (read-only here)."""
        return _json((await self._security("ListRoles")).get("roles", []))

    async def list_bindings(self) -> str:
        """Which subjects hold which roles (read-only here)."""
        return _json((await self._security("ListBindings")).get("bindings", []))


TOOLS = (
    "list_brokers",
    "get_leader",
    "get_cluster_balance",
    "trigger_rebalance",
    "get_rebalancing_history",
    "unload_broker",
    "activate_broker",
    "health_check",
    "list_namespaces",
    "get_namespace_policies",
    "create_namespace",
    "delete_namespace",
    "list_topics",
    "describe_topic",
    "list_subscriptions",
    "get_subscription_failure_policy",
    "create_topic",
    "delete_topic",
    "unload_topic",
    "unsubscribe",
    "analyze_consumer_lag",
    "list_subjects",
    "get_schema",
    "list_schema_versions",
    "set_schema_compatibility_mode",
    "list_roles",
    "list_bindings",
)


def build_server(cfg: GatewayConfig, allow_actions: bool = False):
    server_cls, tool_error = _sdk()
    tools = AdminTools(cfg, allow_actions)
    server = server_cls(
        "danube-admin",
        instructions=(
            "Administer a danube (Danube-compatible) message broker cluster. Tools that change the cluster "
            + ("are enabled." if allow_actions else "refuse: this server is read-only.")
        ),
    )

    def wrap(fn):
        import functools

        @functools.wraps(fn)
        async def tool(*args, **kwargs):
            try:
                return await fn(*args, **kwargs)
            except PermissionError as exc:
                raise tool_error(f"refused: {exc}") from None
            except DanubeError as exc:
                code = getattr(exc, "grpc_code", None)
                prefix = f"the broker refused ({code.name.lower()})" if code is not None else "refused"
                raise tool_error(f"{prefix}: {exc}") from None
            except ValueError as exc:
                raise tool_error(f"bad argument: {exc}") from None

        return tool

    for name in TOOLS:
        server.add_tool(wrap(getattr(tools, name)), name=name)
    mcp_guides.register(server, tools)
    return server, tools


async def serve_stdio(cfg: GatewayConfig, allow_actions: bool = False) -> int:
    server, tools = build_server(cfg, allow_actions)
    try:
        await server.run_stdio_async()
    finally:
        await tools.backend.close()
    return 0
