"""A standby hands the reviews only the leader can answer to the leader.

The webhook's Service sends a review to any ready replica, but only the leader holds
the ledger a Reservation's outlook is read from: with two replicas, one create in
two would get none. So a replica that does not lead passes the review, as it came,
to the URL the leader wrote on its Lease (:data:`WEBHOOK_URL_ANNOTATION`), and
answers with the leader's answer. It is bounded: the whole forward gets
``timeout`` seconds (under the configuration's ``timeoutSeconds``), after which the
replica answers itself, without an outlook. A forwarded review carries
:data:`FORWARDED_HEADER`, and is never forwarded again: a deposed leader that still
gets one answers it itself, so two replicas can never bounce a review between them.

The leader is reached by its pod IP, which its certificate does not name; the
connection is verified against the webhook's own CA (the same Secret) and one of the
Service's names, which the leader's certificate does carry.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Callable
from typing import Any

import aiohttp

log = logging.getLogger(__name__)

FORWARDED_HEADER = "Headroom-Forwarded-By"
_MAX_ANSWER = 64 << 10


class ReviewForwarder:
    """Forwards a review body to the leader's webhook, within ``timeout`` seconds."""

    def __init__(
        self,
        leader_url: Callable[[], str | None],
        *,
        server_name: str,
        identity: str,
        timeout: float,
    ) -> None:
        """``leader_url()``: the leader's webhook URL as its Lease says, None while this
        replica leads (or no one does). ``server_name``: a name the leader's certificate
        carries (the Service's)."""
        self._leader_url, self._server_name = leader_url, server_name
        self._identity, self._timeout = identity, timeout
        self._context: ssl.SSLContext | None = None
        self._session: aiohttp.ClientSession | None = None

    def trust(self, ca_pem: bytes) -> None:
        """Verify the leader against these CAs (the bundle the API server trusts too)."""
        context = ssl.create_default_context(cadata=ca_pem.decode())
        context.check_hostname = True
        self._context = context

    def target(self) -> str | None:
        """Where a review would go now, or None (this replica leads, or cannot verify)."""
        return self._leader_url() if self._context is not None else None

    async def forward(self, url: str, path: str, body: bytes) -> dict[str, Any] | None:
        """The leader's AdmissionReview answer to ``body``, or None if it gave none in time."""
        if self._context is None:
            return None  # no CA yet to verify the leader against
        if self._session is None:
            # One pooled session on the webhook's loop: kept-alive connections to the leader.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout)
            )
        try:
            async with self._session.post(
                url.rstrip("/") + path,
                data=body,
                headers={"Content-Type": "application/json", FORWARDED_HEADER: self._identity},
                ssl=self._context,
                server_hostname=self._server_name,
            ) as response:
                if response.status != 200:
                    log.info(
                        "the leader at %s answered %d to a forwarded review", url, response.status
                    )
                    return None
                if (response.content_length or 0) > _MAX_ANSWER:
                    return None
                text = await response.read()
            answer = json.loads(text)
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            log.info("a review forwarded to the leader at %s got no answer: %s", url, error)
            return None
        return answer if isinstance(answer, dict) else None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
