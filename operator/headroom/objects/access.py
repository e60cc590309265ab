"""Who may read /metrics: the TokenReview and SubjectAccessReview bodies, and a cache.

The metrics endpoint authenticates and authorizes a scrape the way the API server's
delegated authentication does (controller-runtime's
``filters.WithAuthenticationAndAuthorization``, Kueue): the bearer token is sent in
a TokenReview, and the user it names in a SubjectAccessReview for the non-resource
URL and verb asked for. Nothing is decided here about RBAC itself: the API server
answers, so a ClusterRole with ``nonResourceURLs: ["/metrics"]`` grants the scrape.

Answers are cached for a short while, so a Prometheus scraping every 15 s costs the
API server two calls a minute, not eight: refusals briefly (a binding just created
takes effect within seconds), grants for longer. The cache is keyed by a digest of
the token, never the token itself, and bounded in size: a flood of made-up tokens
evicts the oldest answers, it cannot grow memory.

Pure: no I/O; ``now`` (monotonic seconds) is always given.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

TOKEN_REVIEW = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEW = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


class AccessVerdict(IntEnum):
    """The HTTP status a scrape gets."""

    ALLOWED = 200
    UNAUTHENTICATED = 401
    FORBIDDEN = 403


@dataclass(frozen=True, slots=True)
class User:
    """Whom the API server says a token belongs to."""

    name: str
    uid: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...]


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None when absent or
    another scheme."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def token_review(token: str) -> dict[str, Any]:
    """The TokenReview that asks who ``token`` is (any audience the API server accepts)."""
    return {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": token},
    }


def reviewed_user(answer: Any) -> User | None:
    """The user a TokenReview's answer authenticated; None when it did not."""
    status = (answer or {}).get("status") if isinstance(answer, dict) else None
    if not isinstance(status, dict) or status.get("authenticated") is not True:
        return None
    user = status.get("user")
    if not isinstance(user, dict) or not isinstance(user.get("username"), str):
        return None
    groups = user.get("groups") or []
    extra = user.get("extra") or {}
    return User(
        name=user["username"],
        uid=str(user.get("uid") or ""),
        groups=tuple(str(g) for g in groups) if isinstance(groups, list) else (),
        extra=tuple(sorted((str(k), tuple(str(v) for v in values)) for k, values in extra.items()))
        if isinstance(extra, dict)
        else (),
    )


def access_review(user: User, path: str, verb: str) -> dict[str, Any]:
    """The SubjectAccessReview that asks whether ``user`` may ``verb`` the URL ``path``."""
    spec: dict[str, Any] = {
        "user": user.name,
        "groups": list(user.groups),
        "nonResourceAttributes": {"path": path, "verb": verb},
    }
    if user.uid:
        spec["uid"] = user.uid
    if user.extra:
        spec["extra"] = {key: list(values) for key, values in user.extra}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


def access_allowed(answer: Any) -> bool:
    """A SubjectAccessReview's answer allows (and does not deny)."""
    status = (answer or {}).get("status") if isinstance(answer, dict) else None
    if not isinstance(status, dict):
        return False
    return status.get("allowed") is True and status.get("denied") is not True


def digest(token: str) -> str:
    """What the cache keeps of a token."""
    return hashlib.sha256(token.encode()).hexdigest()


class VerdictCache:
    """Recent verdicts by token digest: grants for ``allowed_ttl`` seconds, refusals
    for ``refused_ttl``; at most ``size`` of them (the least recently used go first)."""

    def __init__(self, allowed_ttl: float = 60, refused_ttl: float = 10, size: int = 1024):
        if size < 1:
            raise ValueError("size must be at least 1")
        self.allowed_ttl, self.refused_ttl, self.size = allowed_ttl, refused_ttl, size
        self._entries: OrderedDict[str, tuple[AccessVerdict, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, now: float) -> AccessVerdict | None:
        """The cached verdict for ``key``, None when unknown or expired."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        verdict, expires = entry
        if now >= expires:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return verdict

    def put(self, key: str, verdict: AccessVerdict, now: float) -> None:
        ttl = self.allowed_ttl if verdict is AccessVerdict.ALLOWED else self.refused_ttl
        self._entries[key] = (verdict, now + ttl)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
