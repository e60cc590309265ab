"""Keep the webhook's certificate Secret, the served certificate and the caBundle in step.

Every replica runs this loop, leader or not: each must serve the shared
certificate, and none may wait for a Lease to do so. Concurrency is settled by
the API server alone:

- the first replica to find no Secret creates it; the others get 409 and read
  the winner's (so there is one CA, whoever starts first);
- a renewal is a PUT carrying the resourceVersion that was read; the loser of a
  race gets 409 and reads the winner's renewal;
- the ``caBundle`` is patched only where it differs, with a JSON patch that
  first tests the configuration's resourceVersion.

The loop runs every ``checkPeriod``, which is also how quickly a ``caBundle``
wiped by someone (``kubectl replace`` of the configuration, a tool that does not
merge) is written again. The chart leaves ``caBundle`` out of its template, so a
``helm upgrade``'s three-way merge does not touch it in the first place.
Key generation and certificate parsing run in a thread (they are CPU work).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import quote

from headroom.api.paths import resource_path
from headroom.kube.backoff import Backoff
from headroom.kube.clock import Clock
from headroom.kube.transport import JSON, ApiError, ApiUnavailableError, Transport
from headroom.objects.certificates import (
    Bundle,
    CertificatePolicy,
    bundle_from_secret,
    ca_bundle_patch,
    not_after,
    published_bundle,
    renewal,
    secret_body,
)

log = logging.getLogger(__name__)

#: Labels on the Secret, so that ``kubectl get secret -l`` finds what the operator made.
SECRET_LABELS = {"app.kubernetes.io/managed-by": "headroom-operator"}


@dataclass(frozen=True, slots=True)
class CertificateTarget:
    """Where the Secret lives and which configuration's caBundle to keep."""

    namespace: str
    secret: str
    configuration: str | None
    policy: CertificatePolicy


class CertificateKeeper:
    """Reads, creates and renews the Secret; hands each new serving pair to ``serve``."""

    def __init__(
        self,
        transport: Transport,
        target: CertificateTarget,
        serve: Callable[[bytes, bytes], Awaitable[None]],
        *,
        clock: Clock,
        period: float,
        rng: random.Random | None = None,
    ) -> None:
        self._transport, self._target, self._serve = transport, target, serve
        self._period, self._clock = period, clock
        self._backoff = Backoff(base=0.5, cap=period, rng=rng or random.Random())
        self._secrets = resource_path("", "v1", "secrets", target.namespace)
        self._secret_path = f"{self._secrets}/{quote(target.secret, safe='')}"
        self._configuration_path = (
            None
            if target.configuration is None
            else resource_path(
                "admissionregistration.k8s.io",
                "v1",
                "mutatingwebhookconfigurations",
                None,
                target.configuration,
            )
        )

    async def run(self) -> None:
        """Forever: sync, then sleep a period (or back off after a failure)."""
        while True:
            try:
                await self.sync()
                self._backoff.reset()
                delay = self._period
            except (ApiError, ApiUnavailableError) as error:
                delay = self._backoff.next()
                log.warning("webhook certificate not synced (%s); again in %.1fs", error, delay)
            await asyncio.sleep(delay)

    async def sync(self) -> Bundle:
        """One pass: the Secret is current, its pair is served, its CAs are published."""
        try:
            configuration = await self._configuration()
        except (ApiError, ApiUnavailableError):
            # Serve what the Secret holds meanwhile; renewing waits for the configuration
            # (a CA rotation must know what the API server trusts).
            current = bundle_from_secret(await self._read_secret())
            if current is not None:
                await self._serve(current.cert, current.key)
            raise
        published = None if configuration is None else published_bundle(configuration)
        bundle = await self._current_bundle(published)
        await self._serve(bundle.cert, bundle.key)
        if configuration is not None:
            await self._publish(configuration, bundle.trust)
        return bundle

    async def _current_bundle(self, published: bytes | None) -> Bundle:
        for _ in range(5):
            secret = await self._read_secret()
            current = bundle_from_secret(secret)
            plan = await asyncio.to_thread(
                renewal, current, self._target.policy, self._clock.now(), published
            )
            if plan is None:
                assert current is not None  # renewal() always replaces a missing bundle
                return current
            bundle, reason = plan
            if await self._write(secret, bundle):
                log.info(
                    "webhook certificate Secret %s/%s written (%s); serving certificate "
                    "valid until %s",
                    self._target.namespace,
                    self._target.secret,
                    reason,
                    not_after(bundle.cert).isoformat(),
                )
                return bundle
        raise ApiUnavailableError("the webhook certificate Secret kept changing under us")

    async def _read_secret(self) -> JSON | None:
        try:
            return await self._transport.get(self._secret_path)
        except ApiError as error:
            if error.not_found:
                return None
            raise

    async def _write(self, secret: JSON | None, bundle: Bundle) -> bool:
        """Create or replace the Secret; False if another replica got there first."""
        name = self._target.secret
        try:
            if secret is None:
                body = secret_body(name, bundle, labels=SECRET_LABELS)
                await self._transport.create(self._secrets, body)
            else:
                metadata = secret.get("metadata") or {}
                labels = {**(metadata.get("labels") or {}), **SECRET_LABELS}
                body = secret_body(name, bundle, metadata.get("resourceVersion", ""), labels)
                await self._transport.replace(self._secret_path, body)
        except ApiError as error:
            if error.conflict:  # 409: created or renewed by another replica; read theirs
                return False
            raise
        return True

    async def _configuration(self) -> JSON | None:
        if self._configuration_path is None:
            return None
        try:
            return await self._transport.get(self._configuration_path)
        except ApiError as error:
            if error.not_found:
                log.warning(
                    "MutatingWebhookConfiguration %s not found: no caBundle to keep",
                    self._target.configuration,
                )
                return None
            raise

    async def _publish(self, configuration: JSON, trust: bytes) -> None:
        operations = ca_bundle_patch(configuration, trust)
        if not operations or self._configuration_path is None:
            return
        try:
            await self._transport.json_patch(self._configuration_path, operations)
        except ApiError as error:
            if error.invalid or error.conflict:  # it moved since we read it: next pass
                log.info("caBundle not patched (the configuration moved); again next pass")
                return
            raise
        log.info(
            "caBundle of MutatingWebhookConfiguration %s set (%d webhook(s))",
            self._target.configuration,
            len(operations) - 1,
        )
