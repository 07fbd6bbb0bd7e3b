"""Log lines carry the server's fields, never a library's internals: uvicorn's ``color_message`` (its ANSI
copy of each message) appears in neither format."""

import io
import json
import logging

import pytest

from telemetry.logging import configure_logging


@pytest.mark.parametrize("log_format", ["json", "console"])
def test_uvicorns_coloured_copy_of_a_message_is_dropped(log_format):
    stream = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers
    try:
        configure_logging(log_format)
        root.handlers[0].stream = stream
        logging.getLogger("uvicorn.error").info(
            "Started server process [%d]", 4242, extra={"color_message": "Started server process [\x1b[36m%d\x1b[0m]"}
        )
    finally:
        root.handlers = saved
    line = stream.getvalue()
    assert "Started server process [4242]" in line
    # The coloured copy would show as color_message='Started server process [\x1b[36m%d\x1b[0m]' (uninterpolated).
    assert "color_message" not in line and "%d" not in line
    if log_format == "json":
        assert json.loads(line)["event"] == "Started server process [4242]"
