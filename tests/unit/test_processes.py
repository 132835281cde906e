"""Readiness and port helpers every child server relies on (the embedded etcd, demo, bench --spawn-broker, tests)."""

from __future__ import annotations

import socket

from danube import processes


def test_free_ports_are_distinct(monkeypatch):
    handed_out = iter([5001, 5001, 5002, 5001, 5003])  # the OS may hand out one port twice in a row
    monkeypatch.setattr(processes, "free_port", lambda: next(handed_out))
    assert processes.free_ports(3) == [5001, 5002, 5003]


def test_free_ports_lie_outside_the_ephemeral_range_and_are_never_handed_out_twice():
    # An outgoing connection takes its local port from the ephemeral range; a server port chosen there
    # can be taken by a client socket before the server binds it (CI saw "Address already in use").
    low, high = processes._ephemeral_range()
    ports = [processes.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(not (low <= port <= high) for port in ports)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free


def test_a_port_in_use_is_not_handed_out(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        # the busy port twice, then random ones (a neighbour of an ephemeral port may be in use too)
        first_choices = iter([busy, busy])
        real_randint = processes.random.randint
        drawn: list[int] = []

        def randint(a: int, b: int) -> int:
            drawn.append(next(first_choices, None) or real_randint(a, b))
            return drawn[-1]

        monkeypatch.setattr(processes, "_candidate_range", lambda: (1024, 65535))
        monkeypatch.setattr(processes.random, "randint", randint)
        monkeypatch.setattr(processes, "_handed_out", set())
        port = processes.free_port()
        assert drawn[:2] == [busy, busy] and port != busy


def test_without_a_range_outside_the_ephemeral_one_the_os_chooses(monkeypatch):
    monkeypatch.setattr(processes, "_candidate_range", lambda: (0, 0))
    port = processes.free_port()
    assert 0 < port <= 65535


def test_a_listening_server_accepts_and_a_closed_port_does_not():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert processes.accepts_connections("127.0.0.1", port)
    assert not processes.accepts_connections("127.0.0.1", port)


def test_a_socket_connected_to_itself_is_not_a_server(monkeypatch):
    # TCP simultaneous open: a socket bound to a free port and connected to that same port
    # connects to itself, which is what a readiness probe can hit while the server starts.
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.connect(("127.0.0.1", port))
    assert probe.getsockname() == probe.getpeername()
    monkeypatch.setattr(processes.socket, "create_connection", lambda address, timeout=None: probe)
    assert not processes.accepts_connections("127.0.0.1", port)
    assert probe.fileno() == -1  # closed by the probe


def test_cpu_seconds_of_a_process_and_of_none():
    import os
    import subprocess
    import sys

    spent = processes.cpu_seconds(os.getpid())
    sum(i * i for i in range(2_000_000))  # some CPU of our own
    assert processes.cpu_seconds(os.getpid()) > spent
    assert processes.cpu_seconds(None) == 0.0
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert processes.cpu_seconds(gone.pid) == 0.0  # reaped: no /proc entry left
