"""`danube admin serve --mode mcp` spoken to over stdio by the MCP SDK's own client, against a real
broker: initialize, list the tools, call reading tools, and see a changing tool refused (read-only)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from danube.cli import admin as admin_cli
from tests.support.broker import running_broker

mcp = pytest.importorskip("mcp", reason="the MCP SDK is in the gateway extra: pip install -e .[gateway]")


def _params(admin_port: int, *extra: str):
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "HOME", "LANG")}
    return mcp.StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "danube.cli.main",
            "admin",
            "serve",
            "--mode",
            "mcp",
            "--broker-endpoint",
            f"http://127.0.0.1:{admin_port}",
            *extra,
        ],
        env=env,
    )


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with running_broker(data_dir=str(tmp_path_factory.mktemp("mcp-broker"))) as b:
        yield b


def _is_error(result) -> bool:  # mcp 2 spells it is_error, mcp 1 isError
    return bool(getattr(result, "is_error", getattr(result, "isError", False)))


async def test_mcp_initialize_list_and_call_tools(broker):
    from mcp.client.stdio import stdio_client

    async with stdio_client(_params(broker.admin_port)) as (read, write):
        async with mcp.ClientSession(read, write) as session:
            init = await session.initialize()
            assert (
                init.server_info.name == "danube-admin"
                if hasattr(init, "server_info")
                else init.serverInfo.name == "danube-admin"
            )
            names = {t.name for t in (await session.list_tools()).tools}
            assert {
                "list_brokers",
                "list_namespaces",
                "list_topics",
                "describe_topic",
                "trigger_rebalance",
                "analyze_consumer_lag",
                "list_roles",
                "create_topic",
                "delete_topic",
            } <= names

            result = await session.call_tool("list_brokers", {})
            assert not _is_error(result), result
            (b,) = json.loads(result.content[0].text)
            assert b["broker_addr"] == broker.url and b["broker_role"] == "Cluster_Leader"

            result = await session.call_tool("list_namespaces", {})
            assert "system" in json.loads(result.content[0].text)  # the broker's own namespace

            # a changing tool is refused with a sentence saying why; nothing was created
            result = await session.call_tool("create_topic", {"topic": "/default/mcp_t"})
            assert _is_error(result) and "read-only" in result.content[0].text
            result = await session.call_tool("list_topics", {"namespace": "default"})
            assert "/default/mcp_t" not in result.content[0].text

            # bad names are refused by the broker's name rule before any call
            result = await session.call_tool("describe_topic", {"topic": "/default/../etc"})
            assert _is_error(result) and "invalid topic name" in result.content[0].text


async def test_mcp_actions_when_allowed(broker):
    from mcp.client.stdio import stdio_client

    async with stdio_client(_params(broker.admin_port, "--mcp-allow-actions")) as (read, write):
        async with mcp.ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool("create_topic", {"topic": "/default/mcp_t", "reliable": True})
            assert not _is_error(result), result.content[0].text
            result = await session.call_tool("list_topics", {"namespace": "default"})
            topics = json.loads(result.content[0].text)
            assert [t["delivery"] for t in topics if t["name"] == "/default/mcp_t"] == ["Reliable"]
            set_policy = [
                "--endpoint",
                f"http://127.0.0.1:{broker.admin_port}",
                "topics",
                "set-failure-policy",
                "/default/mcp_t",
                "-s",
                "s",
                "--max-redelivery-count",
                "2",
                "--ack-timeout-ms",
                "1000",
                "--base-redelivery-delay-ms",
                "10",
                "--max-redelivery-delay-ms",
                "20",
                "--poison-policy",
                "drop",
            ]
            assert await asyncio.to_thread(admin_cli.main, set_policy) == 0
            result = await session.call_tool(
                "get_subscription_failure_policy", {"topic": "/default/mcp_t", "subscription": "s"}
            )
            assert json.loads(result.content[0].text) == {
                "subscription_type": "Exclusive",
                "failure_policy": {
                    "max_redelivery_count": 2,
                    "ack_timeout_ms": 1000,
                    "base_redelivery_delay_ms": 10,
                    "max_redelivery_delay_ms": 20,
                    "backoff_strategy": "fixed",
                    "dead_letter_topic": None,
                    "poison_policy": "drop",
                },
            }
            result = await session.call_tool("delete_topic", {"topic": "/default/mcp_t"})
            assert not _is_error(result), result.content[0].text
            result = await session.call_tool("describe_topic", {"topic": "/default/mcp_t"})
            assert _is_error(result) and "not_found" in result.content[0].text
