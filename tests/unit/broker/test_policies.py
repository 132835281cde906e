import pytest

from danube.broker.policies import DispatchSettings, FailurePolicy, TopicPolicies
from danube.errors import InvalidArgumentError


def test_defaults_follow_danube():
    p = TopicPolicies()
    assert p.max_message_size == 10 * 1024 * 1024 and p.max_producers_per_topic == 0
    f = FailurePolicy()
    assert (f.max_redelivery_count, f.ack_timeout_ms, f.poison_policy) == (5, 30_000, "block")


def test_backoff_is_exponential_and_capped():
    f = FailurePolicy(base_redelivery_delay_ms=100, max_redelivery_delay_ms=1000)
    assert [f.backoff_ms(a) for a in (1, 2, 3, 4, 5)] == [100, 200, 400, 800, 1000]


def test_nack_delay_is_max_of_policy_and_request_capped():
    f = FailurePolicy(base_redelivery_delay_ms=100, max_redelivery_delay_ms=1000)
    assert f.nack_delay_ms(1, None) == 100
    assert f.nack_delay_ms(1, 500) == 500
    assert f.nack_delay_ms(3, 50) == 400
    assert f.nack_delay_ms(1, 10_000) == 1000


def test_bad_values_are_clear_errors():
    with pytest.raises(InvalidArgumentError, match="unknown key policies.max_producer"):
        TopicPolicies.from_dict({"max_producer": 1})
    with pytest.raises(InvalidArgumentError, match="policies.max_message_size: expected an integer >= 0"):
        TopicPolicies.from_dict({"max_message_size": -1})
    with pytest.raises(InvalidArgumentError, match="poison_policy"):
        FailurePolicy.from_dict({"poison_policy": "explode"})
    with pytest.raises(InvalidArgumentError, match="dead_letter_topic"):
        FailurePolicy.from_dict({"poison_policy": "dead_letter"})
    with pytest.raises(InvalidArgumentError, match="cursor_flush_interval_ms"):
        DispatchSettings.from_dict({"cursor_flush_interval_ms": 10_000})


def test_fixed_backoff_and_danube_spellings():
    f = FailurePolicy(base_redelivery_delay_ms=50, max_redelivery_delay_ms=1000, backoff_strategy="fixed")
    assert [f.backoff_ms(a) for a in (1, 2, 5)] == [50, 50, 50]
    assert FailurePolicy().backoff_strategy == "exponential"  # Danube's default
    g = FailurePolicy.from_dict(
        {"poison_policy": "DeadLetter", "dead_letter_topic": "/default/dlq", "backoff_strategy": "Fixed"}
    )
    assert (g.poison_policy, g.backoff_strategy) == ("dead_letter", "fixed")
    assert FailurePolicy.from_dict({"dead_letter_topic": None}).dead_letter_topic == ""
    with pytest.raises(InvalidArgumentError, match="backoff_strategy"):
        FailurePolicy.from_dict({"backoff_strategy": "linear"})
    with pytest.raises(InvalidArgumentError, match="dead_letter_topic"):
        FailurePolicy(poison_policy="dead_letter", dead_letter_topic="  ")
