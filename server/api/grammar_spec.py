"""Which grammar a request asks its output to follow: OpenAI's ``response_format``, vLLM's ``structured_outputs``
or its older ``guided_*`` fields. At most one may."""

import json
from dataclasses import dataclass
from typing import Any, Literal

from server.api import json_text
from server.api.errors import invalid_request
from server.api.protocol import SamplingRequest

GrammarKind = Literal["json_schema", "regex", "choice", "grammar"]


@dataclass(frozen=True)
class GrammarSpec:
    """``source`` is a JSON schema's text, a regex, the choices as a JSON list, or a Lark or GBNF grammar;
    ``param`` names the request field it came from, for errors."""

    kind: GrammarKind
    source: str
    param: str


ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}


def json_schema_spec(schema: dict[str, Any] | str, param: str) -> GrammarSpec:
    """A schema given as an object, or as JSON text (vLLM accepts both)."""
    if isinstance(schema, str):
        try:
            schema = json_text.loads(schema)
        except json.JSONDecodeError as error:
            raise invalid_request(f"{param} is not valid JSON: {error}", param=param) from None
        if not isinstance(schema, dict):
            raise invalid_request(f"{param} must be a JSON schema object", param=param)
    try:
        return GrammarSpec("json_schema", json.dumps(schema), param)
    except RecursionError:
        raise invalid_request(f"{param} is nested too deeply", param=param) from None


def requested_grammar(body: SamplingRequest) -> GrammarSpec | None:
    """The one grammar ``body`` asks for, or None; a second one is a 400 naming its field."""
    found: list[GrammarSpec] = []
    response_format = body.response_format
    if response_format is not None and response_format.type == "json_object":
        found.append(json_schema_spec(ANY_JSON_OBJECT, "response_format"))
    elif response_format is not None and response_format.type == "json_schema":
        found.append(json_schema_spec(response_format.json_schema.schema_, "response_format"))
    outputs = body.structured_outputs
    found += _guided(outputs.model_dump(by_alias=True) if outputs else {}, "structured_outputs")
    guided = {"json": body.guided_json, "regex": body.guided_regex, "choice": body.guided_choice,
              "grammar": body.guided_grammar}
    found += _guided(guided, None)
    if len(found) > 1:
        raise invalid_request(
            "only one of response_format, structured_outputs and the guided_* fields may constrain the output",
            param=found[1].param,
        )
    return found[0] if found else None


def _guided(fields: dict[str, Any], param: str | None) -> list[GrammarSpec]:
    """vLLM's fields by their short names; ``param`` names the enclosing field, else each is ``guided_<name>``."""
    specs: list[GrammarSpec] = []
    for name, value in fields.items():
        if value is None or value is False:
            continue
        where = param or f"guided_{name}"
        if name == "json":
            specs.append(json_schema_spec(value, where))
        elif name == "json_object":
            specs.append(json_schema_spec(ANY_JSON_OBJECT, where))
        elif name == "choice":
            specs.append(GrammarSpec("choice", json.dumps(value), where))
        else:
            specs.append(GrammarSpec("regex" if name == "regex" else "grammar", value, where))
    return specs
