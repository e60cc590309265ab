"""``make dev``'s entry point: signals are handled before anything heavy is imported.

Importing the harness (the Kubernetes client, pydantic) takes a moment; a Ctrl-C
in that moment would otherwise print a traceback from deep inside an import.
Here the handler is installed first, and a stop that comes before the harness
has started anything says so in one line.
"""

from __future__ import annotations

import signal
import sys

from headroom_dev.interrupts import StopOnSignals, Stopped


def main(argv: list[str] | None = None) -> int:
    signals = StopOnSignals()
    try:
        signals.arm()
        print("make dev: starting; Ctrl-C stops it at any moment", flush=True)
        from headroom_dev import devcluster  # after the handler, on purpose

        return devcluster.main(argv, signals)
    except Stopped as stopped:  # one that devcluster.main did not handle: nothing started
        name = signal.Signals(stopped.signum).name
        print(f"make dev: stopped by {name} before anything was started", flush=True)
        return stopped.exit_code


if __name__ == "__main__":
    sys.exit(main())
