"""``headroom run``: start the operator."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys

from headroom.api.config import ConfigError
from headroom.logs import FORMATS, configure


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = commands.add_parser("run", help="run the operator against the current kubeconfig")
    run.add_argument("--config", help="YAML config file (default: $HEADROOM_CONFIG, or defaults)")
    run.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    run.add_argument(
        "--log-format",
        default="text",
        choices=FORMATS,
        help="text (default) or json: one object per line, with the reservation's fields",
    )
    run.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    configure(args.log_level, args.log_format)
    from headroom.main import load_config
    from headroom.main import run as run_operator

    try:
        config = load_config(args.config)
    except ConfigError as error:
        print(f"headroom: bad config: {error}", file=sys.stderr)
        return 2
    code = 0
    with contextlib.suppress(KeyboardInterrupt):
        code = asyncio.run(run_operator(config))
    return code
