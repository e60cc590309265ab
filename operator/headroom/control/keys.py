"""The decision key: read (or create) its Secret, and adopt the statuses it cannot verify.

Why adoption exists, and why it is safe, is said in ``headroom.objects.stamp``.
The new stamp is part of a record's truth, so it is set on the record first and
written by the status writer like any other decision; a watch event in between
can then only ask for the new one to be written.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import logging
import random
import secrets

from headroom.api.paths import resource_path
from headroom.control.state import Record, State
from headroom.control.writer import StatusWriter
from headroom.kube.backoff import Backoff
from headroom.kube.clock import Clock
from headroom.kube.retry import api_failure, retry_call
from headroom.kube.transport import ApiError, Transport
from headroom.objects.stamp import ADOPTED_ANNOTATION, KEY_FIELD, DecisionKey

log = logging.getLogger(__name__)


class MissingKeyError(RuntimeError):
    """The decision key's Secret is absent and the operator may not create it."""


async def load_key(
    transport: Transport,
    namespace: str,
    name: str,
    *,
    create: bool = True,
    labels: dict[str, str] | None = None,
) -> DecisionKey:
    """The key from Secret ``namespace/name``; if absent, created with 32 random bytes
    and ``labels`` (the release's, so that it is found and listed with it), or, with
    ``create`` false, :class:`MissingKeyError`."""
    path = resource_path("", "v1", "secrets", namespace)
    for _ in range(3):
        try:
            secret = await transport.get(f"{path}/{name}")
            annotations = (secret.get("metadata") or {}).get("annotations") or {}
            # A Secret from before adoption existed carries no mark: its key is established.
            adopting = annotations.get(ADOPTED_ANNOTATION) == "false"
            return DecisionKey(base64.b64decode(secret["data"][KEY_FIELD]), adopting)
        except ApiError as error:
            if not error.not_found:
                raise
        if not create:
            raise MissingKeyError(
                f"decision key Secret {namespace}/{name} not found, and decisionKey.create "
                f"is false: create it with a '{KEY_FIELD}' field of 32 random bytes"
            )
        metadata = {
            "name": name,
            "labels": dict(labels or {}),
            "annotations": {ADOPTED_ANNOTATION: "false"},
        }
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata,
            "type": "Opaque",
            "data": {KEY_FIELD: base64.b64encode(secrets.token_bytes(32)).decode()},
        }
        try:
            await transport.create(path, body)
            log.warning(
                "created decision key Secret %s/%s: statuses stamped before it will be "
                "adopted and stamped again",
                namespace,
                name,
            )
        except ApiError as error:
            if not error.conflict:  # 409: another replica created it first; read that one
                raise
    raise RuntimeError(f"decision key Secret {namespace}/{name} could not be read or created")


class Adoption:
    """Stamps adopted statuses again with the new key, then closes adoption on the Secret."""

    def __init__(
        self,
        state: State,
        writer: StatusWriter,
        transport: Transport,
        clock: Clock,
        *,
        run_id: str,
        namespace: str,
        secret: str,
        rng: random.Random,
    ) -> None:
        self._state, self._writer, self._transport, self._clock = state, writer, transport, clock
        self._run_id, self._namespace, self._secret, self._rng = run_id, namespace, secret, rng
        self._numbers = itertools.count()
        self._pending: list[Record] = []

    def adopt(self, record: Record) -> None:
        """A remembered record whose status the key cannot verify: stamp it again."""
        decision = self._state.stamper
        number = next(self._numbers)
        record.decision.decision_id = f"{self._run_id}-adopted-{number}"
        record.decision.stamp = decision.sign(
            record.uid,
            record.decision.decision_id,
            str(record.decision.phase),
            record.decision.devices,
            record.decision.expiry_text,
        )
        record.changed_at = self._clock.monotonic()
        record.confirmed = False
        self._pending.append(record)
        self._writer.ensure(record.uid)

    async def finish(self) -> None:
        """Once every adopted status carries the new stamp (or is gone), mark the Secret."""
        while True:
            records = self._state.records
            self._pending = [
                r for r in self._pending if records.get(r.uid) is r and not r.confirmed
            ]
            if not self._pending:
                break
            await asyncio.sleep(0.5)

        def failed(error: Exception, delay: float) -> None:
            log.warning("adoption not marked on the Secret (%s); again in %.1fs", error, delay)

        await retry_call(
            lambda: mark_adopted(self._transport, self._namespace, self._secret),
            backoff=Backoff(base=0.5, cap=30.0, rng=self._rng),
            retry_on=api_failure,
            on_retry=failed,
        )
        self._state.stamper.adopting = False
        log.info("decision key adopted: every status it could not verify is stamped again")


async def mark_adopted(transport: Transport, namespace: str, secret: str) -> None:
    """Every status carries a stamp of this key now: unverifiable ones are distrusted again."""
    path = resource_path("", "v1", "secrets", namespace, secret)
    await transport.merge_patch(path, {"metadata": {"annotations": {ADOPTED_ANNOTATION: "true"}}})
