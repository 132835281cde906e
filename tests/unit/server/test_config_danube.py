"""Danube 0.15's broker YAML loads unchanged: config/danube_broker.yml, danube_broker_secure.yml and
config/for_tests/*.yml of Danube's repository.  Their files are not copied here: the fixtures below
have the same keys and structure with values of our own, and KEYS lists every key path those five
files set, so a fixture that stopped covering one fails the first test."""

from __future__ import annotations

import copy
import logging
import os

import pytest
import yaml

from danube.errors import InvalidArgumentError
from danube.server.config import BrokerConfig

# Every key path Danube 0.15's five sample files set (lists are leaves).
KEYS = {
    "cluster_name",
    "broker.host",
    "broker.ports.client",
    "broker.ports.admin",
    "broker.ports.raft",
    "broker.ports.prometheus",
    "meta_store.data_dir",
    "bootstrap_namespaces",
    "auto_create_topics",
    "auth.mode",
    "auth.tls.cert_file",
    "auth.tls.key_file",
    "auth.tls.ca_file",
    "auth.jwt.secret_key",
    "auth.jwt.issuer",
    "auth.jwt.expiration_time",
    "auth.super_admins",
    "load_manager.assignment_strategy",
    "load_manager.load_report_interval_seconds",
    *(
        f"load_manager.rebalancing.{k}"
        for k in (
            "enabled",
            "aggressiveness",
            "check_interval_seconds",
            "max_moves_per_hour",
            "cooldown_seconds",
            "min_brokers_for_rebalance",
            "min_topic_age_seconds",
            "blacklist_topics",
        )
    ),
    "storage.mode",
    "storage.local_wal_root",
    "storage.metadata_prefix",
    "storage.durable.root",
    "storage.local_retention.time_minutes",
    "storage.local_retention.size_mb",
    "storage.local_retention.check_interval_minutes",
    "storage.wal.rotation.max_bytes",
    *(
        f"storage.write_buffer.{k}"
        for k in (
            "backend",
            "endpoints",
            "wait_replicas",
            "wait_timeout_ms",
            "on_wait_timeout",
            "max_cached_closed_segments",
        )
    ),
    "dispatch.max_unacked_messages",
    *(
        f"policies.{k}"
        for k in (
            "max_producers_per_topic",
            "max_subscriptions_per_topic",
            "max_consumers_per_topic",
            "max_consumers_per_subscription",
            "max_publish_rate",
            "max_subscription_dispatch_rate",
            "max_message_size",
        )
    ),
}

PLAIN = {
    "cluster_name": "river-test",
    "broker": {"host": "127.0.0.1", "ports": {"client": 16650, "admin": 15051, "raft": 17650, "prometheus": 19040}},
    "meta_store": {"data_dir": "./river-data/meta"},
    "bootstrap_namespaces": ["default", "tenant-a"],
    "auto_create_topics": False,
    "auth": {"mode": "none"},
    "load_manager": {
        "assignment_strategy": "balanced",
        "load_report_interval_seconds": 12,
        "rebalancing": {
            "enabled": False,
            "aggressiveness": "conservative",
            "check_interval_seconds": 900,
            "max_moves_per_hour": 4,
            "cooldown_seconds": 100,
            "min_brokers_for_rebalance": 3,
            "min_topic_age_seconds": 500,
            "blacklist_topics": ["/system/*"],
        },
    },
    "storage": {
        "mode": "local",
        "local_wal_root": "./river-data/wal",
        "metadata_prefix": "/river",
        "local_retention": {"time_minutes": 600, "size_mb": 1024, "check_interval_minutes": 2},
        "wal": {"rotation": {"max_bytes": 64 * 1024 * 1024}},
    },
    "dispatch": {"max_unacked_messages": 50},
    "policies": {
        "max_producers_per_topic": 3,
        "max_subscriptions_per_topic": 4,
        "max_consumers_per_topic": 5,
        "max_consumers_per_subscription": 6,
        "max_publish_rate": 0,
        "max_subscription_dispatch_rate": 0,
        "max_message_size": 2 * 1024 * 1024,
    },
}


def _variant(**changes) -> dict:
    doc = copy.deepcopy(PLAIN)
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = doc
        for p in parents:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return doc


SECURE = _variant(
    auth={
        "mode": "tls",
        "tls": {"cert_file": "./certs/broker.pem", "key_file": "./certs/broker.key", "ca_file": "./certs/ca.pem"},
        "jwt": {"secret_key": "river-secret", "issuer": "river-auth", "expiration_time": 1800},
        "super_admins": ["root-ops"],
    }
)
REBALANCE = _variant(
    load_manager__rebalancing__enabled=True,
    load_manager__rebalancing__aggressiveness="aggressive",
    load_manager__rebalancing__check_interval_seconds=7,
    load_manager__assignment_strategy="fair",
)
SHARED_FS = _variant(
    storage__mode="shared_fs", storage__local_wal_root=None, storage__durable={"root": "./river-data/shared"}
)
WRITE_BUFFER = _variant(
    storage__write_buffer={
        "backend": "valkey",
        "endpoints": ["redis://127.0.0.1:6399"],
        "wait_replicas": 1,
        "wait_timeout_ms": 250,
        "on_wait_timeout": "fail",
        "max_cached_closed_segments": 9,
    }
)
SAMPLES = {
    "danube_broker": PLAIN,
    "danube_broker_secure": SECURE,
    "rebalance": REBALANCE,
    "shared_fs": SHARED_FS,
    "write_buffer": WRITE_BUFFER,
}


