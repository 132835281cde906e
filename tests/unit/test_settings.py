"""The one settings loader (danube.settings) and the broker file it loads: every wrong key or value is
a ConfigError whose sentence names the key path; nothing else escapes, whatever the mapping."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from danube.errors import InvalidArgumentError
from danube.server.config import BrokerConfig, BrokerSection, EtcdSection, LoadManagerSection
from danube.server.h2grpc.limits import H2Limits
from danube.settings import ConfigError, check_settings, describe_section, load_section, setting
from danube.storage.config import StorageKeys

DOCS = Path(__file__).resolve().parents[2] / "docs" / "broker.md"


@dataclasses.dataclass(frozen=True)
class Inner:
    depth: int = setting(1, minimum=1, maximum=9)


@dataclasses.dataclass(frozen=True)
class Sample:
    name: str = "x"
    mode: str = setting("fast", choices=("fast", "safe"), aliases={"quick": "fast"})
    flag: bool = False
    count: int = setting(3, minimum=0)
    ratio: float = setting(0.5, above=0)
    maybe: int | None = None
    tags: tuple[str, ...] = ()
    inner: Inner = dataclasses.field(default_factory=Inner)
    derived: str = setting("d", in_file=False)

    def __post_init__(self) -> None:
        check_settings(self)
        if self.name == "forbidden":
            raise ConfigError("name", "this name is reserved")


def _error(data, path="sample") -> str:
    with pytest.raises(ConfigError) as info:
        load_section(Sample, data, path)
    return str(info.value)


def test_values_load_with_their_types():
    s = load_section(Sample, {"mode": "quick", "count": 0, "ratio": 2, "tags": ["a", "b"], "inner": {"depth": 9}}, "s")
    assert (s.mode, s.count, s.ratio, s.tags, s.inner.depth) == ("fast", 0, 2.0, ("a", "b"), 9)
    assert isinstance(s.ratio, float)
    assert load_section(Sample, None, "s") == Sample()
    assert load_section(Sample, {"maybe": None}, "s").maybe is None
    assert load_section(Sample, {"count": 4.0}, "s").count == 4  # an integral number is an integer
    # YAML's empty ``inner:`` and ``tags:``: the defaults, as before the one loader
    assert load_section(Sample, {"inner": None, "tags": None}, "s") == Sample()


@pytest.mark.parametrize(
    "data, sentence",
    [
        ({"mdoe": "fast"}, "unknown key sample.mdoe: not a setting (did you mean mode?)"),
        ({"zzz": 1}, "unknown key sample.zzz: not a setting (the settings here are name, mode, flag"),
        ({"derived": "y"}, "unknown key sample.derived"),  # not a key of the file
        ({1: "x"}, "unknown key sample.1"),
        ({"mode": "x"}, "sample.mode: expected one of fast|safe, got 'x'"),
        ({"mode": 3}, "sample.mode: expected one of fast|safe, got 3"),
        ({"name": 5}, "sample.name: expected a string, got 5"),
        ({"name": None}, "sample.name: expected a string, got null"),
        ({"flag": "yes"}, "sample.flag: expected true or false, got 'yes'"),
        ({"count": -1}, "sample.count: expected an integer >= 0, got -1"),
        ({"count": True}, "sample.count: expected an integer >= 0, got True"),
        ({"count": 1.5}, "sample.count: expected an integer >= 0, got 1.5"),
        ({"count": "3"}, "sample.count: expected an integer >= 0, got '3'"),
        ({"ratio": 0}, "sample.ratio: expected a number > 0, got 0"),
        ({"ratio": float("nan")}, "sample.ratio: expected a number > 0, got nan"),
        ({"ratio": float("inf")}, "sample.ratio: expected a number > 0, got inf"),
        ({"tags": "a"}, "sample.tags: expected a list, got 'a'"),
        ({"tags": ["a", 2]}, "sample.tags[1]: expected a string, got 2"),
        ({"inner": {"depth": 10}}, "sample.inner.depth: expected an integer in 1..9, got 10"),
        ({"inner": {"dpeth": 1}}, "unknown key sample.inner.dpeth: not a setting (did you mean depth?)"),
        ({"inner": [1]}, "sample.inner: expected a mapping of settings, got [1]"),
        ({"name": "forbidden"}, "sample.name: this name is reserved"),  # the section's own check, placed
    ],
)
def test_every_bad_key_or_value_is_a_sentence_naming_its_path(data, sentence):
    assert _error(data).startswith(sentence)


def test_a_section_that_is_not_a_mapping_names_its_path():
    assert _error([1, 2]) == "sample: expected a mapping of settings, got [1, 2]"
    assert _error("text", path="") == "expected a mapping of settings, got 'text'"


def test_the_error_is_an_invalid_argument_and_a_value_error():
    with pytest.raises(InvalidArgumentError):
        load_section(Sample, {"count": -1}, "s")
    with pytest.raises(ValueError):  # what code that builds a section directly may catch
        Sample(count=-1)


def test_sections_built_in_code_are_checked_the_same_way():
    with pytest.raises(ConfigError, match=r"^count: expected an integer >= 0, got -1$"):
        Sample(count=-1)
    assert Sample(ratio=1).ratio == 1.0 and isinstance(Sample(ratio=1).ratio, float)
    with pytest.raises(ConfigError, match="max_frame_size: expected an integer in 16384..16777215, got 100"):
        H2Limits(max_frame_size=100)
    with pytest.raises(ConfigError, match="^lease_ttl_seconds: expected an integer >= 2, got 1$"):
        BrokerConfig().with_overrides(lease_ttl_seconds=1)


@pytest.mark.parametrize(
    "data, sentence",
    [
        ({"sync": "x"}, "sync: expected one of always|interval|never, got 'x'"),
        ({"storage": {"wal": {"sync": "x"}}}, "storage.wal.sync: expected one of always|interval|never, got 'x'"),
        (
            {"http2": {"max_frame_sizee": 1}},
            "unknown key http2.max_frame_sizee: not a setting (did you mean max_frame_size?)",
        ),
        ({"http2": {"idle_timeout": "long"}}, "http2.idle_timeout: expected a number >= 0, got 'long'"),
        (
            {"http2": {"max_concurrent_streams": 0}},
            "http2.max_concurrent_streams: expected an integer in 1..2147483647, got 0",
        ),
        ({"http2": 5}, "http2: expected a mapping of settings, got 5"),
        ({"broker": {"ports": {"client": 70000}}}, "broker.ports.client: expected an integer in 0..65535, got 70000"),
        ({"broker": {"hots": "h"}}, "unknown key broker.hots: not a setting (did you mean host?)"),
        ({"broker": "h"}, "broker: expected a mapping, got 'h'"),
        ({"broker_addr": "nowhere"}, "broker_addr: expected host:port, got 'nowhere'"),
        ({"broker_addr": "h:99999"}, "broker_addr: expected an integer in 0..65535, got 99999"),
        ({"policies": {"max_message_size": -1}}, "policies.max_message_size: expected an integer >= 0, got -1"),
        ({"failure_policy": {"poison_policy": "dead_letter"}}, "failure_policy.dead_letter_topic: poison_policy"),
        ({"failure_policy": {"backoff_strategy": "linear"}}, "failure_policy.backoff_strategy: expected one of"),
        (
            {"dispatch": {"cursor_flush_interval_ms": 9000}},
            "dispatch.cursor_flush_interval_ms: expected an integer in 0..5000",
        ),
        ({"scalable_topics": {"max_segments": 0}}, "scalable_topics.max_segments: expected an integer >= 1, got 0"),
        ({"scalable_topics": {"grace": 1}}, "unknown key scalable_topics.grace"),
        (
            {"load_manager": {"assignment_strategy": "random"}},
            "load_manager.assignment_strategy: expected one of fair|",
        ),
        ({"load_manager": {"rebalancing": {"planner": "magic"}}}, "load_manager.rebalancing.planner"),
        ({"load_manager": 3}, "load_manager: expected a mapping of settings, got 3"),
        ({"meta_store": {"host": "h", "port": "p"}}, "meta_store.port: expected an integer in 0..65535, got 'p'"),
        ({"meta_store": {"host": "h"}}, "meta_store: expected {host: ..., port: ...} (etcd)"),
        ({"auth": {"mode": "tls", "tls": {"cert": "c"}}}, "unknown key auth.tls.cert"),
        ({"auth": "on"}, "auth: expected a mapping of settings, got 'on'"),
        ({"bootstrap_namespaces": ["ok", 3]}, "bootstrap_namespaces[1]: expected a string, got 3"),
        ({"json_schema_rule": "loose"}, "json_schema_rule: expected one of danube|reader_writer, got 'loose'"),
        ({"repartition_adoption_timeout_ms": 0}, "repartition_adoption_timeout_ms: expected an integer >= 1, got 0"),
        ({"lease_ttl_seconds": "10"}, "lease_ttl_seconds: expected an integer >= 2, got '10'"),
        (
            {"sync": "never", "storage": {"wal": {"sync": "always"}}},
            "storage.wal.sync: 'always' differs from sync 'never'",
        ),
    ],
)
def test_the_broker_file_names_the_bad_key(data, sentence):
    with pytest.raises(ConfigError) as info:
        BrokerConfig.from_dict(data)
    assert str(info.value).startswith(sentence), str(info.value)


def test_http2_and_storage_are_typed_sections_loaded_once():
    c = BrokerConfig.from_dict(
        {"http2": {"max_connections": 7, "idle_timeout": 0}, "storage": {"wal": {"cache_mb": 1}}}
    )
    assert isinstance(c.http2, H2Limits) and (c.http2.max_connections, c.http2.idle_timeout) == (7, 0.0)
    assert c.storage.wal.cache_bytes == 1024 * 1024
    assert BrokerConfig().http2 == H2Limits()
    # the WAL's sync is one setting, given either way
    assert BrokerConfig.from_dict({"storage": {"wal": {"sync": "never"}}}).storage_config().wal.sync == "never"
    assert BrokerConfig.from_dict({"sync": "interval"}).storage_config().wal.sync == "interval"


# Values of the kinds a YAML file holds, nested a little.
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["always", "never", "native", "h2", "fair", "dead_letter", "local", "tls", "danube", "/x"]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_KEYS = sorted(
    {row[0].split(".")[0] for row in describe_section(BrokerConfig)}
    | {"broker", "meta_store", "load_manager", "broker_addr", "admin_addr", "prom_exporter", "admin_tls"}
)


def _section_value(keys):
    return st.dictionaries(st.sampled_from(keys) | st.text(max_size=8), _values, max_size=4)


_section_keys = {
    "broker": ["host", "advertised_addr", "ports", "advertised_listeners"],
    "http2": [f.name for f in dataclasses.fields(H2Limits)],
    "storage": ["mode", "wal", "durable", "local_retention", "local_wal_root", "export_interval_seconds"],
    "load_manager": ["assignment_strategy", "load_report_interval_seconds", "rebalancing"],
    "meta_store": ["host", "port", "data_dir", "seed_nodes"],
    "auth": ["mode", "tls", "jwt", "super_admins", "rbac_refresh_seconds"],
    "scalable_topics": ["enabled", "max_segments", "session_grace_seconds"],
}
_files = st.dictionaries(
    st.sampled_from(_KEYS),
    st.one_of(_values, *(_section_value(v) for v in _section_keys.values())),
    max_size=6,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_files)
def test_random_files_load_or_raise_only_the_config_error(data):
    try:
        config = BrokerConfig.from_dict(data)
    except ConfigError as exc:
        assert str(exc)  # a sentence, never empty
    else:
        assert isinstance(config.http2, H2Limits)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(max_size=10) | st.integers(), _values, max_size=5))
def test_random_mappings_for_a_section_load_or_raise_only_the_config_error(data):
    for cls, path in ((H2Limits, "http2"), (Sample, "sample"), (BrokerSection, "broker"), (EtcdSection, "meta_store")):
        try:
            load_section(cls, data, path)
        except ConfigError as exc:
            assert path in str(exc) or "unknown key" in str(exc)


def test_every_setting_is_documented_in_the_broker_page():
    page = DOCS.read_text(encoding="utf-8")
    missing = []
    sections = [
        (BrokerConfig, ""),
        (BrokerSection, "broker"),
        (LoadManagerSection, "load_manager"),
        (EtcdSection, "meta_store"),
    ]
    for cls, path in sections:
        for key, _kind, _default in describe_section(cls, path):
            if key.startswith("http2."):  # the limits' table names them without the prefix
                documented = f"`{key.removeprefix('http2.')}`" in page
            elif key.split(".")[0] in ("policies", "failure_policy"):  # the YAML example lists them
                documented = re.search(rf"^\s+{re.escape(key.split('.')[-1])}:", page, re.M) is not None
            else:
                documented = f"`{key}`" in page or f"`{key}.*`" in page
            if not documented:
                missing.append(key)
    assert not missing, f"settings not in docs/broker.md: {missing}"


def test_every_storage_setting_is_documented_in_the_storage_page():
    page = (DOCS.parent / "storage.md").read_text(encoding="utf-8")
    missing = [
        key
        for key, _kind, _default in describe_section(StorageKeys, "storage")
        if not re.search(rf"^\s+{re.escape(key.split('.')[-1])}:", page, re.M)
    ]
    assert not missing, f"settings not in docs/storage.md: {missing}"
