"""The broker process's garbage-collector settings (danube._gctune)."""

import gc

from danube import _gctune


def test_tune_raises_the_thresholds_unless_opted_out(monkeypatch):
    old = gc.get_threshold()
    try:
        monkeypatch.setenv(_gctune.OPT_OUT_ENV, "0")
        _gctune.tune()
        assert gc.get_threshold() == old
        monkeypatch.delenv(_gctune.OPT_OUT_ENV)
        _gctune.tune()
        assert gc.get_threshold() == _gctune.GC_THRESHOLD
    finally:
        gc.set_threshold(*old)


def test_freeze_keeps_what_exists_out_of_later_collections(monkeypatch):
    monkeypatch.delenv(_gctune.OPT_OUT_ENV, raising=False)
    try:
        _gctune.freeze()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    monkeypatch.setenv(_gctune.OPT_OUT_ENV, "0")
    _gctune.freeze()
    assert gc.get_freeze_count() == 0
