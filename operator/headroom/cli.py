"""Command line: ``headroom run`` starts the operator."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys

from headroom.api.config import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="headroom", description="Headroom operator and tools.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the operator against the current kubeconfig")
    run.add_argument("--config", help="YAML config file (default: $HEADROOM_CONFIG, or defaults)")
    run.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from headroom.main import load_config
    from headroom.main import run as run_operator

    try:
        config = load_config(args.config)
    except ConfigError as error:
        print(f"headroom: bad config: {error}", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_operator(config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
