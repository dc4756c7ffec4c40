"""Logging of the long-running commands (``pyhami scheduler``, ``pyhami agent``): one line
per record on stderr, as text for people or as JSON for a log pipeline.

A JSON line is one object: ``time`` (RFC 3339, UTC, milliseconds), ``level``
(``DEBUG``..``CRITICAL``), ``logger`` (the module's name), ``message``, and
``exception`` (the traceback as text) when the record carries one.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", choices=LEVELS, default="info",
                        help="the least severe level logged (default: info)")
    parser.add_argument("--log-format", choices=FORMATS, default="text",
                        help="text, or json: one object per line with time, level, logger, "
                             "message and exception (default: text)")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False)


def configure_logging(args: argparse.Namespace, stream: TextIO | None = None) -> None:
    """Send every record at ``--log-level`` or above to ``stream`` (stderr) in ``--log-format``."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if args.log_format == "json"
                         else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
