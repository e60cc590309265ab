"""The bearer token from a file: read again after its period, or at once after a 401."""

from __future__ import annotations

from pathlib import Path

from headroom.kube.client import BearerToken, Credentials


async def test_a_token_file_is_read_again_after_its_period_or_a_401(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("first\n")
    credentials = Credentials("https://k", token="Bearer first", token_file=str(token_file))
    token = BearerToken(credentials, period=3600)
    assert await token.header() == "Bearer first"
    token_file.write_text("second\n")
    assert await token.header() == "Bearer first"  # within its period: not read
    token.unauthorized()
    assert await token.header() == "Bearer second"
    token_file.unlink()  # unreadable (a remount): the last good one
    token.unauthorized()
    assert await token.header() == "Bearer second"


async def test_a_token_given_as_is_never_changes() -> None:
    token = BearerToken(Credentials("https://k", token="Bearer fixed"), period=0)
    token.unauthorized()
    assert await token.header() == "Bearer fixed"
    assert await BearerToken(Credentials("https://k"), period=0).header() is None
