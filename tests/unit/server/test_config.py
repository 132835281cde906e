import pytest

from danube.errors import InvalidArgumentError
from danube.server.config import BrokerConfig


def test_defaults():
    c = BrokerConfig()
    assert (c.host, c.port, c.admin_port, c.metrics_port, c.data_dir, c.sync) == (
        "127.0.0.1",
        6650,
        50051,
        9040,
        "./danube-data",
        "always",
    )
    assert c.broker_url == "http://127.0.0.1:6650"


def test_yaml_with_danube_keys_and_flag_overrides(tmp_path):
    path = tmp_path / "danube_broker.yml"
    path.write_text(
        "cluster_name: test\n"
        "broker:\n  host: 127.0.0.1\n  ports: {client: 7000, admin: 7001, prom: 7002}\n"
        "data_dir: data\nsync: interval\n"
        "policies: {max_producers_per_topic: 2, max_message_size: 1024}\n"
        "failure_policy: {max_redelivery_count: 3}\n"
        "storage: {mode: local}\n"
    )
    c = BrokerConfig.from_yaml(str(path))
    assert (c.port, c.admin_port, c.metrics_port, c.sync) == (7000, 7001, 7002, "interval")
    assert c.data_dir == str(tmp_path / "data")
    assert c.policies.max_producers_per_topic == 2 and c.failure_policy.max_redelivery_count == 3
    storage = c.storage_config()
    assert (storage.mode, storage.wal.sync) == ("local", "interval")
    assert storage.local_wal_root == str(tmp_path / "data" / "wal")  # under the file's data_dir
    c = c.with_overrides(port=7100, sync=None)
    assert c.port == 7100 and c.sync == "interval"
    moved = c.with_overrides(data_dir=str(tmp_path / "flag"), sync="never").storage_config()
    assert (moved.local_wal_root, moved.durable.root) == (
        str(tmp_path / "flag" / "wal"),
        str(tmp_path / "flag" / "durable"),
    )
    assert moved.wal.sync == "never"


def test_grpc_server_defaults_to_native_and_comes_from_file_or_flag(tmp_path):
    from danube.cli import main as cli
    from danube.cli.broker import build_config

    assert BrokerConfig().grpc_server == "native"
    path = tmp_path / "danube_broker.yml"
    path.write_text("grpc_server: grpcio\n")
    assert BrokerConfig.from_yaml(str(path)).grpc_server == "grpcio"
    parser = cli.build_parser()
    args = parser.parse_args(["broker", "--config", str(path)])
    assert build_config(args).grpc_server == "grpcio"
    args = parser.parse_args(["broker", "--config", str(path), "--grpc-server", "native"])
    assert build_config(args).grpc_server == "native"
    args = parser.parse_args(["broker", "--config", str(path), "--grpc-server", "h2"])  # the former name
    assert build_config(args).grpc_server == "native"
    path.write_text("grpc_server: h2\n")
    assert BrokerConfig.from_yaml(str(path)).grpc_server == "native"
    with pytest.raises(SystemExit):
        parser.parse_args(["broker", "--grpc-server", "tonic"])


def test_flat_danube_addresses():
    c = BrokerConfig.from_dict({"broker_addr": "0.0.0.0:6651", "prom_exporter": "0.0.0.0:9041"})
    assert (c.host, c.port, c.metrics_port) == ("0.0.0.0", 6651, 9041)
    assert c.broker_url == "http://127.0.0.1:6651"


@pytest.mark.parametrize(
    "data, match",
    [
        ({"sync": "sometimes"}, "sync: expected one of always|interval|never, got 'sometimes'"),
        ({"grpc_server": "tonic"}, "grpc_server: expected one of native|grpcio, got 'tonic'"),
        ({"port": "abc"}, "port: expected an integer in 0..65535, got 'abc'"),
        ({"colour": "blue"}, "unknown key colour: not a setting"),
        (
            {"policies": {"max_producer": 1}},
            "unknown key policies.max_producer: not a setting \\(did you mean max_producers_per_topic\\?\\)",
        ),
    ],
)
def test_bad_config_is_a_clear_error(data, match):
    with pytest.raises(InvalidArgumentError, match=match):
        BrokerConfig.from_dict(data)


@pytest.mark.parametrize(
    "ports, match",
    [
        ({"client": 7000, "admin": 7000, "prom": 7002}, "port 7000 is given as both the client and the admin port"),
        ({"client": 7000, "admin": 7001, "prom": 7001}, "port 7001 is given as both the admin and the metrics port"),
        ({"client": 7000, "admin": 7001, "prom": 7000}, "port 7000 is given as both the client and the metrics port"),
    ],
)
def test_one_port_for_two_listeners_is_a_clear_error(ports, match):
    with pytest.raises(InvalidArgumentError, match=match):
        BrokerConfig.from_dict({"broker": {"ports": ports}})
    with pytest.raises(InvalidArgumentError, match=match):
        BrokerConfig().with_overrides(port=ports["client"], admin_port=ports["admin"], metrics_port=ports["prom"])


