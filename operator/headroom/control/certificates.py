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

When the extender serves HTTPS, the same pass keeps the scheduler's client certificate
Secret (:mod:`headroom.objects.clientcerts`) issued by the current CA, with the same
create-or-409 and resourceVersion tie-breaks.

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
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import quote

from headroom.api.paths import resource_path
from headroom.kube.backoff import Backoff
from headroom.kube.clock import Clock
from headroom.kube.retry import retry_call
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
from headroom.objects.clientcerts import (
    ClientPair,
    client_from_secret,
    client_renewal,
    client_secret_body,
    restart_patch,
)

log = logging.getLogger(__name__)

#: Labels on the Secret, so that ``kubectl get secret -l`` finds what the operator made.
SECRET_LABELS = {"app.kubernetes.io/managed-by": "headroom-operator"}


@dataclass(frozen=True, slots=True)
class ClientCertificateTarget:
    """The Secret (beside the CA's) that holds a client certificate for ``name``, and the
    Deployment (beside it too) whose pods mount it and read its ``ca.crt`` at start."""

    secret: str
    name: str
    validity: timedelta
    deployment: str | None = None


@dataclass(frozen=True, slots=True)
class CertificateTarget:
    """Where the Secret lives and which configuration's caBundle to keep."""

    namespace: str
    secret: str
    configuration: str | None
    policy: CertificatePolicy
    client: ClientCertificateTarget | None = None


