"""Automated rebalancing (leader-only): configuration, balance, candidates, planner, history, loop, metrics.

See docs/rebalancing.md.  The cluster's leader wiring builds one :class:`Rebalancer`
per broker with ``is_leader`` / ``guard`` from its leader election and calls
``start()``; everything here is also driven by the deterministic simulator
(:mod:`danube.cluster.simulator`).
"""

from .balance import ClusterBalance, ClusterState, build_state, compute_balance
from .config import PRESETS, RebalancingConfig
from .history import MoveRecord, RebalancingHistory
from .loop import (
    Clock,
    ClusterSource,
    CycleResult,
    LoadReportSource,
    MetadataMoveExecutor,
    MoveExecutor,
    Rebalancer,
    StoreLoadReports,
    SystemClock,
    ViewLoadReports,
)
from .metrics import RebalancingMetrics
from .planner import PlannedMove, greedy_move, greedy_plan, plan_moves

__all__ = [
    "ClusterBalance",
    "ClusterState",
    "build_state",
    "compute_balance",
    "PRESETS",
    "RebalancingConfig",
    "MoveRecord",
    "RebalancingHistory",
    "Clock",
    "ClusterSource",
    "CycleResult",
    "ViewLoadReports",
    "LoadReportSource",
    "MetadataMoveExecutor",
    "MoveExecutor",
    "Rebalancer",
    "StoreLoadReports",
    "SystemClock",
    "RebalancingMetrics",
    "PlannedMove",
    "greedy_plan",
    "plan_moves",
    "greedy_move",
]