def _paths(doc, prefix=""):
    for key, value in doc.items():
        if isinstance(value, dict):
            yield from _paths(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def _load(tmp_path, doc) -> BrokerConfig:
    path = tmp_path / "broker.yml"
    path.write_text(yaml.safe_dump(doc))
    os.chmod(path, 0o600)  # the secure sample holds a JWT secret: a world-readable file is refused
    return BrokerConfig.from_yaml(str(path))


def test_the_samples_cover_every_key_of_danubes_files():
    covered = set().union(*(set(_paths(doc)) for doc in SAMPLES.values()))
    assert covered == KEYS


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_sample_loads_and_its_storage_section_parses(tmp_path, name, caplog):
    caplog.set_level(logging.WARNING)
    cfg = _load(tmp_path, SAMPLES[name])
    storage = cfg.storage_config()
    assert storage.mode == SAMPLES[name]["storage"]["mode"]
    assert "broker.ports.raft" in caplog.text  # the one key every sample has that nothing here honours
    assert ("storage.write_buffer" in caplog.text) == (name == "write_buffer")


def test_danube_keys_are_honoured_or_mapped(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    cfg = _load(tmp_path, PLAIN)
    assert (cfg.host, cfg.port, cfg.admin_port, cfg.metrics_port) == ("127.0.0.1", 16650, 15051, 19040)
    assert cfg.cluster_name == "river-test" and not cfg.cluster
    assert cfg.metadata_path == os.path.join("./river-data/meta", "metadata.db")  # Raft's dir: our embedded store
    assert cfg.bootstrap_namespaces == ("default", "tenant-a")
    assert cfg.auto_create_topics is False
    assert (cfg.assignment_strategy, cfg.load_report_interval_seconds) == ("balanced", 12)
    assert cfg.dispatch.max_unacked_messages == 50
    assert (
        cfg.policies.max_producers_per_topic,
        cfg.policies.max_consumers_per_subscription,
        cfg.policies.max_message_size,
    ) == (3, 6, 2 * 1024 * 1024)
    storage = cfg.storage_config()
    assert storage.wal.max_file_bytes == 64 * 1024 * 1024  # wal.rotation.max_bytes
    assert storage.local_wal_root == "./river-data/wal" and storage.metadata_prefix == "/river"
    assert (storage.local_retention.time_minutes, storage.local_retention.size_mb) == (600, 1024)
    warned = [r.getMessage() for r in caplog.records]
    assert warned == [m for m in warned if "broker.ports.raft" in m], warned  # nothing else is dropped


def test_secure_sample_sets_tls_and_jwt(tmp_path):
    cfg = _load(tmp_path, SECURE)
    assert cfg.auth.tls_enabled
    assert os.path.normpath(cfg.auth.tls.cert_file) == str(tmp_path / "certs/broker.pem")
    assert cfg.auth.jwt.issuer == "river-auth" and cfg.auth.super_admins == ("root-ops",)
    assert cfg.url_scheme == "https"


def test_rotation_hours_advanced_and_s3_extras_map_or_warn(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    doc = _variant(
        storage__wal={
            "rotation": {"max_bytes": 8 * 1024 * 1024, "max_hours": 2},
            "advanced": {"cache_capacity": 512, "file_sync": {"interval_ms": 100}},
        },
        broker__advertised_listeners={"broker_url": "broker-0.internal:6650", "connect_url": "proxy.example:6650"},
        meta_store={"data_dir": "./m", "seed_nodes": ["127.0.0.1:7650"]},
        admin_tls=True,
    )
    cfg = _load(tmp_path, doc)
    wal = cfg.storage_config().wal
    assert (wal.max_file_bytes, wal.max_file_age_s) == (8 * 1024 * 1024, 7200.0)
    assert cfg.broker_url == "http://broker-0.internal:6650"
    for key in (
        "storage.wal.advanced.cache_capacity",
        "storage.wal.advanced.file_sync",
        "broker.advertised_listeners.connect_url",
        "meta_store.seed_nodes",
        "admin_tls",
    ):
        assert key in caplog.text, key


def test_etcd_meta_store_still_means_cluster_mode():
    cfg = BrokerConfig.from_dict({"meta_store": {"host": "127.0.0.1", "port": 2379}})
    assert cfg.cluster and cfg.etcd_url == "http://127.0.0.1:2379"


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"auto_create_topics": "yes"}, "auto_create_topics"),
        ({"bootstrap_namespaces": "default"}, "bootstrap_namespaces"),
        ({"bootstrap_namespaces": ["bad name"]}, "namespace"),
        ({"storage": {"wal": {"rotation": {"max_bytes": -1}}}}, "storage.wal.rotation.max_bytes"),
        ({"meta_store": {"data_dir": "./m", "colour": 1}}, "meta_store"),
        ({"admin_tls": "on"}, "admin_tls"),
        ({"colour": "blue"}, "unknown key colour"),
    ],
)
def test_bad_values_are_refused_naming_the_key(doc, message):
    with pytest.raises(InvalidArgumentError, match=message):
        BrokerConfig.from_dict(doc)
