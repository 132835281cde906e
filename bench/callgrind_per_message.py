"""Instructions per message of one broker, counted by callgrind, so two trees compare on a loaded machine.

Runs a broker under ``valgrind --tool=callgrind`` twice per tree, with ``danube bench`` sending a fixed rate
for a short and a long duration; (long total - short total) / (long messages - short messages) is the cost
of one message with its share of the calls, start-up and shutdown cancelled out.  Wall-clock figures
of a shared machine move with its load; instruction counts do not.

    python bench/callgrind_per_message.py                          # this tree
    python bench/callgrind_per_message.py --before /tmp/old/src    # and an older tree (core built in place)
    python bench/callgrind_per_message.py --topics 100 --batch 2   # many topics, 2 messages per publish call

With ``--topics N`` the bench spreads N producers and N consumers over N topics (``--connections``
client connections); ``--batch B`` sets the rate so that each producer's call carries B messages
(rate = N * B per ``--pace-ms``), the small-batch shape where per-call costs dominate.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from danube.processes import free_port, stop_process, wait_for_port  # noqa: E402

THIS_SRC = os.path.abspath(os.path.join(HERE, "..", "src"))


def run_once(src: str, duration: float, rate: int, pace_ms: int, sync: str, shape: list[str]) -> tuple[int, int]:
    """(instructions the broker ran, messages delivered) for one run."""
    port = free_port()
    work = tempfile.mkdtemp(prefix="danube-cg-")
    out = os.path.join(work, "callgrind.out")
    env = {**os.environ, "PYTHONPATH": src}
    # The real interpreter, not a pyenv shim: valgrind follows no exec without --trace-children.
    cmd = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        "--dump-instr=no",
        sys.executable,
        "-m",
        "danube.cli.main",
        "broker",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--admin-port",
        "0",
        "--metrics-port",
        "0",
        "--data-dir",
        os.path.join(work, "data"),
        "--sync",
        sync,
        "--load-report-interval",
        "0",
    ]
    with open(os.path.join(work, "broker.log"), "wb") as log:
        broker = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(port, broker, timeout=300)
        bench = subprocess.run(
            [
                sys.executable,
                "-m",
                "danube.cli.main",
                "bench",
                "--service-url",
                f"http://127.0.0.1:{port}",
                "--duration",
                str(duration),
                "--rate",
                str(rate),
                "--pace-ms",
                str(pace_ms),
                "--batch-size",
                "1000",
                "--topic",
                "/default/callgrind",
                *shape,
                "--no-progress",
                "--json",
            ],
            env={**os.environ, "PYTHONPATH": THIS_SRC},
            capture_output=True,
            text=True,
            timeout=duration + 600,
        )
        if bench.returncode != 0:
            raise SystemExit(f"danube bench failed ({bench.returncode}): {bench.stderr[-2000:]}")
        delivered = int(json.loads(bench.stdout)["delivered"])
    finally:
        stop_process(broker, timeout=300)  # SIGTERM: callgrind writes its totals as the broker exits
    with open(out) as f:
        totals = re.search(r"^summary:\s+(\d+)", f.read(), re.M)
    shutil.rmtree(work, ignore_errors=True)
    if not totals:
        raise SystemExit("callgrind wrote no summary (did the broker exit cleanly?)")
    return int(totals.group(1)), delivered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="an older tree's src directory (its core built in place)")
    parser.add_argument("--this", default=THIS_SRC, help="the src directory measured as 'this' (default this tree's)")
    parser.add_argument("--rate", type=int, default=2000, help="messages per second (default 2000)")
    parser.add_argument("--pace-ms", type=int, default=100, help="one send_batch call per interval (default 100)")
    parser.add_argument("--short", type=float, default=4.0, help="short run, seconds (default 4)")
    parser.add_argument("--long", type=float, default=12.0, help="long run, seconds (default 12)")
    parser.add_argument("--sync", default="interval", choices=["always", "interval", "never"])
    parser.add_argument("--topics", type=int, default=1, help="topics, each with a producer and a consumer (default 1)")
    parser.add_argument("--connections", type=int, default=8, help="client connections with --topics > 1 (default 8)")
    parser.add_argument("--batch", type=int, help="messages per publish call: sets --rate to topics * batch per pace")
    args = parser.parse_args()
    if args.batch:
        args.rate = args.topics * args.batch * 1000 // args.pace_ms
    shape: list[str] = []
    if args.topics > 1:
        n = str(args.topics)
        shape = ["--topics", n, "--producers", n, "--consumers", n, "--connections", str(args.connections)]
    print(f"{args.topics} topic(s), {args.rate} msgs/s, one call per {args.pace_ms} ms per producer", flush=True)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    trees = [("this", os.path.abspath(args.this))] + ([("before", os.path.abspath(args.before))] if args.before else [])
    for label, src in trees:
        short_ir, short_msgs = run_once(src, args.short, args.rate, args.pace_ms, args.sync, shape)
        long_ir, long_msgs = run_once(src, args.long, args.rate, args.pace_ms, args.sync, shape)
        per_msg = (long_ir - short_ir) / max(1, long_msgs - short_msgs)
        print(
            f"{label}: {short_ir:,} instructions ({short_msgs:,} msgs), {long_ir:,} ({long_msgs:,} msgs): "
            f"{per_msg:,.0f} instructions per message",
            flush=True,
        )


if __name__ == "__main__":
    main()
