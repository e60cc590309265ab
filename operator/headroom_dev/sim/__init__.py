"""Deterministic simulation: a virtual-time event loop and an in-memory API server.

The control code runs unchanged against :mod:`headroom_dev.sim.fakeapi` on
:mod:`headroom_dev.sim.loop`, so that seeded schedules of creates, deletes,
crashes, pauses and API faults replay exactly, thousands per minute.
"""
