"""A step hook for scalable topics (``scalable_topics.step_hook``) that kills a broker process mid-split.

A broker started with ``step_hook: "tests.support.scalable_crash:exit_at_step"`` and the environment
variable ``DANUBE_TEST_SCALABLE_CRASH=STEP:FLAGFILE`` exits at once (``os._exit``, as if killed) when
it is the first process of the cluster to reach split/merge step STEP
(``danube.routing.scalable.contracts.STEPS``): the first to create FLAGFILE.  The next leader, which
finds the file there, goes on and completes the operation.
"""

from __future__ import annotations

import logging
import os

ENV = "DANUBE_TEST_SCALABLE_CRASH"
HOOK = "tests.support.scalable_crash:exit_at_step"

log = logging.getLogger(__name__)


def broker_config(step: str, flag_file: str) -> tuple[dict, dict[str, str]]:
    """The broker config section and the environment that make a cluster's first broker to reach
    ``step`` exit there (the environment also puts this repository on the brokers' import path)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {"scalable_topics": {"step_hook": HOOK}}, {ENV: f"{step}:{flag_file}", "PYTHONPATH": path}


async def exit_at_step(name: str) -> None:
    step, _, flag = os.environ.get(ENV, "").partition(":")
    if name != step or not flag:
        return
    try:
        os.close(os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return  # someone crashed here already: this is the leader that completes the operation
    log.error("%s: exiting at split/merge step %s", ENV, step)
    os._exit(137)
