"""A request's grammar in llguidance's own format: shared by the server and its grammar-checking worker process,
so it imports nothing of the server's."""

import json

import llguidance
from llguidance.gbnf_to_lark import GbnfToLarkError, any_to_lark

# Compact JSON, one space after ',' and ':'. Free whitespace lets a small model emit newlines until max_tokens.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
UNREADABLE_GRAMMAR_ERRORS = (ValueError, GbnfToLarkError)


def llguidance_grammar(kind: str, source: str) -> str:
    """``source`` (a JSON schema, regex, JSON list of choices, or Lark or GBNF grammar) as llguidance's grammar;
    raises one of ``UNREADABLE_GRAMMAR_ERRORS`` for a source that cannot be read."""
    if kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(source, overrides=JSON_OPTIONS)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(source)
    if kind == "choice":
        choices = json.loads(source)
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))
    return llguidance.LLMatcher.grammar_from_lark(any_to_lark(source))


def compile_matcher(tokenizer: llguidance.LLTokenizer, kind: str, source: str) -> llguidance.LLMatcher | str:
    """The grammar's matcher with its first mask computed (which builds the lexer's first states), or the reason
    it cannot be compiled."""
    try:
        grammar = llguidance_grammar(kind, source)
    except UNREADABLE_GRAMMAR_ERRORS as error:
        return str(error)
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    if matcher.is_error():
        return matcher.get_error()
    matcher.compute_bitmask()
    return matcher
