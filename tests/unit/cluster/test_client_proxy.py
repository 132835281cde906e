"""Pieces of proxy mode and of the woken-owner fence that need no servers: which calls are forwarded
(the x-danube-broker-url header naming another broker) and the lease freshness every publish asks."""

from __future__ import annotations

from danube.cluster.client_proxy import PROXY_HEADER, proxied_to
from danube.cluster.membership import Membership


class _Context:
    def __init__(self, metadata):
        self._metadata = metadata

    def invocation_metadata(self):
        return self._metadata


def test_only_a_header_naming_another_broker_is_forwarded():
    me = "http://127.0.0.1:6650"
    assert proxied_to(_Context(()), me) is None
    assert proxied_to(_Context(((PROXY_HEADER, me),)), me) is None
    assert (
        proxied_to(_Context((("authorization", "Bearer x"), (PROXY_HEADER, "http://b2:6650"))), me) == "http://b2:6650"
    )
    assert proxied_to(_Context(((PROXY_HEADER, b"http://b2:6650"),)), me) == "http://b2:6650"
    assert proxied_to(_Context(((PROXY_HEADER, ""),)), me) is None


def test_the_lease_is_fresh_only_within_two_thirds_of_its_ttl_of_the_last_good_keepalive():
    now = [100.0]
    m = Membership(store=None, broker_id="b1", info={}, lease_ttl_s=3, clock=lambda: now[0])
    m.last_ok_sent = 100.0
    assert m.lease_fresh()
    now[0] = 101.9
    assert m.lease_fresh()
    now[0] = 102.0  # 2/3 of 3 s: from here on a write could land after the lease expired
    assert not m.lease_fresh()
    # woken from a long stop: the clock jumped, the watchdog has not run yet, writes are refused at once
    now[0] = 110.0
    assert not m.fenced and not m.lease_fresh()
    m.last_ok_sent = 110.0  # a keepalive went through again
    assert m.lease_fresh()
    m.fenced = True
    assert not m.lease_fresh()