class CertificateKeeper:
    """Reads, creates and renews the Secret; hands each bundle read to ``serve``."""

    def __init__(
        self,
        transport: Transport,
        target: CertificateTarget,
        serve: Callable[[Bundle], Awaitable[None]],
        *,
        clock: Clock,
        period: float,
        rng: random.Random | None = None,
    ) -> None:
        self._transport, self._target, self._serve = transport, target, serve
        self._period, self._clock = period, clock
        self._backoff = Backoff(base=0.5, cap=period, rng=rng or random.Random())
        self._secrets = resource_path("", "v1", "secrets", target.namespace)
        self._secret_path = self._path(target.secret)
        self._missing_warned: bytes | None = None  # the ca.crt a missing Deployment was told
        # The pods' mutating webhook, and the Reservations' validating one (the outlook at
        # create) by the same name when the chart registers it: one CA for both.
        self._configuration_path: str | None = None
        self._validating_path: str | None = None
        if target.configuration is not None:
            self._configuration_path, self._validating_path = (
                resource_path(
                    "admissionregistration.k8s.io", "v1", kind, None, target.configuration
                )
                for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
            )

    async def run(self) -> None:
        """Forever: sync, then sleep a period (or back off after a failure)."""

        def unsynced(error: Exception) -> bool:
            # A bundle that cannot be issued from or loaded (a Secret edited by hand):
            # said, and tried again, never a crash.
            return isinstance(error, (ApiError, ApiUnavailableError, ValueError, ssl.SSLError))

        def failed(error: Exception, delay: float) -> None:
            log.warning("webhook certificate not synced (%s); again in %.1fs", error, delay)

        while True:
            await retry_call(self.sync, backoff=self._backoff, retry_on=unsynced, on_retry=failed)
            self._backoff.reset()
            await asyncio.sleep(self._period)

    async def sync(self) -> Bundle:
        """One pass: the Secret is current, its pair is served, its CAs are published."""
        try:
            configuration = await self._configuration()
        except (ApiError, ApiUnavailableError):
            # Serve what the Secret holds meanwhile; renewing waits for the configuration
            # (a CA rotation must know what the API server trusts).
            current = bundle_from_secret(await self._read(self._secret_path))
            if current is not None:
                await self._serve(current)
            raise
        published = None if configuration is None else published_bundle(configuration)
        bundle = await self._current_bundle(published)
        await self._serve(bundle)
        if configuration is not None:
            await self._publish(configuration, bundle.trust)
        await self._publish_validating(bundle.trust)
        if self._target.client is not None:
            pair = await self._current_client(bundle, self._target.client)
            if self._target.client.deployment is not None:
                await self._restart_on_new_trust(self._target.client.deployment, pair.trust)
        return bundle

    def _path(self, name: str) -> str:
        return f"{self._secrets}/{quote(name, safe='')}"

    async def _current_bundle(self, published: bytes | None) -> Bundle:
        for _ in range(5):
            secret = await self._read(self._secret_path)
            current = bundle_from_secret(secret)
            plan = await asyncio.to_thread(
                renewal, current, self._target.policy, self._clock.now(), published
            )
            if plan is None:
                assert current is not None  # renewal() always replaces a missing bundle
                return current
            bundle, reason = plan
            body = secret_body(self._target.secret, bundle)
            if await self._write(secret, body):
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

    async def _current_client(self, bundle: Bundle, client: ClientCertificateTarget) -> ClientPair:
        path = self._path(client.secret)
        for _ in range(5):
            secret = await self._read(path)
            current = client_from_secret(secret)
            plan = await asyncio.to_thread(
                client_renewal, current, bundle, client.name, self._clock.now(), client.validity
            )
            if plan is None:
                assert current is not None  # client_renewal() always replaces a missing pair
                return current
            if await self._write(secret, client_secret_body(client.secret, plan.pair)):
                where = f"{self._target.namespace}/{client.secret}"
                log.info(
                    "client certificate Secret %s written for %s (%s); valid until %s",
                    where,
                    client.name,
                    plan.reason,
                    not_after(plan.pair.cert).isoformat(),
                )
                if plan.new_ca and client.deployment is None:
                    log.warning(
                        "the CA was rotated: restart what mounts the Secret %s (the "
                        "headroom kube-scheduler reads its ca.crt only at start, and "
                        "cannot check the extender's certificate from the new CA until "
                        "then)",
                        where,
                    )
                return plan.pair
        raise ApiUnavailableError("the client certificate Secret kept changing under us")

    async def _restart_on_new_trust(self, name: str, trust: bytes) -> None:
        """Roll the Deployment whose pods read ``trust`` only at start, once per change
        (level-triggered: its pod template carries the digest of what they read). A
        failure is said and tried again next pass; the certificates are kept meanwhile."""
        namespace = self._target.namespace
        path = resource_path("apps", "v1", "deployments", namespace, name)
        try:
            deployment = await self._read(path)
            patch = None if deployment is None else restart_patch(deployment, trust)
            if patch is not None:
                await self._transport.merge_patch(path, patch)
        except (ApiError, ApiUnavailableError) as error:
            log.warning("Deployment %s/%s not restarted for its ca.crt: %s", namespace, name, error)
            return
        if deployment is None:
            if self._missing_warned != trust:  # once per ca.crt, not every pass
                self._missing_warned = trust
                log.warning(
                    "Deployment %s/%s (extenderSchedulerDeployment) not found: whatever "
                    "mounts the Secret %s must be restarted by hand when its ca.crt changes",
                    namespace,
                    name,
                    self._target.client.secret if self._target.client else "",
                )
            return
        self._missing_warned = None
        if patch is not None:
            log.warning(
                "the CAs the scheduler must trust changed: Deployment %s/%s restarted (its "
                "pods read ca.crt only at start)",
                namespace,
                name,
            )

    async def _read(self, path: str) -> JSON | None:
        try:
            return await self._transport.get(path)
        except ApiError as error:
            if error.not_found:
                return None
            raise

    async def _write(self, secret: JSON | None, body: JSON) -> bool:
        """Create ``body``, or replace ``secret`` with it (the resourceVersion read and
        our labels kept); False if another replica got there first."""
        metadata = body["metadata"]
        try:
            if secret is None:
                metadata["labels"] = SECRET_LABELS
                await self._transport.create(self._secrets, body)
            else:
                read = secret.get("metadata") or {}
                metadata["labels"] = {**(read.get("labels") or {}), **SECRET_LABELS}
                metadata["resourceVersion"] = read.get("resourceVersion", "")
                await self._transport.replace(self._path(metadata["name"]), body)
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

    async def _publish(
        self, configuration: JSON, trust: bytes, kind: str = "MutatingWebhookConfiguration"
    ) -> None:
        path = self._configuration_path if kind.startswith("Mutating") else self._validating_path
        operations = ca_bundle_patch(configuration, trust)
        if not operations or path is None:
            return
        try:
            await self._transport.json_patch(path, operations)
        except ApiError as error:
            if error.invalid or error.conflict:  # it moved since we read it: next pass
                log.info("caBundle not patched (the configuration moved); again next pass")
                return
            raise
        log.info(
            "caBundle of %s %s set (%d webhook(s))",
            kind,
            self._target.configuration,
            len(operations) - 1,
        )

    async def _publish_validating(self, trust: bytes) -> None:
        """The Reservations' ValidatingWebhookConfiguration gets the same caBundle; it is
        optional (the outlook at create may be off), so its absence is not a warning. The
        CA rotation follows the mutating one's bundle alone: a validating one that lags
        only costs creates their outlook (its failurePolicy is Ignore), never a create."""
        if self._validating_path is None:
            return
        try:
            validating = await self._transport.get(self._validating_path)
        except ApiError as error:
            if error.not_found:
                return
            raise
        await self._publish(validating, trust, "ValidatingWebhookConfiguration")
