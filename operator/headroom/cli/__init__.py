"""Command line: ``headroom run`` starts the operator; the other subcommands, also
installed as the kubectl plugin ``kubectl-headroom``, read and write headroom.

Exit codes: 0 done; 1 refused (rejected or reclaimed; fit: no node fits, or a quota
refuses); 2 bad argument, nothing sent; 3 no decision within --timeout; 4 the cluster
unreachable or refusing; fit --dry-run: 0 would be admitted, 1 would be rejected, 5 would
wait (queued), 6 no outlook. hold: these before the command starts, then the command's own code."""

from __future__ import annotations

import argparse
import sys

import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from headroom.api.constants import MAX_MB
from headroom.cli import arguments, commands, fit, hold, reserve, run, summary, why
from headroom.cli.exits import (
    CommandError,
    Exit,
    describe_api_error,
    describe_connection_error,
    one_line,
)

NODE_HELP = (
    "a Node name, or auto: the best node now (as `fit` orders them) and, when it "
    "refuses for lack of room, the next (at most 3)"
)
GPUS_HELP = "GPU devices vram is spread over (default 1 when --vram > 0; 0: node-wide sum)"
SELECTOR_HELP = "with --node auto: only Nodes matching this label selector (needs list on nodes)"


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--kubeconfig", help="path to the kubeconfig (default: as kubectl)")
    common.add_argument("--context", help="kubeconfig context to use")
    common.add_argument("-n", "--namespace", help="namespace (default: the context's)")
    common.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    return common


def _parser(prog: str, with_run: bool) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    subcommands = parser.add_subparsers(dest="command", required=True)
    if with_run:
        run.add(subcommands)
    _add_commands(subcommands, _common())
    return parser


