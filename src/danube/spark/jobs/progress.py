"""One line per finished Spark stage, instead of Spark's console progress bar."""

from __future__ import annotations

import sys
import threading
import time


class StageProgress:
    """One line per finished Spark stage (``<job>: <step> - stage N: T tasks, S s``) on ``out``.

    Polls the status tracker from a thread; stages Spark skipped (their input was cached or
    reused) are not printed.  ``step(label)`` names what the following stages do.
    """

    def __init__(self, spark, job: str, out=None, interval_s: float = 0.2) -> None:
        self.sc = spark.sparkContext
        self.job = job
        self.out = out if out is not None else sys.stderr
        self.interval_s = interval_s
        self.label = "read"
        self.lines: list[str] = []
        self._labels: dict[int, str] = {}
        self._done: set[int] = set()
        self._seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._known_jobs: set[int] = set(self.sc.statusTracker().getJobIdsForGroup())

    def step(self, label: str) -> None:
        self._poll_quietly()
        self.label = label

    def __enter__(self) -> "StageProgress":
        self._thread = threading.Thread(target=self._run, name="danube-spark-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._poll_quietly()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._poll_quietly()

    def _poll_quietly(self) -> None:
        try:
            with self._lock:
                self._poll()
        except Exception:  # noqa: BLE001 - progress lines must never break the job
            pass

    def _poll(self) -> None:
        tracker = self.sc.statusTracker()
        active = set(tracker.getActiveStageIds())
        for job_id in sorted(set(tracker.getJobIdsForGroup()) - self._known_jobs):
            info = tracker.getJobInfo(job_id)
            for stage_id in sorted(info.stageIds if info is not None else ()):
                if stage_id in self._done:
                    continue
                if stage_id not in self._labels:
                    self._labels[stage_id] = self.label
                    self._seen[stage_id] = time.monotonic()
                stage = tracker.getStageInfo(stage_id)
                if stage is None or stage_id in active or stage.numTasks == 0:
                    continue
                if stage.numCompletedTasks + stage.numFailedTasks < stage.numTasks:
                    continue  # not started yet, or skipped (its output was reused)
                self._done.add(stage_id)
                took = time.monotonic() - self._seen[stage_id]  # (to within one poll)
                line = (
                    f"{self.job}: {self._labels[stage_id]} - stage {stage_id}: {stage.numCompletedTasks} "
                    f"task{'s' if stage.numCompletedTasks != 1 else ''}, {took:.1f} s"
                )
                self.lines.append(line)
                print(line, file=self.out, flush=True)
            if info is not None and str(info.status) in ("SUCCEEDED", "FAILED"):
                self._known_jobs.add(job_id)  # its stages are printed or were skipped
