"""The simulator's chart: the CV over virtual time with the moves and events, and each broker's load.

Draws :class:`~danube.cluster.simulator.SimulationResult` s with matplotlib (imported only when a
chart is written, so running a scenario does not need it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from danube.cluster.simulator_cluster import EPOCH

if TYPE_CHECKING:
    from danube.cluster.simulator import SimulationResult


def write_chart(results: list[SimulationResult], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = results[0]
    fig, axes = plt.subplots(2, 1, figsize=(11, 8), sharex=True)
    ax = axes[0]
    for r in results:
        ax.plot(
            [h for h, _ in r.timeline], [cv for _, cv in r.timeline], label=f"CV ({r.planner}: {len(r.moves)} moves)"
        )
        ax.plot(
            [(m.timestamp - EPOCH) / 3600.0 for m in r.moves],
            [_cv_at(r.timeline, (m.timestamp - EPOCH) / 3600.0) for m in r.moves],
            "|",
            markersize=8,
        )
    ax.axhline(first.threshold, color="red", linestyle="--", label=f"threshold {first.threshold:.2f}")
    for h, label in first.events:
        ax.axvline(h, color="grey", linestyle=":", linewidth=0.8)
        ax.annotate(
            label, (h, ax.get_ylim()[1] if ax.get_ylim()[1] else 1.0), fontsize="x-small", rotation=90, va="top"
        )
    ax.set_ylabel("CV (std / mean)")
    ax.set_title(
        f"danube cluster simulate {first.scenario} ({first.config.aggressiveness}, "
        f"max {first.config.max_moves_per_hour} moves/h)"
    )
    ax.legend(loc="upper right", fontsize="small")
    ax.grid(alpha=0.3)
    for broker, points in sorted(first.loads.items()):
        axes[1].plot([h for h, _ in points], [v for _, v in points], label=broker)
    axes[1].set_ylabel(f"broker load ({first.config.strategy}, {first.planner})")
    axes[1].set_xlabel("virtual time (hours)")
    axes[1].legend(loc="upper right", fontsize="small")
    axes[1].grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _cv_at(timeline: list[tuple[float, float]], h: float) -> float:
    best = 0.0
    for t, cv in timeline:
        if t > h:
            break
        best = cv
    return best
