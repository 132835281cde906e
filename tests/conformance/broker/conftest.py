"""One broker for the session, as Danube's broker tests assume one broker at 127.0.0.1:6650
(each test on its own topics and subjects), started here on free ports."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.support.broker import running_broker


@dataclass
class Target:
    url: str
    admin_url: str


@pytest.fixture(scope="session")
def conformance_broker():
    with running_broker() as broker:
        yield Target(broker.url, f"http://127.0.0.1:{broker.admin_port}")
