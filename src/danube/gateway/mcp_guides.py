"""The MCP server's prompts and resources, beside its tools (as Danube's admin MCP offers them).

Prompts are step-by-step workflows written against this server's own tool names; the one resource,
``danube://metrics``, is the metric catalog of the brokers, read live from their metrics pages (so
it names what these brokers really export, not a list that can go stale).
"""

from __future__ import annotations

import asyncio

from danube.gateway.metrics import _http_get

METRICS_URI = "danube://metrics"

CLUSTER_HEALTH_CHECK = """\
Check the health of the danube cluster, step by step; each step uses what the previous one found.

1. Brokers: call `list_brokers`. Every broker should be "active"; exactly one is "Cluster_Leader"
   (`get_leader` names it). Report a missing leader or a broker that is drained unexpectedly.
2. Load: call `get_cluster_balance`. A coefficient of variation above its threshold, or brokers
   flagged overloaded/underloaded, means the load is uneven; `trigger_rebalance` with dry_run=true
   shows the moves that would even it out (do not execute them without asking).
3. Recent moves: call `get_rebalancing_history`; many moves of the same topic point to flapping.
4. Consumers: call `analyze_consumer_lag`; name the subscriptions whose backlog keeps growing.
5. Security: call `list_roles` and `list_bindings`; report subjects bound to the admin role.

Finish with a short summary: what is healthy, what needs attention, and the tool call that shows it.
"""

SCHEMA_REVIEW = """\
Review the schema registry of the danube cluster.

1. Call `list_subjects`: each subject's type, latest version and compatibility mode.
2. For subjects with mode NONE, say why that is risky (any change is accepted, readers may break).
3. For a subject the user names, call `get_schema` and `list_schema_versions` and explain what
   changed between its versions.
4. Before suggesting `set_schema_compatibility_mode`, explain what the new mode would refuse.
"""

PROMPTS = {
    "cluster_health_check": (
        "Cluster health check: brokers, leader, load balance, recent moves, consumer lag and security bindings",
        CLUSTER_HEALTH_CHECK,
    ),
    "schema_review": (
        "Schema registry review: subjects, compatibility modes and what changed between versions",
        SCHEMA_REVIEW,
    ),
}


def metrics_catalog(pages: dict[str, bytes]) -> str:
    """``# HELP``/``# TYPE`` lines of the brokers' metrics pages as one sorted catalog (metric, type, help)."""
    families: dict[str, dict[str, str]] = {}
    for body in pages.values():
        for line in body.decode("utf-8", "replace").splitlines():
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[0] == "#" and parts[1] in ("HELP", "TYPE"):
                families.setdefault(parts[2], {})[parts[1]] = parts[3] if len(parts) > 3 else ""
    lines = ["# Metrics the danube brokers export (read from their metrics pages)", ""]
    for name in sorted(families):
        f = families[name]
        lines.append(f"- `{name}` ({f.get('TYPE', 'untyped')}): {f.get('HELP', '')}".rstrip(": "))
    if not families:
        lines.append("(no broker metrics page answered)")
    return "\n".join(lines) + "\n"


def _fixed(text: str):
    def prompt() -> str:  # no parameters: the SDK would offer them as prompt arguments
        return text

    return prompt


def register(server, tools) -> None:
    """Add the prompts and the metrics resource to ``server`` (an MCPServer/FastMCP of the SDK)."""
    for name, (description, text) in PROMPTS.items():
        server.prompt(name=name, description=description)(_fixed(text))

    @server.resource(
        METRICS_URI,
        name="danube-metrics",
        description="The metrics the brokers export, with type and help text; for PromQL queries "
        "against a Prometheus that scrapes them",
        mime_type="text/markdown",
    )
    async def metrics_resource() -> str:
        targets = tools.pages.metric_targets(await tools.backend.list_brokers())
        timeout = min(tools.cfg.request_timeout_s, 5.0)

        async def one(url: str) -> bytes:
            try:
                return await asyncio.to_thread(_http_get, url, timeout)
            except Exception:  # an unreachable page only leaves its metrics out of the catalog
                return b""

        bodies = await asyncio.gather(*(one(u) for u in targets.values()))
        return metrics_catalog(dict(zip(targets, bodies)))
