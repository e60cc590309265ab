"""``headroom hold --node N --ram MiB [...] -- CMD ARGS…``: memory held for a command's lifetime.

A shell script, or a program that knows nothing of Headroom, gets a claim for
exactly as long as it runs: claimed (through the claim library) before it starts,
heartbeated while it runs, released when it ends, whatever ends it. The command
finds its claim in ``$HEADROOM_RESERVATION`` (``namespace/name``); ``hold`` exits
with the command's code (128 + N when signal N ended it).

GPU devices: when the claim was admitted on devices (``--vram`` on a node whose
GPU inventory the operator reads; ``--gpus N`` for N of them), the command finds
their ids in ``$HEADROOM_DEVICES``, comma-joined in the order the status lists
them. When every id is an NVIDIA UUID (``GPU-…``, ``MIG-…``) ``CUDA_VISIBLE_DEVICES``
is set to them too, so CUDA sees the devices the ledger holds memory on and no
other; it replaces an inherited value (``hold`` says so on stderr when it differs).
When an id is synthetic (``gfd-0``, an inventory from labels without UUIDs) CUDA
could not take it, and an inherited ``CUDA_VISIBLE_DEVICES`` is left as it was.

Signals, as a shell and ``tini`` treat a foreground job: the command runs in its
own process group; when ``hold`` has the terminal it hands it to that group, so a
Ctrl-C (or Ctrl-Z) from the terminal reaches the command once, directly. SIGINT,
SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to ``hold`` itself (``kill``,
Kubernetes stopping a container) are passed on to the command's group. Either
way ``hold`` waits for the command to end, then releases the claim.

Before the command starts, ``hold``'s own exit codes apply: 1 refused (the command
never runs), 2 a bad argument, 3 no decision within ``--timeout``, 4 the cluster
unreachable or refusing; 126/127 when the command cannot be started.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any

from headroom.cli import arguments, readers
from headroom.cli.exits import CommandError, Exit, UsageError
from headroom.client import procedure
from headroom.client.claim import ClaimContext, Options
from headroom.client.devices import device_list
from headroom.client.errors import (
    ClaimLostError,
    ClaimRefusedError,
    ClaimTimeoutError,
    NoNodeFitsError,
    PlacementError,
)
from headroom.client.held import ClaimView

#: The variable that tells the command which reservation holds its memory.
RESERVATION_VARIABLE = "HEADROOM_RESERVATION"
#: The claim's GPU device ids, comma-joined (set only when it holds devices).
DEVICES_VARIABLE = "HEADROOM_DEVICES"
CUDA_VARIABLE = "CUDA_VISIBLE_DEVICES"
FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


def say(line: str) -> None:
    print(f"hold: {line}", file=sys.stderr, flush=True)


def command(args: argparse.Namespace) -> int:
    if args.argv[:1] != ["--"] or len(args.argv) < 2:
        raise UsageError("the command to run goes after --: hold --node N --ram MiB -- CMD ARGS")
    argv = args.argv[1:]
    request = arguments.claim_request(args)
    if args.selector is not None and request.node is not None:
        raise UsageError("-l/--selector: only with --node auto")
    timeout = (
        arguments.duration(args.timeout, "--timeout")
        if args.timeout is not None
        else procedure.default_timeout(request)
    )
    conn = readers.connect(args.kubeconfig, args.context, args.namespace)

    def lost(error: ClaimLostError) -> None:
        say(f"warning: {error}; the command goes on without it")

    opts = Options(request, timeout, args.selector, None, conn, say, lost)
    try:
        with ClaimContext(opts, handle_sigterm=True) as held:
            say(f"holding {held.reference} on node {held.node}: {held.message}")
            code = run(argv, command_env(os.environ, held, say))
            if held.release():
                say(f"released {held.reference}")
            else:
                say(
                    f"could not release {held.reference} (see the warning above); "
                    "nobody heartbeats it now, so it is reclaimed after its stale window"
                )
    except KeyboardInterrupt:
        print(
            "Error: interrupted before the command started; the claim was withdrawn",
            file=sys.stderr,
        )
        return 128 + signal.SIGINT
    except (ClaimRefusedError, NoNodeFitsError) as error:
        raise CommandError(Exit.REFUSED, f"{error}; the command was not run") from None
    except ClaimTimeoutError as error:
        raise CommandError(Exit.TIMED_OUT, f"{error}; the command was not run") from None
    except (PlacementError, ClaimLostError) as error:
        raise CommandError(Exit.UNREACHABLE, f"{error}; the command was not run") from None
    return code


def command_env(
    environ: Mapping[str, str], held: ClaimView, report: Callable[[str], None]
) -> dict[str, str]:
    """The command's environment: ``hold``'s, plus the claim (see the module's text)."""
    env = {**environ, RESERVATION_VARIABLE: held.reference}
    devices = device_list(held.devices)
    if devices is not None:
        env[DEVICES_VARIABLE] = devices
    cuda = held.cuda_visible_devices
    if cuda is not None:
        inherited = environ.get(CUDA_VARIABLE)
        if inherited is not None and inherited != cuda:
            report(f"{CUDA_VARIABLE}={cuda} replaces the inherited {inherited!r}")
        env[CUDA_VARIABLE] = cuda
    return env


def run(argv: list[str], env: dict[str, str]) -> int:
    """Run the command in its own process group, passing signals on; its exit code."""
    terminal = _foreground_terminal()
    child: subprocess.Popen[bytes] | None = None
    early: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        if child is None:
            early.append(signum)  # before the command started: passed on once it has
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    try:
        try:
            child = subprocess.Popen(argv, env=env, process_group=0)
        except OSError as error:
            say(f"cannot run {argv[0]}: {error.strerror or error}")
            return 127 if isinstance(error, FileNotFoundError) else 126
        if terminal is not None:
            _hand_terminal(terminal, child.pid)
        for signum in early:
            os.killpg(child.pid, signum)
        return _wait(child, terminal)
    finally:
        if terminal is not None:
            _hand_terminal(terminal, os.getpgrp())
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def _wait(child: subprocess.Popen[bytes], terminal: int | None) -> int:
    """Until the command ends. Stopped from the terminal (Ctrl-Z), ``hold`` takes the
    terminal back and stops too, as a shell's job would; continued, it gives it back."""
    while True:
        _, status = os.waitpid(child.pid, os.WUNTRACED)
        if os.WIFSTOPPED(status):
            if terminal is not None:
                _hand_terminal(terminal, os.getpgrp())
                os.kill(os.getpid(), signal.SIGSTOP)
                _hand_terminal(terminal, child.pid)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGCONT)
            continue
        code = os.waitstatus_to_exitcode(status)
        child.returncode = code
        return 128 - code if code < 0 else code


def _foreground_terminal() -> int | None:
    """stdin's file descriptor when it is a terminal and ``hold`` is its foreground job."""
    try:
        fd = sys.stdin.fileno()
        if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
            return fd
    except (OSError, ValueError):
        pass
    return None


def _hand_terminal(fd: int, group: int) -> None:
    ignored: Callable[..., Any] | int | None = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(fd, group)
    finally:
        signal.signal(signal.SIGTTOU, signal.SIG_DFL if ignored is None else ignored)
