"""Who may scrape /metrics: the review bodies, the verdict cache, and the reviewer.

The API server's own answers are in tests/integration/test_metrics_auth.py (real
tokens, real RBAC); here a small stand-in answers, so the cache's timing (seconds
apart in production) is a clock moved by hand.
"""

from __future__ import annotations

from typing import Any

import pytest

from headroom.kube.transport import JSON, ApiError, ApiUnavailableError
from headroom.objects.access import (
    ACCESS_REVIEW,
    TOKEN_REVIEW,
    AccessVerdict,
    User,
    VerdictCache,
    access_allowed,
    access_review,
    bearer_token,
    digest,
    reviewed_user,
)
from headroom.serving.access import AccessReviewer, ReviewUnavailableError


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("", None),
        (None, None),
    ],
)
def test_the_bearer_token_of_a_header(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_a_token_review_answer_names_the_user_only_when_authenticated() -> None:
    answer = {
        "status": {
            "authenticated": True,
            "user": {
                "username": "system:serviceaccount:monitoring:prometheus",
                "uid": "u-1",
                "groups": ["system:serviceaccounts", "system:authenticated"],
                "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]},
            },
        }
    }
    user = reviewed_user(answer)
    assert user == User(
        "system:serviceaccount:monitoring:prometheus",
        "u-1",
        ("system:serviceaccounts", "system:authenticated"),
        (("authentication.kubernetes.io/pod-name", ("prometheus-0",)),),
    )
    assert reviewed_user({"status": {"authenticated": False}}) is None
    assert reviewed_user({"status": {"authenticated": True}}) is None  # no user
    assert reviewed_user({"status": {"error": "invalid bearer token"}}) is None
    assert reviewed_user(None) is None
    assert reviewed_user("garbage") is None


def test_the_access_review_asks_for_the_non_resource_url_as_the_user() -> None:
    user = User("alice", "u-1", ("ops",), (("scopes", ("a", "b")),))
    body = access_review(user, "/metrics", "get")
    assert body["kind"] == "SubjectAccessReview"
    assert body["spec"] == {
        "user": "alice",
        "uid": "u-1",
        "groups": ["ops"],
        "extra": {"scopes": ["a", "b"]},
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
    }
    assert "uid" not in access_review(User("bob", "", (), ()), "/metrics", "get")["spec"]


def test_access_is_allowed_only_when_allowed_and_not_denied() -> None:
    assert access_allowed({"status": {"allowed": True}})
    assert not access_allowed({"status": {"allowed": True, "denied": True}})
    assert not access_allowed({"status": {"allowed": False}})
    assert not access_allowed({"status": {}})
    assert not access_allowed({})


def test_the_cache_keeps_grants_longer_than_refusals() -> None:
    cache = VerdictCache(allowed_ttl=60, refused_ttl=10)
    cache.put("granted", AccessVerdict.ALLOWED, now=0)
    cache.put("refused", AccessVerdict.FORBIDDEN, now=0)
    cache.put("unknown", AccessVerdict.UNAUTHENTICATED, now=0)
    assert cache.get("granted", 9.9) is AccessVerdict.ALLOWED
    assert cache.get("refused", 9.9) is AccessVerdict.FORBIDDEN
    assert cache.get("unknown", 10) is None
    assert cache.get("refused", 10) is None
    assert cache.get("granted", 59.9) is AccessVerdict.ALLOWED
    assert cache.get("granted", 60) is None
    assert len(cache) == 0  # expired entries are dropped when met


def test_the_cache_is_bounded_and_evicts_the_least_recently_used() -> None:
    cache = VerdictCache(size=3)
    for key in "abc":
        cache.put(key, AccessVerdict.ALLOWED, now=0)
    assert cache.get("a", 1) is AccessVerdict.ALLOWED  # a is now the most recent
    cache.put("d", AccessVerdict.FORBIDDEN, now=1)
    assert len(cache) == 3
    assert cache.get("b", 1) is None
    assert [cache.get(k, 1) for k in "acd"] == [
        AccessVerdict.ALLOWED,
        AccessVerdict.ALLOWED,
        AccessVerdict.FORBIDDEN,
    ]
    for i in range(10_000):
        cache.put(str(i), AccessVerdict.UNAUTHENTICATED, now=2)
    assert len(cache) == 3
    with pytest.raises(ValueError, match="size"):
        VerdictCache(size=0)


def test_the_cache_key_is_not_the_token() -> None:
    assert "secret-token" not in digest("secret-token")
    assert digest("a") != digest("b")


class Clock:
    def __init__(self) -> None:
        self.seconds = 0.0

    def now(self) -> Any:
        raise AssertionError("the reviewer needs no wall clock")

    def monotonic(self) -> float:
        return self.seconds


class Reviews:
    """TokenReview and SubjectAccessReview as the API server answers them."""

    def __init__(self, users: dict[str, str], readers: set[str]) -> None:
        self.users, self.readers = users, readers
        self.calls: list[str] = []
        self.failure: Exception | None = None

    async def create(self, path: str, body: JSON) -> JSON:
        self.calls.append(path)
        if self.failure is not None:
            raise self.failure
        if path == TOKEN_REVIEW:
            name = self.users.get(body["spec"]["token"])
            if name is None:
                return {"status": {"authenticated": False, "error": "invalid bearer token"}}
            return {"status": {"authenticated": True, "user": {"username": name}}}
        assert path == ACCESS_REVIEW
        spec = body["spec"]
        assert spec["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
        return {"status": {"allowed": spec["user"] in self.readers}}


async def test_the_reviewer_answers_401_403_200_and_caches_each() -> None:
    api = Reviews({"t-prom": "prometheus", "t-other": "other"}, readers={"prometheus"})
    clock = Clock()
    reviewer = AccessReviewer(api, clock)  # type: ignore[arg-type]
    assert await reviewer.verdict(None, "/metrics") is AccessVerdict.UNAUTHENTICATED
    assert await reviewer.verdict("Basic x", "/metrics") is AccessVerdict.UNAUTHENTICATED
    assert api.calls == []  # no token: no call at all
    assert await reviewer.verdict("Bearer nobody", "/metrics") is AccessVerdict.UNAUTHENTICATED
    assert await reviewer.verdict("Bearer t-other", "/metrics") is AccessVerdict.FORBIDDEN
    assert await reviewer.verdict("Bearer t-prom", "/metrics") is AccessVerdict.ALLOWED
    assert api.calls == [TOKEN_REVIEW, TOKEN_REVIEW, ACCESS_REVIEW, TOKEN_REVIEW, ACCESS_REVIEW]
    api.calls.clear()
    clock.seconds = 9
    for _ in range(5):  # a scrape every few seconds: answered from the cache
        assert await reviewer.verdict("Bearer t-prom", "/metrics") is AccessVerdict.ALLOWED
        assert await reviewer.verdict("Bearer t-other", "/metrics") is AccessVerdict.FORBIDDEN
    assert api.calls == []
    api.readers.add("other")  # a binding made: the refusal expires within 10 s
    clock.seconds = 10
    assert await reviewer.verdict("Bearer t-other", "/metrics") is AccessVerdict.ALLOWED
    assert api.calls == [TOKEN_REVIEW, ACCESS_REVIEW]
    api.readers.clear()  # a binding removed: a grant lasts at most a minute
    clock.seconds = 59
    assert await reviewer.verdict("Bearer t-prom", "/metrics") is AccessVerdict.ALLOWED
    clock.seconds = 60
    assert await reviewer.verdict("Bearer t-prom", "/metrics") is AccessVerdict.FORBIDDEN


@pytest.mark.parametrize(
    "failure",
    [ApiUnavailableError("connection refused"), ApiError(403, "Forbidden", "no tokenreviews")],
)
async def test_an_unanswered_review_is_unavailable_and_not_cached(failure: Exception) -> None:
    api = Reviews({"t-prom": "prometheus"}, readers={"prometheus"})
    reviewer = AccessReviewer(api, Clock())  # type: ignore[arg-type]
    api.failure = failure
    with pytest.raises(ReviewUnavailableError):
        await reviewer.verdict("Bearer t-prom", "/metrics")
    assert len(reviewer.cache) == 0
    api.failure = None
    assert await reviewer.verdict("Bearer t-prom", "/metrics") is AccessVerdict.ALLOWED
