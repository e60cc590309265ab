"""JSON log lines: one object per line, the reservation's fields when a line is about one."""

from __future__ import annotations

import json
import logging

from headroom.logs import JsonFormatter, about


def line(message: str, *args: object, **kwargs: object) -> dict[str, object]:
    logger = logging.getLogger("headroom.test")
    record = logger.makeRecord(logger.name, logging.WARNING, __file__, 1, message, args, None)
    for key, value in kwargs.items():
        setattr(record, key, value)
    parsed = json.loads(JsonFormatter().format(record))
    assert isinstance(parsed, dict)
    return parsed


def test_a_line_about_a_reservation_carries_its_fields() -> None:
    parsed = line("%s: status not confirmed", "ml/r", **about("ml", "r", "u-1", "gpu-3"))
    assert parsed["message"] == "ml/r: status not confirmed"
    assert (parsed["level"], parsed["logger"]) == ("WARNING", "headroom.test")
    assert {k: parsed[k] for k in ("namespace", "name", "uid", "node")} == {
        "namespace": "ml",
        "name": "r",
        "uid": "u-1",
        "node": "gpu-3",
    }
    assert str(parsed["time"]).endswith("+00:00")


def test_fields_not_known_are_left_out_and_other_lines_have_none() -> None:
    assert "node" not in line("x", **about("ml", "r"))
    assert not {"namespace", "name", "uid", "node"} & line("plain").keys()


def test_an_exception_and_any_text_stay_one_json_line() -> None:
    try:
        raise ValueError('bad "value"\nsecond line \udcff')
    except ValueError:
        import sys

        logger = logging.getLogger("headroom.test")
        record = logger.makeRecord(
            logger.name, logging.ERROR, __file__, 1, "failed: %s", ("ü\n",), sys.exc_info()
        )
    text = JsonFormatter().format(record)
    assert "\n" not in text
    parsed = json.loads(text)
    assert parsed["message"] == "failed: ü\n"
    assert "ValueError" in parsed["exception"]
