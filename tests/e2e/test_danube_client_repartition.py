"""What a Danube-protocol client (the real danube-client 0.5.0, which reads the partition count once,
at create and at subscribe) gets across a live repartition (docs/repartition.md):

- a producer built for 2 partitions keeps publishing through a grow 2 -> 4 and a shrink back, and
  one built for 4 while the topic has 4 keeps publishing after the shrink retired 2 of them: none
  of their publishes fails;
- nothing they publish is lost: a consumer that subscribes again reads every partition (the
  retired ones too) and gets every message, each producer's messages of a key in publish order.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.support import danube_client_venv as dc
from tests.support.broker import running_broker
from tests.support.processes import stop_process
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)

T = "/default/dc-repart"
KEYS = ",".join(f"k{i}" for i in range(16))


@pytest.fixture(scope="module")
def client_python():
    try:
        return dc.ensure_venv()
    except Exception as exc:  # noqa: BLE001 - no network / no package index
        pytest.skip(f"danube-client venv not available: {exc}")


def admin(broker, *args: str) -> dict:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "danube.cli.main",
            "admin",
            "--endpoint",
            f"http://127.0.0.1:{broker.admin_port}",
            "--output",
            "json",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def partitioning(broker) -> dict:
    return admin(broker, "topics", "describe", T)["partitioning"]


def finish(proc, timeout=120) -> dict:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_process(proc)
        out, err = proc.communicate()
        raise AssertionError(f"script timed out\nstdout:{out}\nstderr:{err[-4000:]}")
    return dc.parse_result("script", proc.returncode, out, err)


def start_consumer(broker, tmp_path, name: str, *args: str):
    ready = tmp_path / f"ready-{name}"
    proc = dc.start_script("consume.py", broker.url, T, "s", "--name", name, "--ready-file", str(ready), *args)
    wait_until(lambda: ready.exists() or proc.poll() is not None, timeout=60, what=f"{name} subscribed")
    assert proc.poll() is None, finish(proc)
    return proc


def produce(broker, prefix: str, partitions: int, count: int):
    return dc.start_script(
        "produce.py",
        broker.url,
        T,
        "--reliable",
        "--partitions",
        str(partitions),
        "--name",
        prefix,
        "--prefix",
        prefix,
        "--keys",
        KEYS,
        "--count",
        str(count),
        "--delay-ms",
        "10",
    )


def test_a_danube_client_publishes_through_grow_and_shrink_and_a_resubscribed_consumer_reads_all(
    client_python, tmp_path
):
    # the official client acks no topology: the adoption timeout decides each finalize, kept short
    config = tmp_path / "broker.yml"
    config.write_text("repartition_adoption_timeout_ms: 1000\n")
    with running_broker("--config", str(config)) as broker:
        admin(broker, "topics", "create", T, "--partitions", "2", "--dispatch-strategy", "reliable")
        first = start_consumer(broker, tmp_path, "first", "--seconds", "8")  # reads the 2 partitions it saw
        two = produce(broker, "two", 2, 700)  # built for 2 partitions
        time.sleep(1.5)
        assert admin(broker, "topics", "repartition", T, "--partitions", "4")["partitioning_version"] == 1
        four = produce(broker, "four", 4, 1500)  # built for 4
        wait_until(lambda: partitioning(broker)["marker"] is None, timeout=60, what="grow finalized")
        assert admin(broker, "topics", "repartition", T, "--partitions", "2")["partitioning_version"] == 2
        # the shrink drains once a consumer of "s" read the shrunk-away partitions: the first
        # consumer never attached to them; it goes, and the same subscription comes back
        early = finish(first)
        again = start_consumer(broker, tmp_path, "again", "--idle-timeout", "6")
        wait_until(lambda: partitioning(broker)["marker"] is None, timeout=60, what="shrink finalized")
        assert four.poll() is None, "the producer built for 4 partitions must still publish after the finalize"
        info = partitioning(broker)
        assert info["partitions"] == 2 and info["retired"] == [2, 3]
        sent = finish(two)["sent"] + finish(four)["sent"]  # exit 0: none of their publishes failed
        late = finish(again)
    assert len(sent) == 2200
    received = early["received"] + late["received"]
    assert {r[0] + "@" + r[3] for r in received} >= set(sent)  # nothing lost
    assert {r[1] for r in late["received"]} >= {f"{T}-part-2", f"{T}-part-3"}  # it read every partition
    # each producer's messages of a key in publish order (first arrival: a message the first
    # consumer took and did not ack comes again to the second)
    last: dict[tuple[str, str], int] = {}
    for payload, _topic, _offset, key in received:
        prefix, i = payload.rsplit("-", 1)
        before = last.get((prefix, key), int(key[1:]) - 16)  # produce.py: key k<n> for every i = n mod 16
        if int(i) <= before:
            continue  # a redelivery of one seen before
        assert int(i) == before + 16, (prefix, key, i, before)
        last[(prefix, key)] = int(i)
