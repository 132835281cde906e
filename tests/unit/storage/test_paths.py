"""The second wall: directories built from topic names are checked before any mkdir, rename or rmtree."""

from __future__ import annotations

import os

import pytest

from danube.errors import InvalidTopicNameError, UnsafePathError
from danube.storage.config import StorageConfig
from danube.storage.paths import check_topic_dir, remove_topic_dir, set_aside, topic_dir


def tree(root) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for entry in dirnames + filenames:
            out.append(os.path.relpath(os.path.join(dirpath, entry), root))
    return sorted(out)


@pytest.fixture()
def wal_root(tmp_path):
    root = tmp_path / "data" / "wal"
    for topic in ("victim", "other"):
        (root / "default" / topic).mkdir(parents=True)
        (root / "default" / topic / "wal-00000000000000000001.log").write_bytes(b"x")
    return str(root)


@pytest.mark.parametrize(
    "path",
    [
        "",
        ".",
        "..",
        "default",
        "default/.",
        "default/..",
        "default/victim/..",
        "default/victim/x",
        "../other-root/default/victim",
        "default/.hidden",
    ],
)
def test_only_a_topic_directory_passes(wal_root, path):
    with pytest.raises(UnsafePathError):
        check_topic_dir(wal_root, os.path.join(wal_root, path))


def test_a_path_is_judged_by_where_it_resolves(wal_root):
    victim = os.path.join(wal_root, "default", "victim")
    assert check_topic_dir(wal_root, os.path.join(wal_root, "..", "wal", "default", "victim")) == victim


def test_an_absolute_path_elsewhere_is_refused(wal_root, tmp_path):
    with pytest.raises(UnsafePathError):
        check_topic_dir(wal_root, str(tmp_path / "data"))


def test_removing_a_topic_touches_only_its_own_directory(wal_root, tmp_path):
    before = tree(tmp_path)
    for bad in ("default", "default/.", os.path.join("default", "victim", "..")):
        with pytest.raises(UnsafePathError):
            remove_topic_dir(wal_root, os.path.join(wal_root, bad))
    assert tree(tmp_path) == before
    remove_topic_dir(wal_root, topic_dir(wal_root, "/default/other"))
    assert tree(tmp_path) == [p for p in before if "other" not in p]


def test_a_set_aside_wal_gets_a_name_no_topic_can_have(wal_root):
    moved = set_aside(wal_root, topic_dir(wal_root, "/default/victim"))
    assert os.path.basename(moved).startswith(".stale-victim-")
    assert os.listdir(moved) == ["wal-00000000000000000001.log"]
    with pytest.raises(InvalidTopicNameError):
        topic_dir(wal_root, "/default/" + os.path.basename(moved))


def test_the_storage_config_builds_wal_directories_through_the_check(tmp_path):
    config = StorageConfig.from_dict({}, data_dir=str(tmp_path))
    assert config.wal_dir("/default/t") == os.path.join(os.path.realpath(tmp_path / "wal"), "default", "t")
    for topic in ("/../..", "/./..", "/../x", "/default/..", "/default/."):
        with pytest.raises(InvalidTopicNameError):
            config.wal_dir(topic)
