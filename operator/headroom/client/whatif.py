"""``what_if("gpu-1", ram_mb=4096)``: what the operator would decide for a claim, with
nothing created.

The claim is sent as a create with ``dryRun=All`` (a server-side dry run): the API
server runs every admission step, the operator's validating webhook on Reservations
among them, and stores nothing. The webhook answers every create with the *outlook*
(``headroom.api.outlook``) as admission warnings, which come back as HTTP ``Warning``
headers (``299 - "would wait: position 2 on gpu-1 (InsufficientRAM: ...)"``); they are
read here, with the caveat that may come beside them (``outlook may change: ...``).

An outlook is not a decision: it is what the leader's ledger would decide if nothing
else happened first. When no outlook came back (the webhook is not registered, or it
failed or timed out: its failure policy lets the create through without one), the
answer is an ``Unknown`` outlook that says so, never a guess. ``AUTO`` asks about the
node a claim would be placed on (``placement``'s first candidate).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from headroom.api.outlook import CAVEAT, Outlook, Verdict, parse_warning
from headroom.client import calls, placement, plans
from headroom.client.claim import options
from headroom.client.connection import Connection, connect
from headroom.client.errors import NoNodeFitsError
from headroom.client.placement import AutoNode
from headroom.client.plans import Plan, call
from headroom.client.spec import ClaimRequest

JSON = dict[str, Any]
#: Said when the dry run came back without an outlook among its warnings.
NO_OUTLOOK_RETURNED = (
    "the API server returned no outlook: the operator's validating webhook on "
    "Reservations is not registered, or it failed or timed out (it lets the create "
    "through without a word)"
)
#: The API server's warnings; 299 is "miscellaneous persistent warning", the only code
#: Kubernetes sends.
WARNING_CODE = "299"
#: A name prefix for the dry-run object (a name is generated, nothing is stored).
GENERATE_NAME = "what-if-"

_HEAD = re.compile(r"[\s,]*(?P<code>\d{3}) (?P<agent>[^\s\"]+) \"")
_DATE = re.compile(r" \"")
_END = re.compile(r"\s*(?:,|$)")


def _quoted(value: str, start: int) -> tuple[str, int] | None:
    """The quoted-string whose opening quote ends just before ``start``, unescaped, and
    where it ends (after its closing quote); None if it is not closed."""
    out: list[str] = []
    index = start
    while index < len(value):
        char = value[index]
        if char == "\\" and index + 1 < len(value):
            out.append(value[index + 1])
            index += 2
            continue
        if char == '"':
            return "".join(out), index + 1
        out.append(char)
        index += 1
    return None


def _skip(value: str, start: int) -> int:
    """Past the next comma outside a quoted-string (or the end): a malformed element."""
    index, quoted = start, False
    while index < len(value):
        char = value[index]
        if quoted and char == "\\":
            index += 2
            continue
        if char == '"':
            quoted = not quoted
        elif char == "," and not quoted:
            return index + 1
        index += 1
    return len(value)


def warning_texts(values: Iterable[str]) -> list[str]:
    """The texts of HTTP ``Warning`` header values (RFC 7234: ``code agent "text"
    ["date"]``, several per value comma-separated, quotes and backslashes escaped), in
    order. Elements with another code than 299, and malformed ones, are left out."""
    texts: list[str] = []
    for value in values:
        index = 0
        while index < len(value):
            if not value[index:].strip(" \t,"):
                break
            head = _HEAD.match(value, index)
            if head is None:
                index = _skip(value, index)
                continue
            text = _quoted(value, head.end())
            if text is None:
                break
            said, index = text
            if date := _DATE.match(value, index):
                dated = _quoted(value, date.end())
                if dated is None:
                    break
                index = dated[1]
            end = _END.match(value, index)
            if end is None:
                index = _skip(value, index)
                continue
            index = end.end()
            if head["code"] == WARNING_CODE:
                texts.append(said)
    return texts


@dataclass(frozen=True)
class WhatIf:
    """What creating the claim on ``node`` now would give, as the operator foresees it.

    ``outlook.verdict`` is ``Admitted``, ``Queued`` (``outlook.position`` in the node's
    queue, ``outlook.reason``), ``Rejected`` (``outlook.reason``, the numbers in
    ``outlook.detail``) or ``Unknown`` (``outlook.detail`` says why there is none).
    ``caveats``: why it may still change (reservations seen earlier, not decided yet, go
    first). ``warnings``: every warning the dry run returned, other webhooks' too.
    """

    node: str
    outlook: Outlook
    caveats: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def verdict(self) -> Verdict:
        return self.outlook.verdict

    def as_json(self) -> JSON:
        return {
            "node": self.node,
            "verdict": str(self.outlook.verdict),
            "reason": self.outlook.reason,
            "position": self.outlook.position,
            "detail": self.outlook.detail,
            "caveats": list(self.caveats),
        }

    def lines(self) -> list[str]:
        """The outlook as the webhook says it, then each caveat."""
        return [self.outlook.warning(), *(f"{CAVEAT}{caveat}" for caveat in self.caveats)]


def read_outlook(node: str, texts: Sequence[str]) -> WhatIf:
    """The outlook among a dry run's warning texts (the first, should there be several),
    its caveats; an Unknown outlook when none came back."""
    found = next((o for o in map(parse_warning, texts) if o is not None), None)
    caveats = tuple(text[len(CAVEAT) :] for text in texts if text.startswith(CAVEAT))
    if found is None:
        found = Outlook(Verdict.UNKNOWN, NO_OUTLOOK_RETURNED)
    return WhatIf(node, found, caveats, tuple(texts))


def dry_run_body(request: ClaimRequest, node: str) -> JSON:
    """The Reservation a claim would create on ``node``; a generated name if it has none."""
    body = request.body(node)
    if "name" not in body["metadata"]:
        body["metadata"]["generateName"] = GENERATE_NAME
    return body


def ask(conn: Connection, request: ClaimRequest, node: str) -> WhatIf:
    """One server-side dry-run create on ``node``, and the outlook it returned."""
    _, values = calls.dry_run_create(conn, dry_run_body(request, node))
    return read_outlook(node, warning_texts(values))


def foresee(conn: Connection, request: ClaimRequest, selector: str | None = None) -> Plan[WhatIf]:
    """The outlook on ``request.node``, or (None) on the node automatic placement would
    try first; NoNodeFitsError when it would find none."""
    node = request.node
    if node is None:
        rooms = yield from call(
            placement.read, conn, request.ram_mb, request.vram_mb, selector, request.gpus
        )
        chosen = placement.candidates(rooms, may_wait=request.wait is not None, most=1)
        if not chosen:
            raise NoNodeFitsError(
                placement.no_room(rooms, request.ram_mb, request.vram_mb, selector, request.gpus)
            )
        node = chosen[0].node
    return (yield from call(ask, conn, request, node))


def _checked(
    node: str | AutoNode, connection: Connection | None, **values: Any
) -> tuple[ClaimRequest, str | None, Connection | None]:
    opts = options(
        node,
        timeout=None,
        connection=connection,
        heartbeat_interval=None,
        on_lost=None,
        report=None,
        **values,
    )
    return opts.request, opts.selector, opts.connection


def what_if(
    node: str | AutoNode,
    *,
    ram_mb: int = 0,
    vram_mb: int = 0,
    gpus: int | None = None,
    ttl: timedelta | str | None = None,
    wait: timedelta | str | None = None,
    name: str | None = None,
    description: str | None = None,
    owner_pod: str | bool | None = None,
    selector: str | None = None,
    connection: Connection | None = None,
) -> WhatIf:
    """What :func:`headroom.client.claim` with these arguments would be told now, from a
    server-side dry run: nothing is created, nothing held.

    The arguments are ``claim``'s, checked the same way (:class:`InvalidClaimError`
    before any call). Returns a :class:`WhatIf`; its outlook is ``Unknown`` when the
    operator gave none (its webhook not registered or failing, or no leader deciding).
    An outlook may change before a real claim is decided. Transport errors are the
    official client's; with ``AUTO``, :class:`NoNodeFitsError` and :class:`PlacementError`.
    """
    request, chosen_selector, conn = _checked(
        node,
        connection,
        ram_mb=ram_mb,
        vram_mb=vram_mb,
        gpus=gpus,
        ttl=ttl,
        wait=wait,
        name=name,
        description=description,
        owner_pod=owner_pod,
        selector=selector,
    )
    return plans.run(foresee(conn or connect(), request, chosen_selector))
