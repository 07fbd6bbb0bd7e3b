"""JSON text from outside (a request's fields, a model's output) parsed as ``json.loads`` would, except that text
nested too deeply for Python's recursive parser is a ``json.JSONDecodeError`` like any other malformed JSON,
never a RecursionError that would end the request in a 500."""

import json
from typing import Any


def loads(text: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text, 0) from None
