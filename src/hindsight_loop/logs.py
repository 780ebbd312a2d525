"""Hindsight's own log lines go through the same redaction as what it records.

A log line can carry recorded text: a refused event in a warning, a tool's exception message or
a traceback's locals-free text in ``log.exception``. The application owns the handlers, so the
redaction rides on Hindsight's loggers as a filter: it rewrites the message, the formatted
traceback and the stack before any handler formats them.
"""

from __future__ import annotations

import logging
import traceback

#: The loggers Hindsight writes to (children of ``hindsight_loop`` do not inherit a logger's
#: filters, so each one is named here).
LOGGERS = (
    "hindsight_loop",
    "hindsight_loop.llm.reflector",
    "hindsight_loop.mcp",
    "hindsight_loop.mcp.proxy",
)


class RedactSecrets(logging.Filter):
    """Redacts secret shapes in a record's message, traceback and stack (keeps every record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from hindsight_loop.record import redact_text

        try:
            message = record.getMessage()
        except Exception:  # a bad format string: the logging module reports it itself
            return True
        record.msg, record.args = redact_text(message), None
        if record.exc_info and not record.exc_text:
            # Formatters reuse a record's exc_text, so the redacted traceback is what they print.
            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info)
        return True


_FILTER = RedactSecrets()


def install() -> None:
    """Put the redacting filter on Hindsight's loggers (idempotent)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


__all__ = ["LOGGERS", "RedactSecrets", "install"]
