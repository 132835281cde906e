"""A broker started from a Danube-shaped YAML: the embedded metadata store sits in Danube's
meta_store.data_dir, bootstrap_namespaces exist once it serves, and auto_create_topics: false
leaves topic creation to the admin API (danube.client and the official danube-client alike)."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from danube.cli import admin as admin_cli
from danube.client import DanubeClient
from danube.errors import NotFoundError
from tests.support import danube_client_venv as dc
from tests.support.broker import running_broker


def _admin(broker, *args: str, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = admin_cli.main(["--endpoint", f"http://127.0.0.1:{broker.admin_port}", *args])
    return code, capsys.readouterr().out


async def test_danube_config_keys_take_effect(tmp_path, capsys):
    raft_dir = tmp_path / "raft"
    cfg = tmp_path / "danube_broker.yml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "cluster_name": "conformance",
                "broker": {
                    "host": "127.0.0.1",
                    "ports": {"client": 6650, "admin": 50051, "raft": 7650, "prometheus": 9040},
                },
                "meta_store": {"data_dir": str(raft_dir)},
                "bootstrap_namespaces": ["default", "shop"],
                "auto_create_topics": False,
                "storage": {"mode": "local", "wal": {"rotation": {"max_bytes": 4 * 1024 * 1024}}},
            }
        )
    )
    data = tmp_path / "data"
    data.mkdir()
    with running_broker("--config", str(cfg), data_dir=str(data)) as broker:
        assert os.path.exists(raft_dir / "metadata.db")
        assert not os.path.exists(data / "metadata.db")
        code, out = _admin(broker, "brokers", "namespaces", "--output", "json", capsys=capsys)
        assert code == 0 and {"default", "shop"} <= set(json.loads(out))
        assert "broker.ports.raft" in broker.log()  # warned by name, not refused

        client = DanubeClient.builder().service_url(broker.url).build()
        try:
            producer = client.new_producer().with_topic("/shop/unmade").with_name("p").with_reliable(True).build()
            with pytest.raises(NotFoundError, match="Unable to find the topic"):
                await producer.create()
            refused = dc.run_script("create_producer.py", broker.url, "/shop/unmade-too", "--reliable")
            assert refused["error"] and "NOT_FOUND" in refused["error"].upper(), refused

            code, _ = _admin(broker, "topics", "create", "/shop/made", "--dispatch-strategy", "reliable", capsys=capsys)
            assert code == 0
            producer = client.new_producer().with_topic("/shop/made").with_name("p").with_reliable(True).build()
            await producer.create()
            offset = await (await producer.send(b"kept"))
            consumer = (
                client.new_consumer()
                .with_topic("/shop/made")
                .with_consumer_name("c")
                .with_subscription("late")
                .with_initial_position("earliest")
                .build()
            )
            await consumer.subscribe()
            batch = await consumer.receive_batch(timeout=20)
            assert batch is not None and [(m.offset, bytes(m.payload)) for m in batch.messages()] == [(offset, b"kept")]
            await producer.close()
            await consumer.close()
        finally:
            await client.close()
