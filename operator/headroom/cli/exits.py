"""Exit codes, and the one line each failure prints.

Scripts branch on the exit code, so each code means one thing (the team's
table, also in docs/reference/cli.md): whether the claim was refused, the command line was
wrong (nothing sent), the wait ran out, or the cluster could not be reached or
refused the request. A failure is one line on stderr, never a traceback.
"""

from __future__ import annotations

from enum import IntEnum

import urllib3
from kubernetes.client.exceptions import ApiException

from headroom.client.errors import api_message


class Exit(IntEnum):
    DONE = 0
    #: ``reserve --wait`` ended Rejected or Reclaimed; ``heartbeat`` on a reservation
    #: that holds nothing; ``fit``: no node fits (``--dry-run``: would be rejected).
    REFUSED = 1
    #: A bad argument; nothing was sent to the cluster.
    USAGE = 2
    #: ``reserve --wait`` got no decision in time.
    TIMED_OUT = 3
    #: No usable kubeconfig, the API server unreachable, or it refused the request.
    UNREACHABLE = 4
    #: ``fit --dry-run``: the claim would wait in the node's queue (``Queued``).
    WOULD_WAIT = 5
    #: ``fit --dry-run``: no outlook came back (the operator's webhook is not registered
    #: or failed, or no leader decides now): nothing is known.
    NO_OUTLOOK = 6


class CommandError(Exception):
    """Ends a command with ``code``; the message is printed as ``Error: <message>``."""

    def __init__(self, code: Exit, message: str) -> None:
        super().__init__(message)
        self.code = code


class UsageError(CommandError):
    """A bad argument, found before anything is sent to the cluster."""

    def __init__(self, message: str) -> None:
        super().__init__(Exit.USAGE, message)


def one_line(text: str) -> str:
    return " ".join(text.split())


def is_forbidden(error: BaseException) -> bool:
    return isinstance(error, ApiException) and error.status == 403


def describe_api_error(error: ApiException) -> str:
    """One line for an API error; status 0 is the client's own TLS failure."""
    if error.status == 0:
        return f"cannot reach the API server: {one_line(str(error.reason or ''))}"
    if error.status == 401:
        return f"the credentials were not accepted (401 Unauthorized): {api_message(error)}"
    if error.status == 403:  # the API server's sentence names the user, verb and resource
        return api_message(error) or "forbidden (403)"
    return (
        f"the API server refused the request ({error.status} {error.reason}): {api_message(error)}"
    )


def describe_connection_error(error: urllib3.exceptions.HTTPError | OSError) -> str:
    """``cannot reach the API server at URL: <the innermost cause>``."""
    where = ""
    pool = getattr(error, "pool", None)
    if pool is not None:
        where = f" at {pool.scheme}://{pool.host}:{pool.port}"
    cause: BaseException = error
    reason = getattr(error, "reason", None)
    if isinstance(reason, BaseException):
        cause = reason
    while (inner := cause.__cause__ or cause.__context__) is not None:
        cause = inner
    return f"cannot reach the API server{where}: {one_line(str(cause)) or type(cause).__name__}"
