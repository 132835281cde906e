"""danube-broker/tests/key_shared_filtering.rs: glob key filters pick what each key-shared consumer gets."""

import asyncio

from common import consumer, fan_in, producer, stop

from danube import SubType


async def _filtered(ctx, prefix, p_name, sub, members, sends, total, wait, reliable=False, own_clients=True, pause=0.0):
    """``members``: (consumer name, key filters); ``sends``: rounds of (key, payload)."""
    client = await ctx.client()
    topic = ctx.unique_topic(prefix)
    p = await producer(client, topic, p_name, reliable=reliable)
    named = []
    for name, filters in members:
        c_client = await ctx.client() if own_clients else client
        c = await consumer(c_client, topic, name, sub, SubType.KEY_SHARED, key_filters=filters)
        named.append((name, c, await c.receive()))
    await asyncio.sleep(0.5)
    sink: asyncio.Queue = asyncio.Queue()
    tasks = fan_in(named, sink)
    for batch in sends:
        for key, payload in batch:
            await p.send_with_key(payload.encode(), None, key)
        await asyncio.sleep(pause)
    per: dict = {}

    async def collect():
        for _ in range(total):
            name, msg = await sink.get()
            per.setdefault(name, []).append(msg.payload.decode())

    try:
        await asyncio.wait_for(collect(), ctx.t(wait))
    except asyncio.TimeoutError:
        raise AssertionError(f"timeout receiving filtered key-shared messages: {per}")
    finally:
        stop(tasks)
    return per


async def test_key_shared_filter_glob_non_reliable(ctx):
    user_keys, order_keys = ["user-1", "user-2", "user-3"], ["order-1", "order-2", "order-3"]
    per = await _filtered(
        ctx,
        "/default/ks_filter_nr",
        "prod_ks_filter_nr",
        "ks_filter_nr_sub",
        [("filter-cons-user", ["user-*"]), ("filter-cons-order", ["order-*"])],
        [[(k, f"payload-{k}") for k in user_keys + order_keys]],
        6,
        15,
    )
    user = per.get("filter-cons-user", [])
    assert len(user) == len(user_keys), f"user consumer should receive {len(user_keys)} messages, got {user}"
    for m in user:
        assert "user-" in m, f"user consumer received non-user message: {m}"
    order = per.get("filter-cons-order", [])
    assert len(order) == len(order_keys), f"order consumer should receive {len(order_keys)} messages, got {order}"
    for m in order:
        assert "order-" in m, f"order consumer received non-order message: {m}"


async def test_key_shared_filter_glob_reliable(ctx):
    keys = ["eu-west", "eu-east", "us-west", "us-east"]
    per = await _filtered(
        ctx,
        "/default/ks_filter_rel",
        "prod_ks_filter_rel",
        "ks_filter_rel_sub",
        [("filter-eu-cons", ["eu-*"]), ("filter-us-cons", ["us-*"])],
        [[(k, f"{k}-{r}") for k in keys] for r in range(3)],
        12,
        20,
        reliable=True,
        own_clients=False,
        pause=0.1,
    )
    eu = per.get("filter-eu-cons", [])
    assert len(eu) == 6, eu
    for m in eu:
        assert m.startswith("eu-"), f"EU consumer got non-EU message: {m}"
    us = per.get("filter-us-cons", [])
    assert len(us) == 6, us
    for m in us:
        assert m.startswith("us-"), f"US consumer got non-US message: {m}"


async def test_key_shared_filter_mixed_with_unfiltered(ctx):
    keys = ["vip-gold", "vip-platinum", "regular-1", "regular-2"]
    per = await _filtered(
        ctx,
        "/default/ks_filter_mixed",
        "prod_ks_filter_mixed",
        "ks_filter_mixed_sub",
        [("mixed-all-cons", None), ("mixed-vip-cons", ["vip-*"])],
        [[(k, f"payload-{k}") for k in keys]],
        4,
        15,
    )
    vip = per.get("mixed-vip-cons", [])
    for m in vip:
        assert "vip-" in m, f"vip consumer received unexpected message: {m}"
    everything = per.get("mixed-all-cons", [])
    assert everything, "unfiltered consumer should receive at least some messages"
    assert len(vip) + len(everything) == 4, "total messages received should match total sent"


async def test_key_shared_filter_multiple_patterns(ctx):
    keys = ["eu-west", "ap-tokyo", "us-east", "af-cape"]
    per = await _filtered(
        ctx,
        "/default/ks_filter_multi",
        "prod_ks_filter_multi",
        "ks_filter_multi_sub",
        [("multi-euap-cons", ["eu-*", "ap-*"]), ("multi-usaf-cons", ["us-*", "af-*"])],
        [[(k, f"{k}-data") for k in keys]],
        4,
        15,
    )
    euap = per.get("multi-euap-cons", [])
    assert len(euap) == 2, f"EU/AP consumer should get 2 messages: {euap}"
    for m in euap:
        assert m.startswith(("eu-", "ap-")), f"EU/AP consumer got unexpected: {m}"
    usaf = per.get("multi-usaf-cons", [])
    assert len(usaf) == 2, f"US/AF consumer should get 2 messages: {usaf}"
    for m in usaf:
        assert m.startswith(("us-", "af-")), f"US/AF consumer got unexpected: {m}"
