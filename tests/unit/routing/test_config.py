"""The broker's scalable_topics: section."""

import pytest

from danube.errors import InvalidArgumentError
from danube.routing.scalable.config import ScalableTopicsConfig
from danube.server.config import BrokerConfig


def test_section_defaults_and_values():
    assert BrokerConfig().scalable_topics is None
    cfg = BrokerConfig.from_dict({"scalable_topics": {"session_grace_seconds": 5, "controller_lease_seconds": 4}})
    assert cfg.scalable_topics == ScalableTopicsConfig(True, 5.0, 4)
    auto = BrokerConfig.from_dict({"scalable_topics": {"auto_split_rate": 5000, "max_segments": 8}}).scalable_topics
    assert (auto.auto_split_rate, auto.max_segments, auto.auto_split_interval_seconds) == (5000.0, 8, 10.0)
    assert BrokerConfig.from_dict({"scalable_topics": {"enabled": False}}).scalable_topics.enabled is False
    with pytest.raises(InvalidArgumentError):
        BrokerConfig.from_dict({"scalable_topics": {"grace": 5}})
    with pytest.raises(InvalidArgumentError):
        BrokerConfig.from_dict({"scalable_topics": {"session_grace_seconds": 0}})
    with pytest.raises(InvalidArgumentError):
        BrokerConfig.from_dict({"scalable_topics": [1]})


def test_step_hook_names_a_function_and_a_bad_one_is_a_clear_error():
    assert ScalableTopicsConfig().load_step_hook() is None  # off by default
    cfg = BrokerConfig.from_dict(
        {"scalable_topics": {"step_hook": "tests.support.scalable_crash:exit_at_step"}}
    ).scalable_topics
    from tests.support.scalable_crash import exit_at_step

    assert cfg.load_step_hook() is exit_at_step
    with pytest.raises(InvalidArgumentError, match="package.module:function"):
        BrokerConfig.from_dict({"scalable_topics": {"step_hook": "no_colon"}})
    with pytest.raises(InvalidArgumentError, match="cannot be loaded"):
        ScalableTopicsConfig(step_hook="tests.support.no_such_module:hook").load_step_hook()
    with pytest.raises(InvalidArgumentError, match="cannot be loaded"):
        ScalableTopicsConfig(step_hook="tests.support.scalable_crash:no_such_function").load_step_hook()
    with pytest.raises(InvalidArgumentError, match="not a function"):
        ScalableTopicsConfig(step_hook="tests.support.scalable_crash:ENV").load_step_hook()
