"""Authenticate and authorize a scrape of /metrics through the API server.

A TokenReview says who the bearer token belongs to; a SubjectAccessReview says
whether that user may ``get`` the non-resource URL ``/metrics`` (see
:mod:`headroom.objects.access` for the bodies and the cache). Both calls go
through the operator's own async client, so a scrape never blocks the event loop
the decisions run on, and a cached verdict costs no call at all.

When the API server cannot be asked (no answer, or it refused the review itself,
e.g. the operator lacks the right to create reviews), the scrape gets 503 and
nothing is cached: the next scrape asks again.
"""

from __future__ import annotations

import logging

from headroom.kube.clock import Clock, SystemClock
from headroom.kube.transport import ApiError, ApiUnavailableError, Transport
from headroom.objects.access import (
    ACCESS_REVIEW,
    TOKEN_REVIEW,
    AccessVerdict,
    VerdictCache,
    access_allowed,
    access_review,
    bearer_token,
    digest,
    reviewed_user,
    token_review,
)

log = logging.getLogger(__name__)


class ReviewUnavailableError(Exception):
    """The API server could not review the token or the access: answer 503."""


class AccessReviewer:
    """Verdicts on ``Authorization`` headers, asked of the API server and cached."""

    def __init__(
        self, api: Transport, clock: Clock | None = None, cache: VerdictCache | None = None
    ) -> None:
        self._api, self._clock = api, clock or SystemClock()
        self.cache = cache or VerdictCache()
        self.reviews = 0  # API calls made (tests: the cache spares them)

    async def verdict(
        self, authorization: str | None, path: str, verb: str = "get"
    ) -> AccessVerdict:
        token = bearer_token(authorization)
        if token is None:
            return AccessVerdict.UNAUTHENTICATED
        key = f"{digest(token)} {verb} {path}"
        cached = self.cache.get(key, self._clock.monotonic())
        if cached is not None:
            return cached
        verdict = await self._review(token, path, verb)
        self.cache.put(key, verdict, self._clock.monotonic())
        return verdict

    async def _review(self, token: str, path: str, verb: str) -> AccessVerdict:
        try:
            self.reviews += 1
            user = reviewed_user(await self._api.create(TOKEN_REVIEW, token_review(token)))
            if user is None:
                return AccessVerdict.UNAUTHENTICATED
            self.reviews += 1
            answer = await self._api.create(ACCESS_REVIEW, access_review(user, path, verb))
        except (ApiError, ApiUnavailableError) as error:
            log.warning("cannot review a scrape of %s: %s", path, error)
            raise ReviewUnavailableError(str(error)) from error
        if access_allowed(answer):
            return AccessVerdict.ALLOWED
        log.info("scrape of %s refused: %s may not %s it", path, user.name, verb)
        return AccessVerdict.FORBIDDEN
