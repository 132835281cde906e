"""`danube admin topics set-failure-policy | get-failure-policy`: Danube's flags, both flag placements,
bad input refused with a sentence and exit 2 before any broker is asked."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from danube.cli import admin

DANUBE_SET = [
    "topics",
    "set-failure-policy",
    "/shop/orders",
    "--subscription",
    "s1",
    "--max-redelivery-count",
    "0",
    "--ack-timeout-ms",
    "5000",
    "--base-redelivery-delay-ms",
    "50",
    "--max-redelivery-delay-ms",
    "50",
    "--poison-policy",
    "dead_letter",
    "--dead-letter-topic",
    "/shop/orders-dlq",
]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="danube")
    admin.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["admin", *argv])


def refused(*argv: str) -> str:
    """stderr of a command line argparse refuses (exit 2)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    return err.getvalue()


def test_danube_set_command_line():
    a = parse(*DANUBE_SET)
    assert (a.admin_group, a.admin_cmd, a.topic, a.subscription) == (
        "topics",
        "set-failure-policy",
        "/shop/orders",
        "s1",
    )
    assert (a.max_redelivery_count, a.ack_timeout_ms, a.base_redelivery_delay_ms, a.max_redelivery_delay_ms) == (
        0,
        5000,
        50,
        50,
    )
    assert (a.poison_policy, a.dead_letter_topic) == ("dead_letter", "/shop/orders-dlq")
    assert a.backoff_strategy == "fixed"  # Danube's default
    assert a.output == "text"


def test_short_subscription_flag_namespace_and_exponential_backoff():
    a = parse(
        "topics",
        "set-failure-policy",
        "orders",
        "--namespace",
        "shop",
        "-s",
        "s1",
        "--max-redelivery-count",
        "3",
        "--ack-timeout-ms",
        "1",
        "--base-redelivery-delay-ms",
        "2",
        "--max-redelivery-delay-ms",
        "4",
        "--backoff-strategy",
        "exponential",
        "--poison-policy",
        "dead-letter",
    )
    assert (a.namespace, a.subscription, a.backoff_strategy, a.poison_policy) == (
        "shop",
        "s1",
        "exponential",
        "dead-letter",
    )
    assert a.dead_letter_topic is None


@pytest.mark.parametrize(
    "argv",
    [
        [
            "topics",
            "get-failure-policy",
            "/shop/orders",
            "--subscription",
            "s1",
            "--output",
            "json",
            "--endpoint",
            "http://h:1",
        ],
        ["--endpoint", "http://h:1", "-o", "json", "topics", "get-failure-policy", "/shop/orders", "-s", "s1"],
    ],
)
def test_get_takes_output_and_endpoint_in_either_place(argv):
    a = parse(*argv)
    assert (a.admin_cmd, a.topic, a.subscription, a.output, a.endpoint) == (
        "get-failure-policy",
        "/shop/orders",
        "s1",
        "json",
        "http://h:1",
    )


@pytest.mark.parametrize(
    "flag, value, words",
    [
        ("--max-redelivery-count", "-1", "from 0 to 4294967295"),
        ("--max-redelivery-count", "4294967296", "from 0 to 4294967295"),
        ("--ack-timeout-ms", "soon", "expected a whole number"),
        ("--base-redelivery-delay-ms", "1.5", "expected a whole number"),
        ("--poison-policy", "retry", "invalid choice"),
    ],
)
def test_bad_values_are_refused_with_a_sentence(flag, value, words):
    argv = list(DANUBE_SET)
    argv[argv.index(flag) + 1] = value
    err = refused(*argv)
    assert flag in err and words in err, err


def test_bad_backoff_strategy_is_refused():
    assert "invalid choice" in refused(*DANUBE_SET, "--backoff-strategy", "linear")


@pytest.mark.parametrize(
    "missing",
    [
        "--subscription",
        "--max-redelivery-count",
        "--ack-timeout-ms",
        "--base-redelivery-delay-ms",
        "--max-redelivery-delay-ms",
        "--poison-policy",
    ],
)
def test_every_danube_required_flag_is_required(missing):
    argv = list(DANUBE_SET)
    i = argv.index(missing)
    del argv[i : i + 2]
    assert missing in refused(*argv)


def test_topic_without_namespace_is_bad_usage_before_any_call(capsys):
    code = admin.main(["--endpoint", "http://127.0.0.1:1", "topics", "get-failure-policy", "orders", "-s", "s1"])
    assert code == 2
    assert "has no namespace" in capsys.readouterr().err
