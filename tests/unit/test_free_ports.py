"""Listening ports for children are drawn where no outgoing connection can take them."""

from __future__ import annotations

import socket

from epp import procs
from epp.procs import _ephemeral_range, free_port, free_port_range


def test_free_ports_avoid_the_kernels_ephemeral_range_and_never_repeat():
    lo, hi = _ephemeral_range()
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert not any(lo <= p <= hi for p in ports)


def test_a_range_is_free_end_to_end_and_disjoint_from_earlier_ports():
    single = free_port()
    base = free_port_range(4)
    span = range(base, base + 4)
    assert single not in span
    for port in span:  # every port of the range binds now
        with socket.socket() as s:
            s.bind(("0.0.0.0", port))


def test_only_recent_ports_are_remembered_so_a_long_run_never_runs_out(monkeypatch):
    monkeypatch.setattr(procs, "_RECENT_PORTS", 50)
    first = free_port()
    for _ in range(60):
        free_port()
    assert len(procs._HANDED_OUT) == 50 and first not in procs._HANDED_OUT
