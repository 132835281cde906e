"""The built-in web console (`danube admin serve`, /) in headless Chromium against a real broker with
live traffic: the cluster, topics and topic pages render real data (rates chart included), a topic is
created and deleted through the console's confirmation dialog, and screenshots of each page are kept
in the test's tmp dir (``console-*.png``)."""

from __future__ import annotations

import asyncio
import json
import urllib.parse

import pytest

from danube.client import DanubeClient, SubType
from tests.support.broker import running_broker
from tests.support.browser import Browser, find_chromium
from tests.support.gateway import running_gateway

TOPIC = "/default/console_orders"
MESSAGES = 30

pytestmark = pytest.mark.skipif(
    find_chromium() is None, reason="Debian's chromium is not installed (ci/test.sh installs it)"
)


async def _traffic(url: str):
    client = DanubeClient.builder().service_url(url).build()
    consumer = (
        client.new_consumer()
        .with_topic(TOPIC)
        .with_consumer_name("c1")
        .with_subscription("billing")
        .with_subscription_type(SubType.Shared)
        .with_reliable()
        .build()
    )
    await consumer.subscribe()
    producer = client.new_producer().with_topic(TOPIC).with_name("p1").with_linger_ms(1).build()
    await producer.create()
    for _ in range(3):  # over a couple of scrapes, so the history has a rate
        futures = [await producer.send(b"order") for _ in range(MESSAGES // 3)]
        await asyncio.wait_for(asyncio.gather(*futures), 30)
        await asyncio.sleep(0.8)
    return client, producer, consumer


def _png(path) -> bool:
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_console_renders_live_data_and_creates_and_deletes_a_topic(tmp_path):
    (tmp_path / "broker").mkdir()
    loop = asyncio.new_event_loop()
    with running_broker(data_dir=str(tmp_path / "broker")) as broker:
        with running_gateway(broker.admin_port, str(tmp_path)) as gw:
            # traffic while the gateway scrapes: its embedded history sees the rate
            client, producer, consumer = loop.run_until_complete(_traffic(broker.url))
            browser = Browser(find_chromium(), str(tmp_path / "chromium-profile"), str(tmp_path / "chromium.log"))
            try:
                _drive(browser, gw, broker, tmp_path)
            finally:
                browser.close()
                loop.run_until_complete(producer.close())
                loop.run_until_complete(consumer.close())
                loop.run_until_complete(client.close())
                loop.close()


def _text(selector: str) -> str:
    return f"((document.querySelector({json.dumps(selector)}) || {{}}).textContent || '')"


def _card(name: str) -> str:
    """The number on the console's card called ``name`` (0 while it is not shown)."""
    return (
        f"Number(([...document.querySelectorAll('.card')].find(c => c.querySelector('.k').textContent === "
        f"{json.dumps(name)}) || {{querySelector: () => ({{textContent: '0'}})}}).querySelector('.v')"
        ".textContent.replace(/,/g, ''))"
    )


def _drive(browser: Browser, gw, broker, tmp_path) -> None:
    browser.open(gw.url + "/#/cluster")
    browser.wait_for("document.getElementById('view').dataset.rendered === '#/cluster'", 60, "the cluster page")
    main = browser.eval(_text("#view"))
    assert broker.url in main and "leader" in main, main[:500]
    # the broker's own call counter, scraped (the page refreshes itself until the first scrape is in)
    assert browser.wait_for(f"{_card('calls')} > 0 && {_card('calls')}", 40, "calls counted on the cluster page") > 0
    broker_id = gw.get("/ui/v1/cluster")["brokers"][0]["broker_id"]
    browser.eval(f"location.hash = '#/broker/' + encodeURIComponent({json.dumps(broker_id)})")
    browser.wait_for("document.getElementById('view').dataset.rendered.startsWith('#/broker/')", 30, "the broker page")
    assert browser.wait_for(f"{_card('WAL sync rounds')} > 0 && {_card('calls')} > 0", 30, "calls and WAL rounds")
    browser.screenshot(str(tmp_path / "console-cluster.png"))

    browser.eval("location.hash = '#/topics'")
    browser.wait_for(
        f"[...document.querySelectorAll('a.topic-link')].some(a => a.textContent === {json.dumps(TOPIC)})",
        30,
        "the topic in the topics table",
    )
    row = browser.eval(
        f"[...document.querySelectorAll('tr')].find(tr => tr.textContent.includes({json.dumps(TOPIC)})).textContent"
    )
    assert "Reliable" in row and str(MESSAGES) in row, row
    browser.screenshot(str(tmp_path / "console-topics.png"))

    browser.eval(f"location.hash = '#/topic/' + encodeURIComponent({json.dumps(TOPIC)})")
    browser.wait_for(f"{_text('#topic-name')} === {json.dumps(TOPIC)}", 30, "the topic page")
    # the rates chart draws a line once the embedded history holds two scrapes (the page refreshes itself)
    peak = browser.wait_for(
        "Number((document.querySelector('path.series[data-name=publish_rate_1m]') || "
        "{getAttribute: () => 0}).getAttribute('data-max'))",
        40,
        "a publish rate on the chart",
    )
    assert 0 < peak <= MESSAGES, peak
    page = browser.eval(_text("#view"))
    assert "billing" in page and "messages in" in page, page[:800]
    assert browser.wait_for(f"{_card('WAL flushes')} > 0 && {_card('WAL flushes')}", 30, "the topic's WAL syncs") > 0
    browser.screenshot(str(tmp_path / "console-topic.png"))

    # an action with its confirmation: create a topic from the topics page, then delete it from its page
    created = "/default/made_in_console"
    browser.eval("location.hash = '#/topics'")
    browser.wait_for("!!document.getElementById('create-topic')", 30, "the create form")
    browser.eval(
        f"document.getElementById('new-topic').value = {json.dumps(created)}; "
        "document.getElementById('create-topic').requestSubmit(); true"
    )
    browser.wait_for("!document.getElementById('confirm').classList.contains('hidden')", 10, "the confirmation")
    assert created in browser.eval(_text("#confirm-text"))
    browser.screenshot(str(tmp_path / "console-confirm.png"))
    browser.eval("document.getElementById('confirm-ok').click(); true")
    browser.wait_for(f"{_text('#notice')}.startsWith('Done')", 30, "the create notice")
    namespaces = gw.get("/ui/v1/namespaces")["namespaces"]
    assert created in [t for n in namespaces for t in n["topics"]], "the broker has the topic the console created"

    browser.eval(f"location.hash = '#/topic/' + encodeURIComponent({json.dumps(created)})")
    browser.wait_for(f"{_text('#topic-name')} === {json.dumps(created)}", 30, "the new topic's page")
    browser.eval("document.getElementById('delete-topic').click(); true")
    browser.wait_for("!document.getElementById('confirm').classList.contains('hidden')", 10, "the confirmation")
    browser.eval("document.getElementById('confirm-ok').click(); true")
    browser.wait_for("document.getElementById('view').dataset.rendered === '#/topics'", 30, "back on the topics page")
    namespaces = gw.get("/ui/v1/namespaces")["namespaces"]
    assert created not in [t for n in namespaces for t in n["topics"]], "deleted through the console"
    status, _, _ = gw.request("GET", "/ui/v1/topics/" + urllib.parse.quote(created, safe=""))
    assert status == 404

    # the other pages render without a script error on a standalone broker
    for hash_, marker in (("#/schemas", "Schemas"), ("#/rebalancing", "Rebalancing")):
        browser.eval(f"location.hash = {json.dumps(hash_)}")
        browser.wait_for(f"document.getElementById('view').dataset.rendered === {json.dumps(hash_)}", 30, hash_)
        assert browser.eval(_text("h1")) == marker and not browser.eval("!!document.getElementById('load-error')")
    browser.eval("document.getElementById('plan').click(); true")
    browser.wait_for(f"!{_text('#proposal')}.startsWith('Planning') && {_text('#proposal')}.length > 0", 30, "the plan")
    assert "standalone broker" in browser.eval(_text("#proposal"))  # the broker's own refusal, shown
    browser.screenshot(str(tmp_path / "console-rebalancing.png"))

    for name in ("cluster", "topics", "topic", "confirm", "rebalancing"):
        assert _png(tmp_path / f"console-{name}.png"), name
