"""Property tests: the ledger's invariants hold after every step of any history.

A hypothesis state machine drives nodes (add, resize, remove), reservations
(reserve, release, heartbeat), time and reclaim, and after every step checks:
no node is ever pushed over its limit by an admission; the running aggregates
equal a recount; a ledger rebuilt from the admitted entries is identical; and
restored + reserved − released − reclaimed = active. A restart (the operator's
rebuild) may come at any step: what it restores is not counted as reserved, so the
reserved counter of the new ledger counts exactly what it admitted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from fractions import Fraction

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from headroom.api.limits import Limits
from headroom.api.reasons import Reason
from headroom.ledger import Entry, Ledger, Owner
from headroom.ledger.outlook import outlook
from tests.unit.outlook_checks import assert_outlook_says

NODES = ("a", "b", "c")
T0 = datetime(2026, 12, 2, tzinfo=UTC)
RATIOS = st.sampled_from([Fraction(0), Fraction(1), Fraction(3, 2), Fraction(11, 10)])


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.limits = Limits(heartbeat_stale_window=timedelta(seconds=60), max_entries_per_node=8)
        self.ledger = Ledger(self.limits)
        self.now = T0
        self.capacity: dict[str, tuple[int, int | None, Limits]] = {}
        self.shrunk: set[str] = set()  # nodes whose limit was lowered below what they hold
        self.postponed: dict[str, datetime] = {}  # due entries the operator could not check
        self.ids = 0
        self.admitted_mb = 0  # admitted by this ledger (since the last restart)

    # -- nodes -------------------------------------------------------------------------

    @rule(
        node=st.sampled_from(NODES),
        total=st.integers(0, 20_000),
        vram=st.none() | st.integers(0, 8_000),
        ratio=RATIOS,
        reserve=st.integers(0, 2048),
        window=st.integers(1, 120),
    )
    def set_capacity(
        self, node: str, total: int, vram: int | None, ratio: Fraction, reserve: int, window: int
    ) -> None:
        limits = Limits(ratio, reserve, timedelta(seconds=window), 8)
        self.ledger.set_node_capacity(node, total, vram, limits)
        self.capacity[node] = (total, vram, limits)
        if self._over(node):
            self.shrunk.add(node)

    @rule(node=st.sampled_from(NODES))
    def remove_node(self, node: str) -> None:
        self.ledger.remove_node(node)
        self.capacity.pop(node, None)

    # -- reservations ------------------------------------------------------------------

    @rule(
        node=st.sampled_from((*NODES, "ghost")),
        ram=st.integers(0, 6_000),
        vram=st.integers(0, 3_000),
        expires=st.none() | st.integers(-5, 300),
    )
    def reserve(self, node: str, ram: int, vram: int, expires: int | None) -> None:
        self.ids += 1
        entry = Entry(
            id=f"r{self.ids}",
            node=node,
            ram_mb=ram,
            vram_mb=vram,
            created_at=self.now,
            last_heartbeat=self.now,
            expires_at=None if expires is None else self.now + timedelta(seconds=expires),
            owner=Owner(),
        )
        before, was_over = self._reserved(node), self._over(node)
        decision = self.ledger.reserve(entry, self.now)
        if decision.admitted:
            self.admitted_mb += ram
            assert node in self.capacity
            # A claim of no RAM (VRAM only) may go on a node already over its RAM limit
            # (it shrank): it is refused only for what it asks, and adds no RAM.
            pushed = self._over(node) and not (ram == 0 and was_over)
            assert not pushed, f"admission pushed {node} over its limit"
            assert self._reserved(node) == before + ram
        else:
            assert self._reserved(node) == before

    @rule(node=st.sampled_from(NODES), delta=st.integers(-1, 1))
    def reserve_the_last_headroom(self, node: str, delta: int) -> None:
        """Boundaries are where arithmetic breaks: ask for exactly what is left, ±1."""
        summary = self.ledger.node_summary(node, self.now)
        if summary.limit_ram_mb is None:
            return
        ram = summary.limit_ram_mb - summary.reserved_ram_mb + delta
        if ram > 0:
            self.reserve(node, ram, 0, None)

    @precondition(lambda self: len(self.ledger) > 0)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        entry = data.draw(st.sampled_from(sorted(self.ledger.entries(), key=lambda e: e.id)))
        self.ledger.release(entry.id)
        self.postponed.pop(entry.id, None)
        self._settle(entry.node)

    @precondition(lambda self: len(self.ledger) > 0)
    @rule(data=st.data(), back=st.integers(-30, 0))
    def heartbeat(self, data: st.DataObject, back: int) -> None:
        entry = data.draw(st.sampled_from(sorted(self.ledger.entries(), key=lambda e: e.id)))
        before = entry.last_heartbeat
        self.ledger.heartbeat(entry.id, self.now + timedelta(seconds=back))
        assert entry.last_heartbeat >= before

    @rule(seconds=st.integers(0, 90))
    def advance(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    @rule()
    def reclaim(self) -> None:
        reclaimed = self.ledger.reclaim(self.now)
        for item in reclaimed:
            self.postponed.pop(item.entry.id, None)
            window = self.ledger.limits_for(item.entry.node).heartbeat_stale_window
            assert item.entry.is_expired(self.now) or item.entry.is_stale(self.now, window)
            self._settle(item.entry.node)
        for entry in self.ledger.entries():  # nothing due is left behind, unless postponed
            if self.postponed.get(entry.id, self.now) > self.now:
                continue
            window = self.ledger.limits_for(entry.node).heartbeat_stale_window
            assert not entry.is_expired(self.now)
            assert not entry.is_stale(self.now, window)

    @rule(data=st.data(), later=st.integers(1, 30))
    def confirm_what_is_due(self, data: st.DataObject, later: int) -> None:
        """The operator's two steps: due entries are still held until it decides each."""
        held = len(self.ledger)
        due = self.ledger.due(self.now)
        assert len(self.ledger) == held
        assert len({item.entry.id for item in due}) == len(due), "an entry reported twice"
        for item in due:
            entry = item.entry
            window = self.ledger.limits_for(entry.node).heartbeat_stale_window
            assert entry.is_expired(self.now) or entry.is_stale(self.now, window)
            # Expiry is exact: the operator never spares an expired entry as "alive".
            choices = ["reclaim", "postpone"] + ([] if item.reason == Reason.EXPIRED else ["alive"])
            choice = data.draw(st.sampled_from(choices))
            self.postponed.pop(entry.id, None)
            if choice == "reclaim":
                self.ledger.reclaim_entry(entry.id)
                self._settle(entry.node)
            elif choice == "alive":
                self.ledger.heartbeat(entry.id, self.now)
            else:
                until = self.now + timedelta(seconds=later)
                self.ledger.postpone(entry.id, until)
                self.postponed[entry.id] = until

    # -- waiting for room (spec.wait) ----------------------------------------------------

    @rule(
        node=st.sampled_from((*NODES, "ghost")),
        ram=st.integers(1, 6_000),
        wait=st.integers(1, 120),
        strict=st.booleans(),
        again=st.booleans(),
    )
    def reserve_or_wait(self, node: str, ram: int, wait: int, strict: bool, again: bool) -> None:
        self.ids += 1
        name = f"r{self.ids}"
        if again and len(self.ledger.waiting):  # a waiter's new incarnation replaces it
            name = self.ledger.waiting.on(self.ledger.waiting.nodes()[0])[-1].entry_id
        entry = Entry(name, node, ram, self.now, self.now)
        before = self._reserved(node)
        until = self.now + timedelta(seconds=wait)
        foreseen = outlook(self.ledger, entry, self.now, until, strict=strict)
        decision = self.ledger.reserve_or_wait(entry, self.now, until, strict=strict)
        assert_outlook_says(foreseen, decision)
        if decision.queued:
            assert entry.id in self.ledger.waiting
            assert self.ledger.get(entry.id) is None, "a waiting reservation holds nothing"
            assert self._reserved(node) == before
            assert decision.position == self.ledger.waiting.position(entry.id)
        elif decision.admitted:
            self.admitted_mb += ram
            key = (entry.created_at, entry.id)
            older = [w for w in self.ledger.waiting.on(node) if w.key < key]
            assert not (strict and older), "went ahead of an older waiter under strict FIFO"

    @precondition(lambda self: len(self.ledger.waiting) > 0)
    @rule(data=st.data())
    def stop_waiting(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from(self.ledger.waiting.nodes()))
        waiting = data.draw(st.sampled_from(self.ledger.waiting.on(node)))
        assert self.ledger.stop_waiting(waiting.entry.id) is waiting.entry

    @rule(strict=st.booleans())
    def admit_waiting(self, strict: bool) -> None:
        nodes = self.ledger.waiting.nodes()
        admitted = self.ledger.admit_waiting(self.now, nodes, strict=strict)
        for decision in admitted:
            assert decision.admitted
            self.admitted_mb += decision.entry.ram_mb
            assert decision.entry.id not in self.ledger.waiting
            assert not self._over(decision.entry.node), "a waiting one pushed its node over"
        for node in nodes:
            queue = self.ledger.waiting.on(node)
            fits = [w for w in queue if self.ledger.refusal(w.entry, self.now) is None]
            if strict:  # the head blocks; nothing behind it went ahead of it
                assert not queue or self.ledger.refusal(queue[0].entry, self.now) is not None
            else:  # nothing that fits is left waiting
                assert fits == []

    @rule()
    def waits_run_out(self) -> None:
        for decision in self.ledger.wait_over(self.now):
            assert not decision.admitted
            assert decision.entry.id not in self.ledger.waiting
            assert decision.reason in (Reason.WAIT_TIMEOUT, Reason.ALREADY_EXPIRED)

    # -- restart (the operator's rebuild) ------------------------------------------------

    @rule()
    def restart(self) -> None:
        """A new process: nodes, then the admitted entries restored, then the waiters
        queued again (as the operator's rebuild does)."""
        held = sum(e.ram_mb for e in self.ledger.entries())
        nodes = [(n, total, vram, limits) for n, (total, vram, limits) in self.capacity.items()]
        rebuilt, _ = Ledger.rebuild(self.limits, nodes, _copies(self.ledger.entries()))
        for node in self.ledger.waiting.nodes():
            for waiting in self.ledger.waiting.on(node):
                rebuilt.requeue(waiting.entry, waiting.until, for_quota=waiting.for_quota)
        self.ledger, self.admitted_mb = rebuilt, 0
        self.postponed.clear()
        m = rebuilt.metrics()
        assert (m.reserved_mb, m.released_mb, m.reclaimed_mb) == (0, 0, 0)
        assert m.restored_mb == held == m.active_mb

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def waiting_ones_hold_nothing_and_keep_their_order(self) -> None:
        for node in self.ledger.waiting.nodes():
            queue = self.ledger.waiting.on(node)
            order = [(w.created_at, w.entry.id) for w in queue]
            assert order == sorted(order), "not in creation order, then by name"
            for position, waiting in enumerate(queue, 1):
                assert self.ledger.get(waiting.entry.id) is None
                assert self.ledger.waiting.position(waiting.entry.id) == position

    @invariant()
    def never_overcommitted_by_admission(self) -> None:
        for node in self.capacity:
            if node not in self.shrunk:
                assert not self._over(node)

    @invariant()
    def aggregates_equal_a_recount(self) -> None:
        for node in (*NODES, "ghost"):
            entries = self.ledger.entries_for_node(node)
            summary = self.ledger.node_summary(node, self.now)
            assert summary.reserved_ram_mb == sum(e.ram_mb for e in entries)
            assert summary.reserved_vram_mb == sum(e.vram_mb for e in entries)
            assert summary.active_entries == len(entries)

    @invariant()
    def counters_are_consistent(self) -> None:
        m = self.ledger.metrics()
        assert m.restored_mb + m.reserved_mb - m.released_mb - m.reclaimed_mb == m.active_mb
        assert m.reserved_mb == self.admitted_mb, "reserved counts exactly what was admitted"
        assert m.active_mb == sum(e.ram_mb for e in self.ledger.entries())
        assert m.active_entries == len(self.ledger)

    @invariant()
    def rebuild_gives_an_identical_ledger(self) -> None:
        nodes = [(n, total, vram, limits) for n, (total, vram, limits) in self.capacity.items()]
        copies = _copies(self.ledger.entries())
        rebuilt, _ = Ledger.rebuild(self.limits, nodes, copies)
        m = rebuilt.metrics()
        assert (m.reserved_mb, m.restored_mb) == (0, sum(e.ram_mb for e in copies))
        for node in (*NODES, "ghost"):  # a rebuild from admitted entries has no waiting ones
            mine = replace(
                self.ledger.node_summary(node, self.now), queued_entries=0, queued_ram_mb=0
            )
            assert rebuilt.node_summary(node, self.now) == mine
        assert sorted(e.id for e in rebuilt.entries()) == sorted(
            e.id for e in self.ledger.entries()
        )
        assert rebuilt.next_deadline() == self._true_next_deadline()

    @invariant()
    def no_deadline_is_missed(self) -> None:
        """The sweeper wakes at next_deadline: it must never be later than the first real one."""
        # A postponed entry needs a look at its postponement, or at its own deadline if a
        # longer window moved that later.
        effective = [
            max(self.postponed.get(e.id, self._deadline(e)), self._deadline(e))
            for e in self.ledger.entries()
        ]
        first = min(effective, default=None)
        planned = self.ledger.next_deadline()
        if first is not None:
            assert planned is not None
            assert planned <= first

    # -- helpers -----------------------------------------------------------------------

    def _reserved(self, node: str) -> int:
        return sum(e.ram_mb for e in self.ledger.entries_for_node(node))

    def _over(self, node: str) -> bool:
        limit = self.ledger.node_summary(node, self.now).limit_ram_mb
        return limit is not None and self._reserved(node) > limit

    def _settle(self, node: str) -> None:
        if not self._over(node):
            self.shrunk.discard(node)

    def _deadline(self, entry: Entry) -> datetime:
        return entry.deadline(self.ledger.limits_for(entry.node).heartbeat_stale_window)

    def _true_next_deadline(self) -> datetime | None:
        deadlines = [
            e.deadline(self.ledger.limits_for(e.node).heartbeat_stale_window)
            for e in self.ledger.entries()
        ]
        return min(deadlines, default=None)


def _copies(entries: list[Entry]) -> list[Entry]:
    """The entries as a rebuild reads them back from the API: new objects, same fields."""
    return [dataclasses.replace(e) for e in entries]


LedgerMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLedgerProperties = LedgerMachine.TestCase
