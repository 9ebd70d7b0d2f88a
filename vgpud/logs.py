"""The log formats of every vgpud command (`run`, `webhook`): what a node's log collector parses.

`text` (the default) is the line format collectors already parse, and stays as it is. `json` is one
object per line for collectors that index fields: `time`, `level`, `logger`, `message`, the fields a
line is about (`FIELDS`, passed as `extra=fields(...)`), and `exception` with the traceback. The text
format leaves the fields out: its lines say the same things in their message.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"

#: the only structured fields a line may carry, in the order a JSON line shows them: the pod
#: (namespace/name, or its UID where that is all the line knows), the namespace, the container, the
#: claim (its UID or namespace/name, as the call site has it), the GPU (its UUID or index)
FIELDS = ("pod", "namespace", "container", "claim", "gpu")
_COMPACT = (",", ":")


def fields(
    *,
    pod: str | None = None,
    namespace: str | None = None,
    container: str | None = None,
    claim: str | None = None,
    gpu: str | int | None = None,
) -> dict[str, Any]:
    """The `extra=` of a log call: the fields given, empty ones left out. Keyword-only with one
    parameter per name in FIELDS, so a call site cannot invent a field."""
    given = {"pod": pod, "namespace": namespace, "container": container, "claim": claim, "gpu": gpu}
    return {name: value for name, value in given.items() if value is not None and value != ""}


def pod_fields(
    namespace: str, name: str, *, container: str | None = None, claim: str | None = None
) -> dict[str, Any]:
    """`fields` of a line about a pod (and one of its containers): `pod` as namespace/name."""
    pod = f"{namespace}/{name}" if namespace and name else name
    return fields(pod=pod, namespace=namespace, container=container, claim=claim)


class JsonFormatter(logging.Formatter):
    """One JSON object per record. It never raises: a value JSON cannot hold is written as its str(),
    and a record that cannot be formatted at all still gives a line saying so."""

    def format(self, record: logging.LogRecord) -> str:
        try:
            return json.dumps(self._document(record), ensure_ascii=False, separators=_COMPACT, default=_text)
        except Exception as err:  # a field JSON refuses (a dict with tuple keys, a cycle): say so
            return json.dumps(
                {
                    "time": _timestamp(record),
                    "level": str(record.levelname).lower(),
                    "logger": str(record.name),
                    "message": _text(record.msg),
                    "format_error": _text(err),
                },
                ensure_ascii=False,
                separators=_COMPACT,
            )

    def _document(self, record: logging.LogRecord) -> dict[str, Any]:
        try:
            message = record.getMessage()
        except Exception as err:  # arguments that do not fit the format string
            message = f"{_text(record.msg)} (arguments {_text(record.args)}: {_text(err)})"
        document: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None and value != "":
                document[name] = value
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            document["exception"] = record.exc_text
        return document


def _timestamp(record: logging.LogRecord) -> str:
    """RFC 3339 in UTC with milliseconds: 2026-12-06T14:03:07.123Z."""
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


def _text(value: object) -> str:
    """str(value), else its repr, else a stand-in naming its type: a log line must never fail."""
    try:
        return str(value)
    except Exception:
        try:
            return repr(value)
        except Exception:
            return f"<unprintable {type(value).__name__}>"


def configure_logging(level: str, log_format: str = "text") -> None:
    """Log to stderr at `level` in `log_format` (one of LOG_FORMATS, already validated)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])
