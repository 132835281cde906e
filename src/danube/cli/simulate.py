"""`danube cluster simulate SCENARIO`: replay a rebalancing scenario in virtual time.

Runs :mod:`danube.cluster.simulator` (embedded metadata store, virtual clock,
synthetic brokers, the real leader code), prints the CV over virtual time, the
moves and the safety checks, and writes a PNG chart (matplotlib).  ``--planner
both`` runs the same scenario with the planner and with Danube's greedy step
and draws both.  Exit status 1 when a safety check failed.
"""

from __future__ import annotations

import json
import sys

from danube.cluster.simulator import SCENARIOS, SimulationResult, simulate, write_chart


def register(subparsers) -> None:
    """Adds ``simulate`` to the ``danube cluster`` subcommands."""
    p = subparsers.add_parser(
        "simulate",
        help="replay a rebalancing scenario in virtual time (CV, moves, chart)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("scenario", choices=SCENARIOS, metavar="SCENARIO", help=" | ".join(SCENARIOS))
    p.add_argument("--out", default=None, metavar="PNG", help="chart path [default simulate-SCENARIO.png]")
    p.add_argument("--no-chart", action="store_true", help="do not draw the chart")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument(
        "--planner",
        choices=("plan", "greedy", "both"),
        default="plan",
        help="plan = danube's multi-move planner, greedy = Danube's one lightest topic per cycle",
    )
    p.add_argument(
        "--aggressiveness",
        choices=("conservative", "balanced", "aggressive"),
        default=None,
        help="override the scenario's level",
    )
    p.add_argument("--hours", type=float, default=None, help="virtual hours to run [scenario default]")
    p.add_argument("--seed", type=int, default=7, help="workload seed [default 7]")
    p.set_defaults(func=run)


def _summary(r: SimulationResult) -> dict:
    d = r.to_dict()
    d["timeline"] = [p for i, p in enumerate(d["timeline"]) if i % 10 == 0]  # every 5 virtual minutes
    return d


def run(args) -> int:
    import logging

    if str(getattr(args, "log_level", "INFO")).upper() != "DEBUG":  # one line per move: only with DEBUG
        logging.getLogger("danube.cluster.rebalancing").setLevel(logging.WARNING)
    planners = ["plan", "greedy"] if args.planner == "both" else [args.planner]
    results = [
        simulate(args.scenario, planner=p, aggressiveness=args.aggressiveness, hours=args.hours, seed=args.seed)
        for p in planners
    ]
    chart = None
    if not args.no_chart:
        chart = args.out or f"simulate-{args.scenario}.png"
        write_chart(results, chart)
    if args.json:
        print(json.dumps({"chart": chart, "runs": [_summary(r) for r in results]}))
    else:
        _print_table(results, chart)
    return 1 if any(r.violations or not r.consistent for r in results) else 0


def _fmt(value) -> str:
    return "-" if value is None else (f"{value:.2f}" if isinstance(value, float) else str(value))


def _print_table(results: list[SimulationResult], chart: str | None) -> None:
    first = results[0]
    cfg = first.config
    out = sys.stdout
    out.write(
        f"scenario {first.scenario}: {cfg.aggressiveness} (CV threshold {cfg.cv_threshold:.2f}, check every "
        f"{cfg.check_interval_seconds:g} s, max {cfg.max_moves_per_hour} moves/h, cooldown "
        f"{cfg.cooldown_seconds:g} s), strategy {cfg.strategy}\n"
    )
    for h, label in first.events:
        out.write(f"  event at {h:5.2f} h: {label}\n")
    out.write("\n  time (h)  " + "  ".join(f"CV {r.planner:>6}  moves" for r in results) + "\n")
    step = 60  # report rounds of 30 s: one row per 30 virtual minutes
    for i in range(0, len(first.timeline), step):
        h = first.timeline[i][0]
        cells = []
        for r in results:
            cv = r.timeline[i][1] if i < len(r.timeline) else float("nan")
            done = (
                sum(
                    1
                    for m in r.moves
                    if (m.timestamp - r.moves[0].timestamp) >= 0 and (m.timestamp - _start(r)) / 3600.0 <= h
                )
                if r.moves
                else 0
            )
            cells.append(f"{cv:9.3f}  {done:5d}")
        out.write(f"  {h:8.2f}  " + "  ".join(cells) + "\n")
    out.write("\n")
    for r in results:
        out.write(
            f"  {r.planner}: {len(r.moves)} moves, threshold reached at {_fmt(r.reached_at_h)} h after "
            f"{_fmt(r.moves_to_threshold)} moves, stayed under from {_fmt(r.converged_at_h)} h, final CV "
            f"{r.final_cv:.3f}; safety: {'ok' if not r.violations else '; '.join(r.violations)}; "
            f"store consistent: {r.consistent}\n"
        )
    if chart:
        out.write(f"  chart: {chart}\n")


def _start(r: SimulationResult) -> float:
    from danube.cluster.simulator import EPOCH

    return EPOCH


def main(argv: list[str] | None = None) -> int:  # python -m danube.cli.simulate
    import argparse

    parser = argparse.ArgumentParser(prog="danube cluster")
    register(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
