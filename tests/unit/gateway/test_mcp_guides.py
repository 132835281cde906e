"""The MCP server's metrics catalog and prompts, without a server."""

from __future__ import annotations

from danube.gateway.mcp_guides import PROMPTS, metrics_catalog
from danube.gateway.mcp_tools import TOOLS

PAGE = b"""# HELP danube_topic_messages_in_total Messages published
# TYPE danube_topic_messages_in_total counter
danube_topic_messages_in_total{topic="/default/a"} 3
# TYPE danube_broker_topics gauge
danube_broker_topics 1
"""


def test_the_catalog_lists_each_family_once_with_type_and_help():
    text = metrics_catalog({"b1": PAGE, "b2": PAGE, "down": b""})
    lines = [x for x in text.splitlines() if x.startswith("- ")]
    assert lines == [
        "- `danube_broker_topics` (gauge)",
        "- `danube_topic_messages_in_total` (counter): Messages published",
    ]


def test_an_empty_catalog_says_no_page_answered():
    assert "no broker metrics page answered" in metrics_catalog({"down": b""})


def test_prompts_name_only_tools_the_server_has():
    import re

    for name, (_, text) in PROMPTS.items():
        named = set(re.findall(r"`([a-z_]+)`", text))
        assert named and named <= set(TOOLS), (name, named - set(TOOLS))
