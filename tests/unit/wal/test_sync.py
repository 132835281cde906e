"""danube/wal/sync.py: the interval budget, on simulated time (the thread is tested in
test_rotation_steps.py on real time)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube.wal.sync import IntervalBudget

INTERVAL = 5.0


def simulate(requests: list[float], durations: list[float]) -> tuple[list[float], list[float]]:
    """One sync thread under the budget: a sync starts once something waits, the thread is free
    and the budget allows it, and covers every request that came before it starts (group
    commit).  Returns the sync starts and each request's wait until its covering sync starts."""
    budget = IntervalBudget(INTERVAL, 0.0)
    starts: list[float] = []
    waits: list[float] = []
    free_at, i = 0.0, 0
    while i < len(requests):
        start = max(free_at, requests[i], budget.earliest_start())
        budget.started(start)
        starts.append(start)
        while i < len(requests) and requests[i] <= start:
            waits.append(start - requests[i])
            i += 1
        free_at = start + durations[len(starts) % len(durations)]
    return starts, waits


request_times = st.lists(st.floats(0, 200, allow_nan=False), min_size=1, max_size=60).map(sorted)
sync_durations = st.lists(st.floats(0.01, 12, allow_nan=False), min_size=1, max_size=10)


@settings(max_examples=300, deadline=None)
@given(request_times, sync_durations)
def test_no_stretch_holds_more_than_two_syncs_beyond_its_whole_intervals(requests, durations):
    starts, _ = simulate(requests, durations)
    for i in range(len(starts)):
        for j in range(i + 1, len(starts)):
            assert j - i + 1 <= (starts[j] - starts[i]) / INTERVAL + 2 + 1e-9, (i, j, starts)


@settings(max_examples=300, deadline=None)
@given(request_times, sync_durations)
def test_a_waiter_waits_at_most_one_interval_or_the_sync_in_flight(requests, durations):
    _, waits = simulate(requests, durations)
    assert len(waits) == len(requests)
    assert max(waits) <= max(INTERVAL, max(durations)) + 1e-9


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(-INTERVAL / 2 + 0.01, INTERVAL / 2 - 0.01, allow_nan=False), min_size=2, max_size=60))
def test_a_writer_jittering_around_one_request_per_interval_never_waits(jitters):
    # the case a strict start-to-start gap got wrong: a request a little early waited out
    # the rest of the interval, and so did every one after it
    requests = [INTERVAL * (k + 1) + j for k, j in enumerate(jitters)]
    _, waits = simulate(requests, [0.0])  # instant syncs: any wait is the budget's
    assert waits == [0.0] * len(requests)


def test_an_idle_stretch_does_not_bank_syncs():
    budget = IntervalBudget(INTERVAL, 0.0)
    budget.started(1000.0)  # the first sync after a long idle stretch
    assert budget.earliest_start() == 1000.0  # one more at once ...
    budget.started(1000.0)
    assert budget.earliest_start() == 1000.0 + INTERVAL  # ... then back on the schedule


def test_a_failing_after_sync_chore_is_logged_once_and_never_fails_a_sync(caplog):
    import asyncio
    import logging

    from danube.wal.options import SyncPolicy
    from danube.wal.sync import Syncer

    appended = [0]
    synced = []
    calls = []

    def chore():
        calls.append(1)
        raise RuntimeError("chore bug")

    syncer = Syncer(SyncPolicy.ALWAYS, 5, lambda: appended[0], lambda: synced.append(appended[0]), after_sync=chore)
    try:
        with caplog.at_level(logging.ERROR, logger="danube.wal"):
            for n in (1, 2, 3):
                appended[0] = n
                assert syncer.sync_now() == n

            async def wait() -> None:
                appended[0] = 4
                await asyncio.wait_for(syncer.wait_durable(4), 5)

            asyncio.run(wait())  # the sync thread's syncs go on after the chore failed
        assert synced == [1, 2, 3, 4] and syncer.durable_offset == 4
        assert calls == [1]
        assert [r for r in caplog.records if "after-sync chore failed" in r.getMessage()] == caplog.records[:1]
        assert len(caplog.records) == 1
    finally:
        syncer.close()


