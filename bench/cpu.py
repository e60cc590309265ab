"""CPU time of the processes that share the machine's cores, over one stretch of a bench.

Beside a throughput, it says who was the bound: the operator, or the API server
and etcd it drives (on 2 shared cores, both cannot be busy at once).
"""

from __future__ import annotations

import time

import psutil


class Cpu:
    """CPU time of the processes that share the 2 cores, over one phase."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.processes = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.start = time.monotonic()
        self.before = {name: self._seconds(p) for name, p in self.processes.items()}
        self.machine = self._busy()

    @staticmethod
    def _busy() -> float:
        times = psutil.cpu_times()
        return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))

    @staticmethod
    def _seconds(process: psutil.Process) -> float:
        times = process.cpu_times()
        return float(times.user + times.system)

    def percent(self) -> dict[str, float]:
        """% of one core each used since this was made; ``machine``: every process on
        the machine (up to 100 x cores), ``others``: the machine less ours (another
        engineer's tests, say: then the phase was measured on a busier machine)."""
        wall = time.monotonic() - self.start
        used = {name: self._seconds(p) - self.before[name] for name, p in self.processes.items()}
        machine = self._busy() - self.machine
        shares = {name: round(seconds / wall * 100, 1) for name, seconds in used.items()}
        shares["machine"] = round(machine / wall * 100, 1)
        shares["others"] = round(max(0.0, machine - sum(used.values())) / wall * 100, 1)
        return shares

    def seconds(self) -> dict[str, float]:
        """CPU seconds each used since this was made (``machine``: every process)."""
        used = {name: self._seconds(p) - self.before[name] for name, p in self.processes.items()}
        used["machine"] = self._busy() - self.machine
        return used