def _add_commands(
    subcommands: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    def parser(name: str, help_: str) -> argparse.ArgumentParser:
        return subcommands.add_parser(name, help=help_, parents=[common])

    p = parser("nodes", "per-node headroom")
    p.add_argument(
        "--devices",
        action="store_true",
        help="one row per GPU device (memory, reserved, free MiB) instead of one per node",
    )
    p.set_defaults(handler=commands.nodes)
    parser("summary", "cluster-wide totals").set_defaults(handler=summary.command)
    p = parser("why", "why a reservation (or pod/NAME, a gated pod) is where it is")
    p.add_argument("reservation", help="a reservation's name, or pod/NAME")
    p.set_defaults(handler=why.why)
    p = parser("reserve", "create a reservation (and wait for its decision)")
    p.add_argument("--node", required=True, help=NODE_HELP)
    p.add_argument("--ram", required=True, help=f"MiB, 0 .. {MAX_MB}")
    p.add_argument("--vram", default="0", help=f"MiB, 0 .. {MAX_MB}")
    p.add_argument("--gpus", metavar="N", help=GPUS_HELP)
    p.add_argument("--ttl", help="hard expiry from now, e.g. 1h")
    p.add_argument("--name", help="default: rsv-<random>")
    p.add_argument("--description")
    p.add_argument("--owner-pod")
    p.add_argument("-l", "--selector", help=SELECTOR_HELP)
    p.add_argument(
        "--wait-for-room",
        dest="wait_for",
        help="how long it may wait for room, Queued (spec.wait, e.g. 10m, at most 24h)",
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait for the decision: exit 0 admitted, 1 rejected, 3 no decision in --timeout",
    )
    p.add_argument(
        "--timeout",
        help=f"with --wait (default {arguments.DEFAULT_TIMEOUT}, plus --wait-for-room)",
    )
    p.add_argument(
        "--keep-on-timeout",
        action="store_true",
        help="with --wait: keep the reservation when the wait runs out (default: delete it)",
    )
    p.set_defaults(handler=reserve.command, wait_flag="--wait-for-room")
    p = parser("heartbeat", "refresh a reservation's heartbeat (exit 1 if it holds nothing)")
    p.add_argument("reservation")
    p.set_defaults(handler=commands.heartbeat)
    fit.add(parser("fit", "the nodes where a claim of this size fits now, best first"))
    p = parser("hold", "claim memory, run a command while holding it, release it when it ends")
    p.description = hold.__doc__
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--node", required=True, help=NODE_HELP)
    p.add_argument("--ram", required=True, help=f"MiB, 0 .. {MAX_MB}")
    p.add_argument("--vram", default="0", help=f"MiB, 0 .. {MAX_MB}")
    p.add_argument("--gpus", metavar="N", help=GPUS_HELP)
    p.add_argument("--ttl", help="hard expiry from now, e.g. 8h")
    p.add_argument(
        "--wait",
        dest="wait_for",
        help="how long the claim may wait for room (spec.wait, e.g. 10m, at most 24h)",
    )
    p.add_argument(
        "--timeout",
        help=f"how long to wait for the decision (default {arguments.DEFAULT_TIMEOUT}, "
        "plus --wait); then the claim is withdrawn and hold exits 3",
    )
    p.add_argument("--name", help="default: claim-<random>")
    p.add_argument("--description")
    p.add_argument("--owner-pod", help='e.g. "$POD_NAME"; the pod needs headroom.dev/owner=true')
    p.add_argument("-l", "--selector", help=SELECTOR_HELP)
    p.add_argument("argv", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    p.set_defaults(handler=hold.command)


def _flags_with_a_value(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The flags that take a value, of the parser and of the subcommand ``argv`` names
    (one subcommand's flag may be another's switch: ``hold --wait 5m``, ``reserve --wait``)."""
    flags: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            named = next((word for word in argv if word in action.choices), None)
            if named is not None:
                flags |= _flags_with_a_value(action.choices[named], [])
        elif action.option_strings and action.nargs is None:
            flags.update(action.option_strings)
    return flags


def _values_after_flags(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--ttl -1h`` as ``--ttl=-1h``.

    kubectl (pflag) takes the word after a flag that needs a value as that value,
    whatever it starts with; argparse reads ``-1h`` as an unknown flag and prints
    only its usage line. Joined, the value reaches our checks, which name it.
    """
    flags, out, i = _flags_with_a_value(parser, argv), [], 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            out += argv[i:]
            break
        if word in flags and i + 1 < len(argv):
            out.append(f"{word}={argv[i + 1]}")
            i += 2
        else:
            out.append(word)
            i += 1
    return out


def _dispatch(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    words = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(_values_after_flags(parser, words))  # usage errors: exit 2
    try:
        if hasattr(args, "namespace"):
            arguments.namespace(args.namespace)
        return int(args.handler(args))
    except CommandError as error:
        print(f"Error: {one_line(str(error))}", file=sys.stderr)
        return error.code
    except ApiException as error:
        print(f"Error: {_api_error(args, error)}", file=sys.stderr)
        return Exit.UNREACHABLE
    except (ConfigException, OSError, urllib3.exceptions.HTTPError) as error:
        if isinstance(error, ConfigException):
            problem = f"cannot reach the cluster: no usable kubeconfig: {one_line(str(error))}"
        else:
            problem = describe_connection_error(error)
        print(f"Error: {problem}", file=sys.stderr)
        return Exit.UNREACHABLE


def _api_error(args: argparse.Namespace, error: ApiException) -> str:
    name = getattr(args, "reservation", None) or getattr(args, "name", None)
    if error.status == 404 and name:
        namespace = getattr(args, "namespace", None) or "(the context's)"
        return f'reservation "{name}" not found in namespace "{namespace}"'
    return describe_api_error(error)


def main(argv: list[str] | None = None) -> int:
    """``headroom``: run the operator, or any kubectl-headroom subcommand."""
    return _dispatch(_parser("headroom", with_run=True), argv)


def kubectl_main(argv: list[str] | None = None) -> int:
    """``kubectl headroom``: the plugin."""
    return _dispatch(_parser("kubectl headroom", with_run=False), argv)
