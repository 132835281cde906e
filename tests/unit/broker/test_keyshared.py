from danube.broker.keyshared import VIRTUAL_NODES, HashRing, KeyFilter


def test_glob_filters():
    f = KeyFilter(["user-*", "eu-west-?"])
    assert f.matches("user-42") and f.matches("eu-west-1")
    assert not f.matches("eu-west-10") and not f.matches("admin")
    assert KeyFilter().matches("anything")


def test_ring_is_stable_and_spreads_keys():
    ring = HashRing()
    for c in (1, 2, 3):
        ring.add(c)
    assert len(ring._points) == 3 * VIRTUAL_NODES
    keys = [f"k{i}" for i in range(3000)]
    owners = {k: ring.owner(k) for k in keys}
    counts = {c: list(owners.values()).count(c) for c in (1, 2, 3)}
    assert all(n > 500 for n in counts.values()), counts
    assert all(ring.owner(k) == owners[k] for k in keys)


def test_removing_a_consumer_moves_only_its_keys():
    ring = HashRing()
    for c in (1, 2, 3):
        ring.add(c)
    keys = [f"k{i}" for i in range(2000)]
    before = {k: ring.owner(k) for k in keys}
    ring.remove(2)
    after = {k: ring.owner(k) for k in keys}
    assert all(after[k] == before[k] for k in keys if before[k] != 2)
    assert 2 not in after.values()


def test_filters_choose_among_accepting_consumers():
    ring = HashRing()
    ring.add(1, KeyFilter(["eu-*"]))
    ring.add(2, KeyFilter(["us-*"]))
    assert ring.owner("eu-north") == 1
    assert ring.owner("us-east") == 2
    assert ring.owner("apac") is None
