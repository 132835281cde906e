"""The server process starts the load reporter (not the broker it reports on), and stops it."""

import asyncio

import pytest

from danube.cluster.load_report import LOAD_REPORTS_TOPIC
from danube.server.app import BrokerApp
from danube.server.config import BrokerConfig
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.timeout(30)


def _config(tmp_path, interval):
    return BrokerConfig(
        port=0,
        admin_port=0,
        metrics_port=0,
        data_dir=str(tmp_path),
        sync="never",
        load_report_interval_seconds=interval,
    )


async def test_the_app_runs_the_load_reporter_of_its_broker(tmp_path):
    app = BrokerApp(_config(tmp_path, 0.2))
    await app.start()
    try:
        reporter = app.load_reporter
        assert reporter is not None and reporter.running and reporter.broker_id == app.broker.broker_id
        await async_wait_until(
            lambda: LOAD_REPORTS_TOPIC in app.broker.topics and reporter.reports_published, 20, "a first load report"
        )
        assert app.broker.topics[LOAD_REPORTS_TOPIC].reliable and reporter.reports_published >= 1
    finally:
        await app.stop()
    assert not reporter.running


async def test_interval_zero_means_no_reporter(tmp_path):
    app = BrokerApp(_config(tmp_path, 0))
    await app.start()
    try:
        await asyncio.sleep(0.1)
        assert app.load_reporter is None and LOAD_REPORTS_TOPIC not in app.broker.topics
    finally:
        await app.stop()
