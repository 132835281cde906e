from __future__ import annotations

import os

import pytest
import yaml

from danube.storage.backends import FilesystemBackend, S3Backend
from danube.storage.config import StorageConfig, StorageConfigError

EXAMPLE = """
storage:
  mode: object_store
  local_wal_root: /var/lib/danube/wal
  metadata_prefix: danube
  export_interval_seconds: 30
  local_retention:
    time_minutes: 60
    size_mb: 512
    check_interval_minutes: 1
  wal:
    sync: interval
    sync_interval_ms: 10
    max_file_mb: 16
  durable:
    backend: s3
    root: my-bucket/history
    endpoint: http://127.0.0.1:9000
    region: eu-west-1
    access_key: AK
    secret_key: SK
"""


def test_defaults_are_local_mode_under_the_data_dir(tmp_path):
    cfg = StorageConfig.from_dict(None, data_dir=str(tmp_path))
    assert cfg.mode == "local"
    assert cfg.local_wal_root == os.path.join(str(tmp_path), "wal")
    assert cfg.durable.backend == "fs" and cfg.durable.root == os.path.join(str(tmp_path), "durable")
    assert cfg.local_retention.time_minutes == 2880 and cfg.local_retention.size_mb == 20480
    assert cfg.local_retention.check_interval_minutes == 5
    assert cfg.metadata_prefix == ""
    assert not cfg.exports_continuously
    assert isinstance(cfg.make_backend(), FilesystemBackend)


def test_full_object_store_example_parses():
    cfg = StorageConfig.from_dict(yaml.safe_load(EXAMPLE)["storage"])
    assert cfg.mode == "object_store" and cfg.exports_continuously
    assert cfg.metadata_prefix == "/danube"
    assert cfg.export_interval_s == 30
    assert cfg.local_retention.max_bytes == 512 * 1024 * 1024
    assert cfg.local_retention.max_age_s == 3600
    assert cfg.wal.sync == "interval" and cfg.wal.max_file_bytes == 16 * 1024 * 1024
    assert cfg.durable.backend == "s3" and cfg.durable.root == "my-bucket/history"
    assert cfg.durable.endpoint == "http://127.0.0.1:9000" and cfg.durable.region == "eu-west-1"
    assert cfg.durable.redacted()["secret_key"] == "***"
    backend = cfg.make_backend()
    assert isinstance(backend, S3Backend) and backend.bucket == "my-bucket" and backend.prefix == "history"
    assert cfg.wal_dir("/default/orders") == "/var/lib/danube/wal/default/orders"


def test_shared_fs_uses_durable_root(tmp_path):
    cfg = StorageConfig.from_dict({"mode": "shared_fs", "durable": {"root": str(tmp_path / "mnt")}})
    assert cfg.durable.backend == "fs" and cfg.durable.root == str(tmp_path / "mnt")
    assert cfg.exports_continuously


@pytest.mark.parametrize(
    "section, message",
    [
        ({"mode": "cloud"}, "storage.mode"),
        ({"modes": "local"}, "unknown key"),
        ("local", "expected a mapping"),
        ({"mode": "shared_fs"}, "storage.durable.root"),
        ({"mode": "shared_fs", "durable": {"root": "/x", "backend": "s3"}}, "storage.durable.backend"),
        ({"mode": "object_store", "durable": {"root": "bucket"}}, "storage.durable.backend"),
        ({"mode": "object_store", "durable": {"backend": "gcs", "root": "bucket"}}, "storage.durable.backend"),
        ({"mode": "object_store", "durable": {"backend": "s3"}}, "storage.durable.root"),
        ({"mode": "object_store", "durable": {"backend": "s3", "root": "ab"}}, "3 to 63"),
        (
            {"mode": "object_store", "durable": {"backend": "s3", "root": "bucket", "access_key": "a"}},
            "both access_key and secret_key",
        ),
        (
            {"mode": "object_store", "durable": {"backend": "s3", "root": "bucket", "endpoint": "localhost:9000"}},
            "http(s)://",
        ),
        ({"mode": "object_store", "durable": {"backend": "s3", "root": "bucket", "bogus": 1}}, "unknown key"),
        ({"local_retention": {"size_mb": -1}}, "storage.local_retention.size_mb"),
        ({"local_retention": {"time_minutes": "1h"}}, "expected a number"),
        ({"local_retention": {"check_interval_minutes": 0}}, "check_interval_minutes"),
        ({"local_retention": 5}, "expected a mapping"),
        ({"wal": {"sync": "sometimes"}}, "storage.wal.sync"),
        ({"wal": {"max_file_mb": True}}, "expected a number"),
        ({"wal": {"page_cache_mb": -1}}, "storage.wal.page_cache_mb"),
        ({"wal": {"page_cache_mb": "all"}}, "expected a number"),
        ({"wal": {"syncfs": "yes"}}, "storage.wal.syncfs: expected true or false"),
        ({"export_interval_seconds": 0}, "export_interval_seconds"),
        ({"local_wal_root": ""}, "local_wal_root"),
        ({"metadata_prefix": 7}, "metadata_prefix"),
    ],
)
def test_bad_config_is_rejected_with_the_key_named(section, message):
    with pytest.raises(StorageConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        StorageConfig.from_dict(section)


def test_wal_page_cache_window_defaults_to_128_mib_and_null_leaves_it_to_the_os():
    assert StorageConfig.from_dict(None).wal.open_kwargs()["page_cache_bytes"] == 128 * 1024 * 1024
    assert StorageConfig.from_dict({"wal": {"page_cache_mb": 32}}).wal.page_cache_bytes == 32 * 1024 * 1024
    assert StorageConfig.from_dict({"wal": {"page_cache_mb": None}}).wal.open_kwargs()["page_cache_bytes"] is None


def test_s3_scheme_in_root_is_accepted():
    cfg = StorageConfig.from_dict({"mode": "object_store", "durable": {"backend": "s3", "root": "s3://bkt/p/"}})
    assert cfg.durable.root == "bkt/p"


def test_wal_syncfs_picks_the_process_wide_sync_group():
    from danube.wal.sync import default_sync_group

    on = StorageConfig.from_dict(None).wal.open_kwargs()["sync_group"]
    off = StorageConfig.from_dict({"wal": {"syncfs": False}}).wal.open_kwargs()["sync_group"]
    assert on is default_sync_group() and off is default_sync_group(False) and on is not off
    assert off.syncfs_min_logs == 0
