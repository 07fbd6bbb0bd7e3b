"""structlog JSON lines (console rendering on a TTY or on request), stdlib loggers routed through them."""

import logging
import sys

import structlog
from structlog.typing import EventDict, WrappedLogger

# Fields that stdlib loggers pass as ``extra`` for their own formatters: uvicorn's ANSI-coloured copy of its message.
FOREIGN_INTERNALS = ("color_message",)


def drop_foreign_internals(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    for key in FOREIGN_INTERNALS:
        event.pop(key, None)
    return event


def configure_logging(log_format: str = "auto", level: str = "INFO") -> None:
    """``log_format``: ``json``, ``console``, or ``auto`` (console on a TTY, JSON otherwise)."""
    if log_format == "auto":
        log_format = "console" if sys.stderr.isatty() else "json"
    renderer = (
        structlog.dev.ConsoleRenderer() if log_format == "console" else structlog.processors.JSONRenderer()
    )
    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder(), drop_foreign_internals],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
