"""The server-wide request budget: what it grants as window, and who it wakes when it has room."""

from __future__ import annotations

from danube.server.h2grpc.budget import RequestBudget


class Waiting:
    """A connection as the budget sees it: owed window, or calls holding window back."""

    def __init__(self, still_starved: bool = False) -> None:
        self.granted = 0
        self.fed = 0
        self.still_starved = still_starved

    def grant_window(self) -> None:
        self.granted += 1

    def feed_starved(self) -> bool:
        self.fed += 1
        return self.still_starved


def test_room_is_the_limit_less_what_is_held_and_what_windows_already_let_in():
    budget = RequestBudget(1000)
    budget.held = 300
    budget.windows = 200
    assert budget.room() == 500
    assert not budget.over
    budget.held = 1001
    assert budget.over


def test_feeding_windows_wakes_each_connection_owed_window_once():
    budget = RequestBudget(1000)
    a, b = Waiting(), Waiting()
    budget.owed_window(a)
    budget.owed_window(b)
    budget.owed_window(a)
    budget.feed_windows()
    assert (a.granted, b.granted) == (1, 1)
    assert not budget.window_starved
    budget.feed_windows()
    assert (a.granted, b.granted) == (1, 1)


def test_a_connection_still_over_its_own_budget_stays_starved_after_a_feed():
    budget = RequestBudget(1000)
    fed, still = Waiting(), Waiting(still_starved=True)
    budget.starving(fed)
    budget.starving(still)
    budget.feed_starved()
    assert fed.fed == still.fed == 1
    assert budget.starved == {still}


def test_a_closed_connection_waits_for_nothing():
    budget = RequestBudget(1000)
    gone = Waiting()
    budget.starving(gone)
    budget.owed_window(gone)
    budget.forget(gone)
    budget.feed_windows()
    budget.feed_starved()
    assert gone.granted == gone.fed == 0
