"""Partition routing must match Danube's clients (FNV-1a-64 of the key, else round robin)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from danube.client.consumer import offset_ranges
from danube.client.partition_router import PartitionRouter, fnv1a_64, partition_topic


def test_fnv1a_64_known_vectors():
    assert fnv1a_64(b"") == 0xCBF29CE484222325
    assert fnv1a_64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a_64(b"foobar") == 0x85944171F73967E8


def test_keyed_messages_go_to_hash_mod_n():
    router = PartitionRouter(3)
    for key in ("user-1", "user-2", "ключ"):
        assert router.route(key) == fnv1a_64(key.encode("utf-8")) % 3
        assert router.route(key) == router.route(key)


def test_unkeyed_messages_round_robin():
    router = PartitionRouter(3)
    assert [router.route(None) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert PartitionRouter(1).route("k") == 0


def test_partition_names():
    assert partition_topic("/default/t", 2) == "/default/t-part-2"


@given(st.lists(st.integers(min_value=0, max_value=500), max_size=200))
def test_offset_ranges_cover_exactly_the_offsets(offsets):
    ranges = offset_ranges(offsets)
    covered = [o for r in ranges for o in range(r.first, r.last + 1)]
    assert covered == sorted(set(offsets))
    assert all(a.last + 1 < b.first for a, b in zip(ranges, ranges[1:]))