def test_metrics_off_may_share_the_zero(tmp_path):
    c = BrokerConfig().with_overrides(metrics_port=0, admin_port=0)
    assert (c.admin_port, c.metrics_port) == (0, 0)


def test_missing_file(tmp_path):
    with pytest.raises(InvalidArgumentError, match="cannot read config file"):
        BrokerConfig.from_yaml(str(tmp_path / "nope.yml"))


def test_load_report_interval_from_danube_section_top_level_and_flag(tmp_path):
    assert BrokerConfig().load_report_interval_seconds == 30
    c = BrokerConfig.from_dict({"load_manager": {"load_report_interval_seconds": 5, "assignment_strategy": "balanced"}})
    assert c.load_report_interval_seconds == 5  # other load_manager keys are ignored, not errors
    assert BrokerConfig.from_dict({"load_report_interval_seconds": 0}).load_report_interval_seconds == 0
    assert c.with_overrides(load_report_interval_seconds=None).load_report_interval_seconds == 5

    import argparse

    from danube.cli import broker as broker_cli

    parser = argparse.ArgumentParser()
    broker_cli.register(parser.add_subparsers())
    path = tmp_path / "danube_broker.yml"
    path.write_text("load_manager:\n  load_report_interval_seconds: 12\n")
    args = parser.parse_args(["broker", "--config", str(path)])
    assert broker_cli.build_config(args).load_report_interval_seconds == 12
    args = parser.parse_args(["broker", "--config", str(path), "--load-report-interval", "0.5"])
    assert broker_cli.build_config(args).load_report_interval_seconds == 0.5


@pytest.mark.parametrize(
    "data, match",
    [
        ({"load_manager": {"load_report_interval_seconds": -1}}, "load_manager.load_report_interval_seconds"),
        ({"load_report_interval_seconds": "often"}, "load_report_interval_seconds: expected a number >= 0"),
        ({"load_report_interval_seconds": True}, "load_report_interval_seconds: expected a number >= 0"),
        ({"load_manager": [1, 2]}, "load_manager: expected a mapping"),
    ],
)
def test_bad_load_report_interval_is_a_clear_error(data, match):
    with pytest.raises(InvalidArgumentError, match=match):
        BrokerConfig.from_dict(data)
    with pytest.raises(InvalidArgumentError, match="load_report_interval_seconds: expected a number >= 0, got -2"):
        BrokerConfig().with_overrides(load_report_interval_seconds=-2)


def test_json_schema_rule_and_backoff_strategy(tmp_path):
    assert BrokerConfig().json_schema_rule == "danube"
    path = tmp_path / "b.yml"
    path.write_text(
        "json_schema_rule: reader_writer\nfailure_policy: {backoff_strategy: fixed, max_redelivery_count: 0}\n"
    )
    c = BrokerConfig.from_yaml(str(path))
    assert c.json_schema_rule == "reader_writer"
    assert (c.failure_policy.backoff_strategy, c.failure_policy.max_redelivery_count) == ("fixed", 0)
    path.write_text("json_schema_rule: loose\n")
    with pytest.raises(InvalidArgumentError, match="reader_writer"):
        BrokerConfig.from_yaml(str(path))


def test_client_proxy_is_on_by_default_and_can_be_turned_off():
    from danube.server.config import BrokerConfig

    assert BrokerConfig.from_dict({}).client_proxy is True
    assert BrokerConfig.from_dict({"client_proxy": False}).client_proxy is False
    with pytest.raises(InvalidArgumentError, match="client_proxy: expected true or false, got 'no'"):
        BrokerConfig.from_dict({"client_proxy": "no"})


def test_repartition_adoption_timeout_is_a_broker_setting(tmp_path):
    from danube.routing.repartition.model import DEFAULT_ADOPTION_TIMEOUT_MS

    assert BrokerConfig.from_dict({}).repartition_adoption_timeout_ms == DEFAULT_ADOPTION_TIMEOUT_MS
    c = BrokerConfig.from_dict({"repartition_adoption_timeout_ms": 5000})
    assert c.repartition_adoption_timeout_ms == 5000
    for bad in (0, -1, "5s", True):
        with pytest.raises(InvalidArgumentError, match="repartition_adoption_timeout_ms: expected an integer >= 1"):
            BrokerConfig.from_dict({"repartition_adoption_timeout_ms": bad})
