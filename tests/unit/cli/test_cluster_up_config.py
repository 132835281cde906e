"""`danube cluster up --config FILE`: every broker it starts gets the file (with --storage merged in)."""

import yaml

from danube.cli.cluster import LocalCluster, register


def _cluster(tmp_path, **kw) -> LocalCluster:
    cluster = LocalCluster(base_dir=str(tmp_path / "c"), **kw)
    cluster.etcd = type("Etcd", (), {"url": "http://127.0.0.1:2379"})()  # not started: commands only
    return cluster


def _config_of(cmd: list[str]) -> str:
    return cmd[cmd.index("--config") + 1]


def test_every_broker_and_every_joining_broker_gets_the_file(tmp_path):
    path = tmp_path / "danube_broker.yml"
    path.write_text("load_manager:\n  rebalancing:\n    enabled: true\n")
    cluster = _cluster(tmp_path, config=str(path), metrics=True)
    procs = [cluster.add_broker(i) for i in (1, 2, 3)]
    for p in procs:
        assert _config_of(p.cmd) == str(path)
        assert "--cluster" in p.cmd and p.cmd[p.cmd.index("--etcd") + 1] == "http://127.0.0.1:2379"
        assert p.metrics_port and p.cmd[p.cmd.index("--metrics-port") + 1] == str(p.metrics_port)
        assert p.describe()["metrics_url"] == f"http://127.0.0.1:{p.metrics_port}/metrics"
    assert "metrics_url" not in _cluster(tmp_path).add_broker(1).describe()


def test_storage_is_merged_into_a_copy_of_the_file_unless_the_file_has_its_own(tmp_path):
    path = tmp_path / "danube_broker.yml"
    path.write_text("load_manager:\n  assignment_strategy: fair\n")
    p = _cluster(tmp_path, config=str(path), storage="shared_fs").add_broker(1)
    merged = yaml.safe_load(open(_config_of(p.cmd)))
    assert merged["load_manager"] == {"assignment_strategy": "fair"}
    assert merged["storage"]["mode"] == "shared_fs"
    own = tmp_path / "own.yml"
    own.write_text("storage:\n  mode: shared_fs\n  durable:\n    root: /somewhere\n")
    p = _cluster(tmp_path, config=str(own), storage="object_store").add_broker(1)
    assert _config_of(p.cmd) == str(own)


def test_cluster_up_has_config_and_metrics_flags():
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["cluster", "up", "--config", "f.yml", "--metrics"])
    assert (args.config, args.metrics) == ("f.yml", True)


def _parse(*argv):
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["cluster", "up", *argv])


def test_export_interval_defaults_to_seconds_and_reaches_the_brokers_storage_section(tmp_path):
    from danube.storage.config import StorageConfig

    args = _parse("--storage", "shared_fs")
    assert args.export_interval == 5.0  # not the broker's 300 s: load-stats sees a live cluster
    p = _cluster(tmp_path, storage="shared_fs", export_interval=args.export_interval).add_broker(1)
    section = yaml.safe_load(open(_config_of(p.cmd)))["storage"]
    assert section["export_interval_seconds"] == 5
    assert StorageConfig.from_dict(section, data_dir=str(tmp_path)).export_interval_s == 5.0
    p = _cluster(tmp_path, storage="shared_fs", export_interval=_parse("--export-interval", "1.5").export_interval)
    assert yaml.safe_load(open(_config_of(p.add_broker(1).cmd)))["storage"]["export_interval_seconds"] == 1.5


def test_export_interval_in_help_and_refused_when_not_positive(capsys):
    import argparse

    from danube.cli.cluster import run_up

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    try:
        parser.parse_args(["cluster", "up", "--help"])
    except SystemExit:
        pass
    text = " ".join(capsys.readouterr().out.split())
    assert "--export-interval SECONDS" in text and "[default 5;" in text
    assert run_up(_parse("--export-interval", "0")) == 2
