"""Statuses in a log are read where statuses are written (``headroom_dev.logtext``)."""

from __future__ import annotations

import re

from headroom_dev.logtext import http_statuses

# The line a fresh-clone run failed on (issue 29): ``\b403\b`` found its milliseconds.
FAILED_ON = "2026-12-05 21:35:23,403 INFO headroom.control.certificates: caBundle published"


def test_a_status_is_read_where_a_status_is_written() -> None:
    assert http_statuses("patch failed: 403 Forbidden: secrets is forbidden") == {403}
    assert http_statuses("ApiException: (404)\nReason: Not Found") == {404}
    assert http_statuses("answered with status 409, HTTP 503 and code=429") == {409, 503, 429}
    assert http_statuses("cannot review a scrape of /metrics: 401") == {401}


def test_digits_in_times_ports_and_amounts_are_not_statuses() -> None:
    assert re.search(r"\b403\b", FAILED_ON)  # what the old assertion matched
    log = "\n".join(
        [
            FAILED_ON,
            "2026-12-05 21:35:23,403 INFO headroom.control: 403 reservations decided",
            '{"time": "2026-12-05T21:35:23.403+00:00", "message": "listening"}',
            "serving on 127.0.0.1:44039 and 10.0.0.403:8443",
            "again in 0.403s; held 403 MiB",
            "certificate renewed at 21:35:23.500",
        ]
    )
    assert http_statuses(log) == set()
