"""``make dev``'s entry point: signals are handled before anything heavy is imported.

Importing the harness (the Kubernetes client, pydantic) takes a moment; a Ctrl-C
in that moment would otherwise print a traceback from deep inside an import.
:func:`~headroom_dev.interrupts.run_program` installs the handler first, and a stop
that comes before the harness has started anything says so in one line.
"""

from __future__ import annotations

import sys

from headroom_dev.interrupts import run_program


def main(argv: list[str] | None = None) -> int:
    return run_program("make dev", "headroom_dev.devcluster", argv)


if __name__ == "__main__":
    sys.exit(main())
