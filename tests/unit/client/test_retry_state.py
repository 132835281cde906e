"""A retry budget: ``reset()`` (called on every ack) restores the whole budget after a retry and
costs nothing while no retry was taken since the last one."""

from __future__ import annotations

from danube.client.connection import RetryPolicy, RetryState


async def test_a_reset_after_retries_gives_the_whole_budget_back():
    state = RetryState(RetryPolicy(initial_backoff_s=0.1, max_backoff_s=10.0, max_attempts=3))
    first = [state.next_delay() for _ in range(3)]
    assert all(d is not None for d in first) and state.next_delay() is None  # spent
    assert first[2] > first[0]  # backing off
    state.reset()
    again = [state.next_delay() for _ in range(3)]
    assert state.attempts == 3 and all(d is not None for d in again)
    assert again[0] <= 0.1  # the backoff starts over
    assert state.next_delay() is None


async def test_a_reset_without_a_retry_since_keeps_the_budget_as_it_is():
    state = RetryState(RetryPolicy(initial_backoff_s=0.1, max_attempts=2))
    delays = state._delays
    state.reset()
    state.reset()
    assert state._delays is delays  # nothing rebuilt on the ack path
    assert state.attempts == 0 and state.describe().startswith("0 attempt(s)")
    assert state.next_delay() is not None
    state.reset()  # a retry was taken: this one restores the budget
    assert state.attempts == 0 and state._delays is not delays
