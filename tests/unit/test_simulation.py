"""The deterministic simulation: thousands of seeded schedules through the real control code.

Each schedule (``headroom_dev.sim.driver``) runs the operator's control code on a
fake API server and a virtual clock, with faults, crashes, leader pauses and
tenants, and checks the operator's promises at every change and at the end
(``headroom_dev.sim.checks``). A failure prints its seed; replay it with

    HEADROOM_SIM_SEED=<seed> pytest tests/unit/test_simulation.py
    python -m headroom_dev.sim.driver --seed <seed> -v      # with the operator's log

``HEADROOM_SIM_SCHEDULES`` sets how many (default 2,000, about a minute on two
cores); ``HEADROOM_SIM_BASE`` the first seed (default 0), to explore new ones.
Every behaviour checked here also has a test on the real control plane
(tests/integration/test_reconcile.py, test_pod_gates.py, test_quotas.py,
test_pod_gates_found_by_sim.py (what the schedules found, reduced to one step each),
tests/e2e/test_liveness.py, test_chaos.py, test_pod_gates_scheduled.py,
test_scheduler_extender.py for the pods kube-scheduler binds through the extender,
tests/integration/test_outlook.py and tests/unit/test_strict_answers.py for the answers
at create).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import subprocess
import sys
from collections import Counter

import pytest

from headroom_dev.sim.driver import Outcome, simulate

SCHEDULES = int(os.environ.get("HEADROOM_SIM_SCHEDULES", "2000"))
BASE = int(os.environ.get("HEADROOM_SIM_BASE", "0"))
ONE = os.environ.get("HEADROOM_SIM_SEED")


def _run(seed: int) -> Outcome:
    logging.disable(logging.CRITICAL)  # the operator's own warnings, by the thousand
    try:
        return simulate(seed)
    except Exception as error:  # a schedule that cannot finish is a failure too
        return Outcome(seed, [f"the schedule did not finish: {error!r}"])


def test_seeded_schedules_keep_every_promise() -> None:
    seeds = [int(ONE)] if ONE else list(range(BASE, BASE + SCHEDULES))
    with multiprocessing.get_context("fork").Pool(2) as pool:
        outcomes = pool.map(_run, seeds, chunksize=25)
    totals: Counter[str] = Counter()
    for outcome in outcomes:
        totals.update(outcome.stats)
    print(f"\n{len(outcomes)} schedules (seeds {seeds[0]}..{seeds[-1]}):")
    print(f"  {dict(sorted(totals.items()))}")
    failed = [o for o in outcomes if o.violations]
    report = "\n".join(
        f"seed {o.seed} (replay: HEADROOM_SIM_SEED={o.seed}): " + "; ".join(o.violations[:3])
        for o in failed[:20]
    )
    assert not failed, f"{len(failed)} of {len(outcomes)} schedules broke a promise:\n{report}"
    # The schedules must exercise what they claim to: reclaims of every kind, crashes...
    for what in (
        "crash",
        "pause",
        "outage",
        "Reclaimed/HeartbeatStale",
        "Reclaimed/Expired",
        "Reclaimed/OwnerPodDeleted",
        "Rejected/InsufficientRAM",
        "Admitted/Fits",
        # VRAM per GPU device (headroom_dev.sim.devicechecks)
        "admitted-on-devices",
        "Rejected/InsufficientVRAM",
        # gated pods (headroom_dev.sim.pods): held, let go, run, ended, deleted, missed
        "pod-gated",
        "pod-ungated",
        "pod-bound",
        "pod-finished",
        "pod-delete-gated",
        "Reclaimed/OwnerPodFinished",
        "Admitted/OverCommitted",
        "pod-hand-made-reservation",
        "gc-delete",
        # gated pods edited (headroom_dev.sim.pods; issue 29): unlabelled and let go, claim
        # unreadable, resized, narrowed; their node cordoned or tainted; quota lifetimes
        # ending them; the clocked promises (headroom_dev.sim.podpromises) judged
        "pod-edit-unclaim",
        "pod-let-go",
        "pod-edit-unreadable",
        "pod-edit-resize",
        "pod-edit-narrow",
        "pod-node-cordon",
        "pod-node-taint",
        "pod-deadline-exceeded",
        "pod-ran-out",
        "pod-condition-checked",
        # quotas (headroom_dev.sim.quotachecks): decided under them, changed, deleted
        "admitted-under-quota",
        "Rejected/QuotaExceeded",
        "Queued/QuotaExceeded",
        "quota-change",
        "quota-delete",
        # a noisy tenant (bursts of creates, heartbeat storms) beside the others
        "noisy-create",
        "noisy-beat",
        # pods the headroom scheduler binds through the extender (headroom_dev.sim.scheduled):
        # binds checked against the store, refused, answered 503 by a replica that does not
        # decide (crashed, paused, standby), pods run out by their quota's lifetime
        "sched-bound-checked",
        "sched-bind-refused",
        "sched-filter-503",
        "sched-bind-503",
        "sched-unschedulable",
        "sched-deadline-exceeded",
        "sched-final-running",
        "sched-final-unbound",
        # tenants' creates reviewed by the webhook first (headroom_dev.sim.reviews, issue 32):
        # refused in strict mode, never persisted, reviewed twice, dry runs; a replica that
        # does not decide asked; holds taken and run out; strict answers checked and kept
        "review-refused",
        "review-never-persisted",
        "review-duplicate-held",
        "review-dry-run",
        "review-not-deciding",
        "review-forwarded",
        "hold-taken",
        "hold-ran-out",
        "strict-answer-checked",
        "strict-kept",
    ):
        assert totals[what] > 0 or len(seeds) < 100, f"no schedule had {what}"


@pytest.mark.parametrize(
    ("seed", "exercised"),
    [
        (BASE + 7, None),
        # pods the headroom scheduler binds, run to their quota's deadline
        (53, "sched-deadline-exceeded"),
    ],
)
def test_a_seed_replays_exactly_in_another_process(seed: int, exercised: str | None) -> None:
    """The seed printed for a failure must reproduce it: same run, same history."""
    here = _run(seed)
    again = _run(seed)
    if exercised is not None and not ONE:
        assert here.stats.get(exercised, 0) > 0, f"seed {seed} no longer has {exercised}"
    code = (
        "import logging, sys; logging.disable(logging.CRITICAL);"
        "from headroom_dev.sim.driver import simulate;"
        f"o = simulate({seed}); print(o.revision, sorted(o.stats.items()), o.violations)"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    there = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout.strip()
    assert (here.revision, here.stats) == (again.revision, again.stats)
    assert there == f"{here.revision} {sorted(here.stats.items())} {here.violations}"
