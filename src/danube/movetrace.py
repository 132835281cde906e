"""Per-step timestamps of topic moves, for finding where a move's time goes.

Off unless the broker's environment sets ``DANUBE_TRACE_MOVES=1``: then every step logs one line
``move <topic> <step> <wall-clock seconds>`` on the ``danube.moves`` logger at WARNING, so it shows
whatever the broker's log level (``bench/faults.py --trace`` reads the brokers' logs and lines the
steps of each move up).  Wall-clock time because the steps happen in several processes on one host.
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger("danube.moves")
ENABLED = os.environ.get("DANUBE_TRACE_MOVES", "") not in ("", "0")


def step(topic: str, what: str) -> None:
    if ENABLED:
        log.warning("move %s %s %.6f", topic, what, time.time())
