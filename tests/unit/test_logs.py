"""The log formats: the JSON formatter's lines (fields, exceptions, values JSON cannot hold, unicode,
records that cannot be formatted), the one table of field names, and the text format kept as it was."""

from __future__ import annotations

import inspect
import json
import logging
import re
import subprocess
import sys
from typing import Any

import pytest

from vgpud.logs import FIELDS, JsonFormatter, fields, pod_fields

RFC3339_MS_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def _record(
    msg: str = "hello %s",
    args: tuple[object, ...] = ("world",),
    level: int = logging.WARNING,
    extra: dict[str, object] | None = None,
    exc_info: Any = None,
) -> logging.LogRecord:
    """A record as `logger.log(level, msg, *args, extra=extra)` makes it."""
    logger = logging.getLogger("vgpud.test")
    return logger.makeRecord(logger.name, level, __file__, 1, msg, args, exc_info, extra=extra)


def _line(record: logging.LogRecord) -> dict[str, object]:
    line = JsonFormatter().format(record)
    assert "\n" not in line
    return json.loads(line)


def test_a_plain_line_has_time_level_logger_and_message_only() -> None:
    record = _record()
    record.created, record.msecs = 1796565787.123456, 123.456  # 2026-12-06T14:03:07.123Z
    assert _line(record) == {
        "time": "2026-12-06T14:03:07.123Z",
        "level": "warning",
        "logger": "vgpud.test",
        "message": "hello world",
    }


def test_the_time_is_rfc3339_utc_with_milliseconds() -> None:
    assert RFC3339_MS_UTC.match(str(_line(_record())["time"]))


@pytest.mark.parametrize(
    ("level", "name"),
    [
        (logging.DEBUG, "debug"),
        (logging.INFO, "info"),
        (logging.WARNING, "warning"),
        (logging.ERROR, "error"),
        (logging.CRITICAL, "critical"),
    ],
)
def test_levels_are_lower_case(level: int, name: str) -> None:
    assert _line(_record(level=level))["level"] == name


def test_fields_are_keys_of_the_line_and_empty_ones_are_left_out() -> None:
    extra = fields(pod="ns/p", namespace="ns", container="app", claim="uid-1", gpu="")
    line = _line(_record(extra=extra))
    assert {k: line[k] for k in ("pod", "namespace", "container", "claim")} == {
        "pod": "ns/p",
        "namespace": "ns",
        "container": "app",
        "claim": "uid-1",
    }
    assert "gpu" not in line
    assert _line(_record(extra=fields(gpu=0)))["gpu"] == 0  # index 0 is a GPU, not an empty value


def test_only_the_declared_fields_reach_the_line() -> None:
    """Another attribute on the record (a library's own `extra`) is not a field of the line."""
    line = _line(_record(extra={"peer": "10.0.0.1", "claim": "c"}))
    assert "peer" not in line and line["claim"] == "c"


def test_the_helper_takes_exactly_the_declared_fields() -> None:
    assert tuple(inspect.signature(fields).parameters) == FIELDS
    with pytest.raises(TypeError):
        fields(pods="ns/p")  # type: ignore[call-arg]


def test_pod_fields_name_the_pod_namespace_slash_name() -> None:
    assert pod_fields("ns", "p", container="app", claim="u") == {
        "pod": "ns/p",
        "namespace": "ns",
        "container": "app",
        "claim": "u",
    }
    assert pod_fields("", "p") == {"pod": "p"}


def test_an_exception_is_formatted_into_its_own_key() -> None:
    try:
        raise ValueError("bad thing")
    except ValueError:
        record = _record("failed", (), level=logging.ERROR, exc_info=sys.exc_info())
    line = _line(record)
    assert line["message"] == "failed"
    exception = str(line["exception"])
    assert exception.startswith("Traceback (most recent call last):")
    assert exception.endswith("ValueError: bad thing")


class _Opaque:
    def __str__(self) -> str:
        return "opaque-thing"


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_a_value_json_cannot_hold_is_written_as_its_str() -> None:
    line = _line(_record(extra={"claim": _Opaque(), "gpu": set()}))
    assert line["claim"] == "opaque-thing"
    assert line["gpu"] == "set()"


def test_a_value_that_cannot_even_be_printed_does_not_raise() -> None:
    line = _line(_record(extra={"claim": _Unprintable()}))
    assert line["claim"] == "<unprintable _Unprintable>"


def test_a_field_json_refuses_still_gives_a_line() -> None:
    """A dict with tuple keys: json refuses it whatever `default` does; the line says so."""
    line = _line(_record(extra={"pod": {("a", "b"): 1}}))
    assert line["message"] == "hello %s" and line["level"] == "warning"
    assert "format_error" in line


def test_arguments_that_do_not_fit_the_message_still_give_a_line() -> None:
    line = _line(_record("%d containers", ("many",)))
    assert str(line["message"]).startswith("%d containers (arguments ('many',)")


def test_unicode_is_kept_as_it_is() -> None:
    line = JsonFormatter().format(_record("pod %s", ("gpu-日本-ü",), extra=fields(container="café")))
    assert "gpu-日本-ü" in line and "café" in line
    assert json.loads(line)["message"] == "pod gpu-日本-ü"


def _configured(log_format: str) -> list[str]:
    """stderr of a fresh interpreter that configures logging as `vgpud run` does and logs a debug line
    and a warning with fields (a subprocess: pytest's own handlers sit on this one's root logger)."""
    program = (
        "import logging\n"
        "from vgpud.logs import configure_logging, fields\n"
        f"configure_logging('info', {log_format!r})\n"
        "log = logging.getLogger('vgpud.test')\n"
        "log.debug('not shown')\n"
        "log.warning('claim %s refused', 'ns/c', extra=fields(claim='ns/c', namespace='ns'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout == ""
    return done.stderr.splitlines()


def test_configure_logging_json_writes_one_object_per_line_on_stderr() -> None:
    (line,) = _configured("json")
    document = json.loads(line)
    assert (document["message"], document["claim"], document["namespace"]) == (
        "claim ns/c refused",
        "ns/c",
        "ns",
    )


def test_configure_logging_text_is_the_format_collectors_parse() -> None:
    """Text lines do not change: no fields appended, whatever the call passed."""
    (line,) = _configured("text")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING vgpud\.test: claim ns/c refused", line)
