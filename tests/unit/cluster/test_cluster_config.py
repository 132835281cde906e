"""Cluster settings: Danube's YAML keys, flags on top, defaults per broker."""

import pytest

from danube.cli import main as cli
from danube.cli.broker import _cluster_overrides, build_config
from danube.errors import InvalidArgumentError
from danube.server.config import BrokerConfig


def _config(argv):
    args = cli.build_parser().parse_args(["broker", *argv])
    return _cluster_overrides(build_config(args), args)


def test_standalone_by_default():
    c = _config([])
    assert not c.cluster and c.etcd_url is None and c.broker_id == "standalone"


def test_danube_yaml_keys_turn_cluster_mode_on(tmp_path):
    path = tmp_path / "danube_broker.yml"
    path.write_text(
        "cluster_name: prod\n"
        "broker:\n  host: 127.0.0.1\n  ports: {client: 7650, admin: 7651, prom: 7652}\n"
        "meta_store: {host: 127.0.0.1, port: 2379}\n"
        "load_manager: {assignment_strategy: balanced, load_report_interval_seconds: 5}\n"
    )
    c = _config(["--config", str(path)])
    assert (c.cluster, c.etcd_url, c.cluster_name, c.assignment_strategy) == (
        True,
        "http://127.0.0.1:2379",
        "prod",
        "balanced",
    )
    assert (c.port, c.load_report_interval_seconds, c.broker_id) == (7650, 5.0, "broker-7650")
    # flags win over the file
    c = _config(
        [
            "--config",
            str(path),
            "--etcd",
            "http://127.0.0.1:3379",
            "--broker-id",
            "b1",
            "--assignment-strategy",
            "fair",
            "--advertised-url",
            "http://10.0.0.1:7650",
            "--lease-ttl",
            "4",
            "--cluster-name",
            "dev",
        ]
    )
    assert (c.etcd_url, c.broker_id, c.assignment_strategy, c.broker_url, c.lease_ttl_seconds, c.cluster_name) == (
        "http://127.0.0.1:3379",
        "b1",
        "fair",
        "http://10.0.0.1:7650",
        4,
        "dev",
    )


def test_cluster_flag_without_etcd_is_refused():
    with pytest.raises(InvalidArgumentError, match="needs etcd"):
        _config(["--cluster"])


@pytest.mark.parametrize(
    "data, match",
    [
        ({"meta_store": {"host": "h"}}, "meta_store"),
        (
            {"meta_store": {"host": "h", "port": 2379}, "load_manager": {"assignment_strategy": "random"}},
            "assignment_strategy",
        ),
    ],
)
def test_bad_cluster_settings(data, match):
    with pytest.raises(InvalidArgumentError, match=match):
        BrokerConfig.from_dict(data).check_cluster()
