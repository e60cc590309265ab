"""``free_port``: ports for the local cluster's children, out of the kernel's way.

A port taken with ``bind(port=0)`` and released comes from the ephemeral range,
where outgoing connections take their source ports too; CI lost a whole plane when
one was taken before kube-controller-manager bound it.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from headroom_dev import process
from headroom_dev.process import ephemeral_ports, free_port


class Picks:
    """An ``rng`` whose ``randrange`` answers the given ports in turn."""

    def __init__(self, *ports: int) -> None:
        self.ports = list(ports)

    def randrange(self, start: int, stop: int) -> int:
        port = self.ports.pop(0)
        assert start <= port < stop
        return port


def test_ports_are_below_the_ephemeral_range_and_never_handed_out_twice() -> None:
    ephemeral = ephemeral_ports()
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= port < ephemeral.start for port in ports)


def test_the_kernels_own_pick_is_in_the_range_outgoing_connections_use() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        assert sock.getsockname()[1] in ephemeral_ports()


def test_a_port_something_listens_on_is_passed_over() -> None:
    below = ephemeral_ports().start
    with socket.socket() as listener:
        occupied = free_port()
        listener.bind(("127.0.0.1", occupied))
        listener.listen()
        process._handed_out.discard(occupied)  # as if another process had bound it
        spare = next(p for p in range(below - 1, 10_000, -1) if p not in process._handed_out)
        assert free_port(Picks(occupied, spare)) == spare  # type: ignore[arg-type]


def test_the_ephemeral_range_is_read_from_the_kernel(tmp_path: Path) -> None:
    setting = tmp_path / "ip_local_port_range"
    setting.write_text("20000\t40000\n")
    assert ephemeral_ports(setting) == range(20000, 40001)
    assert ephemeral_ports(tmp_path / "missing") == range(32768, 61000)


def test_with_no_room_below_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "ephemeral_ports", lambda: range(1024, 65536))
    port = free_port()
    assert 1024 <= port < 65536
