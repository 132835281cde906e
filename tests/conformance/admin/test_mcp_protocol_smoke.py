"""Danube's MCP protocol smoke test (danube-admin/tests/mcp_protocol_smoke_test.rs), ported.

``danube admin serve --mode mcp`` is spoken to as Danube's test speaks to ``danube-admin serve --mode
mcp``: raw newline-delimited JSON-RPC over the process's stdin/stdout (no MCP SDK on the client
side), the admin endpoint in ``DANUBE_ADMIN_ENDPOINT``.  Not exhaustive: enough to catch breakage at
the protocol level (initialize, tools/prompts/resources advertised, one end-to-end tool call, an
unknown tool refused).  Danube starts a server per test; here the module shares one, initialized
once (the MCP SDK alone takes seconds to import on a loaded machine): the first test checks the
answer to that initialize.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading

import pytest

from tests.support.processes import stop_process

pytest.importorskip("mcp", reason="the MCP SDK is in the gateway extra: pip install -e .[gateway]")

REPLY_TIMEOUT_S = 60.0  # a cold Python start with the SDK imported, on a loaded 2-core machine


class McpClient:
    """Danube's ``McpClient``: the server as a subprocess, one JSON-RPC request at a time."""

    def __init__(self, admin_port: int) -> None:
        env = {**os.environ, "DANUBE_ADMIN_ENDPOINT": f"http://127.0.0.1:{admin_port}"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "danube.cli.main", "admin", "serve", "--mode", "mcp"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.request_id = 0
        self.initialized: dict = {}

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _send(self, message: dict) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def request(self, method: str, params: dict) -> dict:
        self.request_id += 1
        self._send({"jsonrpc": "2.0", "id": self.request_id, "method": method, "params": params})
        while True:  # skip anything that is not this request's answer (notifications, logs)
            try:
                line = self.lines.get(timeout=REPLY_TIMEOUT_S)
            except queue.Empty:
                raise AssertionError(f"no answer to {method} within {REPLY_TIMEOUT_S:.0f} s") from None
            assert line is not None, f"the MCP server closed stdout (exit {self.process.poll()}) before answering"
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and doc.get("id") == self.request_id:
                return doc

    def initialize(self) -> dict:
        reply = self.request(
            "initialize",
            {
                "protocolVersion": "2024-11-05",
                "capabilities": {"roots": {"listChanged": False}},
                "clientInfo": {"name": "mcp-smoke-test", "version": "1.0.0"},
            },
        )
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized", "params": {}})
        return reply

    def call_tool(self, name: str, arguments: dict) -> dict:
        return self.request("tools/call", {"name": name, "arguments": arguments})

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()  # end of input: the stdio server stops on its own
        stop_process(self.process)


@pytest.fixture(scope="module")
def client(admin_broker):
    c = McpClient(admin_broker.admin_port)
    try:
        c.initialized = c.initialize()
        yield c
    finally:
        c.close()


def test_mcp_server_initialization_and_capabilities(client):
    reply = client.initialized
    assert "result" in reply, reply
    result = reply["result"]
    assert result["serverInfo"]["name"] == "danube-admin"
    capabilities = result["capabilities"]
    assert {"tools", "prompts", "resources"} <= set(capabilities), capabilities


def test_mcp_tools_discovery(client):
    tools = client.request("tools/list", {})["result"]["tools"]
    assert len(tools) >= 20, [t["name"] for t in tools]
    for tool in tools:
        assert tool.get("name") and tool.get("description") and "inputSchema" in tool, tool


def test_mcp_prompts_discovery(client):
    prompts = client.request("prompts/list", {})["result"]["prompts"]
    assert prompts, "no prompt advertised"
    for prompt in prompts:
        assert prompt.get("name") and prompt.get("description"), prompt
    # a prompt's text names tools this server really has
    tools = {t["name"] for t in client.request("tools/list", {})["result"]["tools"]}
    got = client.request("prompts/get", {"name": prompts[0]["name"], "arguments": {}})["result"]
    text = got["messages"][0]["content"]["text"]
    named = {name for name in tools if f"`{name}`" in text}
    assert named, text


def test_mcp_resources_discovery(client, admin_broker):
    resources = client.request("resources/list", {})["result"]["resources"]
    assert resources, "no resource advertised"
    for resource in resources:
        assert resource.get("uri") and resource.get("name"), resource
    # the metrics catalog is read from the broker's own metrics page
    (catalog,) = [r for r in resources if r["uri"] == "danube://metrics"]
    contents = client.request("resources/read", {"uri": catalog["uri"]})["result"]["contents"]
    assert "`danube_" in contents[0]["text"], contents[0]["text"][:500]


def test_mcp_tool_invocation_end_to_end(client, admin_broker):
    result = client.call_tool("list_brokers", {})["result"]
    assert not result.get("isError"), result
    (content, *_) = result["content"]
    assert content["type"] == "text"
    (broker,) = json.loads(content["text"])
    assert broker["broker_addr"] == admin_broker.url


def test_mcp_tool_descriptions_from_doc_comments(client):
    tools = {t["name"]: t for t in client.request("tools/list", {})["result"]["tools"]}
    description = tools["list_brokers"]["description"]
    assert "Returns broker IDs, status" in description and "Use this first to discover" in description
    schema = tools["create_topic"]["inputSchema"]
    assert schema["type"] == "object"
    assert {"topic", "partitions", "reliable"} <= set(schema["properties"]), schema
    assert schema.get("required") == ["topic"], schema


def test_mcp_error_handling(client):
    reply = client.call_tool("nonexistent_tool", {})
    # Danube's server answers a JSON-RPC error; the Python SDK answers a tool result flagged isError
    # (what MCP prescribes for tool errors); either way the call is refused and says which tool
    if "error" in reply:
        assert "nonexistent_tool" in reply["error"]["message"], reply
    else:
        result = reply["result"]
        assert result["isError"] is True and "nonexistent_tool" in result["content"][0]["text"], result
