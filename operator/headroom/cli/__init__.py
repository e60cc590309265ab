"""Command line: ``headroom run`` starts the operator; the other subcommands, also
installed as the kubectl plugin ``kubectl-headroom``, read and write headroom."""

from __future__ import annotations

import argparse
import sys

from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from headroom.cli import commands, run


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--kubeconfig", help="path to the kubeconfig (default: as kubectl)")
    common.add_argument("--context", help="kubeconfig context to use")
    common.add_argument("-n", "--namespace", help="namespace (default: the context's)")
    common.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    return common


def _parser(prog: str, with_run: bool) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    subcommands = parser.add_subparsers(dest="command", required=True)
    if with_run:
        run.add(subcommands)
    commands.add(subcommands, _common())
    return parser


def _dispatch(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except ApiException as error:
        what = getattr(args, "reservation", None) or getattr(args, "name", None) or ""
        if error.status == 404 and what:
            namespace = getattr(args, "namespace", None) or "(current)"
            print(
                f'Error: reservation "{what}" not found in namespace "{namespace}"', file=sys.stderr
            )
        else:
            print(
                f"Error: API server said {error.status} {error.reason}: {_message(error)}",
                file=sys.stderr,
            )
        return 2
    except (ConfigException, OSError, ValueError) as error:
        print(f"Error: {error}", file=sys.stderr)
        return 2
    return code


def _message(error: ApiException) -> str:
    import json

    try:
        return str(json.loads(error.body or "{}").get("message", ""))
    except ValueError:
        return str(error.body or "")


def main(argv: list[str] | None = None) -> int:
    """``headroom``: run the operator, or any kubectl-headroom subcommand."""
    return _dispatch(_parser("headroom", with_run=True), argv)


def kubectl_main(argv: list[str] | None = None) -> int:
    """``kubectl headroom``: the plugin."""
    return _dispatch(_parser("kubectl headroom", with_run=False), argv)