def test_every_sync_of_a_log_is_timed_in_its_flush_latency(tmp_path):
    from danube.wal import Wal
    from danube.wal.sync import SyncGroup

    with Wal.open(tmp_path / "log", sync="always", sync_group=SyncGroup(syncfs_min_logs=0)) as wal:
        for i in range(3):
            wal.append(b"r%d" % i)
        assert wal.sync_count == 3 and wal.flush_latency.count == 3
        assert wal.flush_latency.sum_ms > 0
        assert wal.flush_latency.cumulative()[-1] == (float("inf"), 3)


@pytest.mark.parametrize("sync", ["always", "interval"])
async def test_a_synced_log_rearms_its_tail_and_every_append_survives_reopen(tmp_path, sync):
    """After each sync the syncing thread faults the active file's tail back in writable
    (SegmentFile.rearm); appends into that page, through the group's rounds, read back the same
    after a reopen."""
    from danube import message_codec
    from danube.wal import Wal

    batches = [message_codec.encode_payloads([b"%d-%d" % (i, j) for j in range(2)]) for i in range(60)]
    import threading

    wal = Wal.open(tmp_path / "w", sync=sync)
    chore, threads = wal._syncer._after_sync, set()

    def spy(*rearms):
        threads.add(threading.get_ident())
        chore(*rearms)

    wal._syncer._after_sync = spy
    try:
        for batch in batches:
            _first, last = wal.append_frames(bytearray(batch))
            await wal.wait_durable(last)
    finally:
        wal.close()
    # the rearm ran after the group's rounds, on its thread, never on the appending loop's
    assert threads and threading.get_ident() not in threads
    with Wal.open(tmp_path / "w", sync=sync) as again:
        assert [bytes(r.payload) for r in again.read(0)] == [b"%d-%d" % (i, j) for i in range(60) for j in range(2)]


def test_the_after_sync_chore_skips_a_suspended_or_closing_log(tmp_path):
    from danube.wal import Wal

    wal = Wal.open(tmp_path / "w", sync="always")
    try:
        wal.append(b"a")
        assert wal.suspend()
        wal._after_sync()  # no active segment while suspended: nothing to rearm, no error
        assert wal.append(b"b") == 1
        wal.sync()
    finally:
        wal.close()
    wal._after_sync()  # closed
    with Wal.open(tmp_path / "w", sync="always") as again:
        assert [bytes(r.payload) for r in again.read(0)] == [b"a", b"b"]


async def test_a_round_rearms_the_tail_pages_of_all_its_logs_in_one_call(tmp_path, monkeypatch):
    """The group collects each synced log's active file and rearms them together (the compiled
    call releases the GIL once for all), on its own thread, and every record survives reopen."""
    import asyncio
    import threading

    from danube import message_codec
    from danube.wal import Wal, sync_group

    real = sync_group._walfile
    calls: list[tuple[int, int]] = []  # (files, thread)

    class Spy:
        @staticmethod
        def rearm_many(files, ahead):
            calls.append((len(files), threading.get_ident()))
            return real.rearm_many(files, ahead)

    monkeypatch.setattr(sync_group, "_walfile", Spy)
    group = sync_group.SyncGroup()
    wals = [Wal.open(tmp_path / f"w{i}", sync="always", sync_group=group) for i in range(6)]
    try:
        for round_no in range(5):
            lasts = [wal.append_frames(bytearray(message_codec.encode_payloads([b"%d" % round_no])))[1] for wal in wals]
            await asyncio.gather(*(wal.wait_durable(last) for wal, last in zip(wals, lasts, strict=True)))
    finally:
        for wal in wals:
            wal.close()
    assert calls and max(n for n, _ in calls) >= 2  # several logs' files in one call
    assert threading.get_ident() not in {t for _, t in calls}
    for i in range(6):
        with Wal.open(tmp_path / f"w{i}", sync="always") as again:
            assert [bytes(r.payload) for r in again.read(0)] == [b"%d" % n for n in range(5)]
