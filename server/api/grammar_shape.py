"""A grammar's shape, checked before anything compiles it: nesting depth, rule count, and the longest chain of
rules or ``$ref``s, the shapes that overflow a native compiler's stack (llguidance segfaults on a 3,000-rule Lark
chain or a 1,500-long ``$ref`` chain in an 8 MB stack). The limits sit far above any real grammar. Everything
here is iterative, so no input can exhaust Python's recursion either."""

import json
import re
from collections.abc import Iterable, Iterator

from llguidance.gbnf_to_lark import GbnfToLarkError, any_to_lark

MAX_NESTING = 128
MAX_RULES = 2000
MAX_CHAIN = 256

_STRING = re.compile(r'"(?:\\.|[^"\\\n])*"i?')
_REGEX = re.compile(r"/(?:\\.|[^/\\\n])+/[imslux]*")
_RULE_HEAD = re.compile(r"^\s*[?!]?([A-Za-z_]\w*)(?:\.-?\d+)?\s*:(?!:)")
_NAME = re.compile(r"[A-Za-z_]\w*")
_REF_TARGET = re.compile(r"^#/(?:\$defs|definitions)/([^/]+)$")


def shape_problem(kind: str, source: str) -> str | None:
    """Why ``source`` is refused before compiling, or None."""
    if kind in ("regex", "choice"):
        return _nesting_problem(source, "([{", ")]}")
    if kind == "json_schema":
        return _nesting_problem(source, "[{", "]}") or _schema_problem(json.loads(source))
    problem = _nesting_problem(source, "([{", ")]}")
    if problem:
        return problem
    try:
        lark = any_to_lark(source)
    except GbnfToLarkError:
        return None  # the compiler reports it
    return _lark_problem(lark)


def _nesting_problem(text: str, opening: str, closing: str) -> str | None:
    depth = deepest = 0
    quoted = escaped = False
    for char in text:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif quoted:
            continue
        elif char in opening:
            depth += 1
            deepest = max(deepest, depth)
        elif char in closing:
            depth -= 1
    if deepest > MAX_NESTING:
        return f"it nests {deepest} levels deep; at most {MAX_NESTING} are allowed"
    return None


def _lark_problem(lark: str) -> str | None:
    bodies: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lark.splitlines():
        head = _RULE_HEAD.match(line)
        if head:
            current = bodies.setdefault(head.group(1), [])
            current.append(line[head.end():])
        elif current is not None and line.strip().startswith("|"):
            current.append(line)
    if len(bodies) > MAX_RULES:
        return f"it has {len(bodies)} rules; at most {MAX_RULES} are allowed"
    uses = {name: {n for n in _NAME.findall(_REGEX.sub(" ", _STRING.sub(" ", " ".join(body)))) if n in bodies}
            for name, body in bodies.items()}
    return _chain_problem(uses, "rules")


def _schema_problem(schema: object) -> str | None:
    definitions: dict[str, object] = {}
    for holder in ("$defs", "definitions"):
        found = schema.get(holder) if isinstance(schema, dict) else None
        if isinstance(found, dict):
            definitions.update(found)
    if len(definitions) > MAX_RULES:
        return f"it has {len(definitions)} definitions; at most {MAX_RULES} are allowed"
    uses = {name: set(_refs(body)) & definitions.keys() for name, body in definitions.items()}
    return _chain_problem(uses, "$refs")


def _refs(node: object) -> Iterator[str]:
    stack = [node]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            target = node.get("$ref")
            if isinstance(target, str) and (match := _REF_TARGET.match(target)):
                yield match.group(1)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _chain_problem(uses: dict[str, set[str]], what: str) -> str | None:
    longest = _longest_chain(uses)
    if longest > MAX_CHAIN:
        return f"it chains {longest} {what}, one through the next; at most {MAX_CHAIN} are allowed"
    return None


def _longest_chain(uses: dict[str, set[str]]) -> int:
    """The most names on one path through ``uses``, a use that closes a cycle not counted again."""
    length: dict[str, int] = {}
    for root in uses:
        if root in length:
            continue
        on_path = {root}
        stack: list[tuple[str, Iterator[str]]] = [(root, iter(uses[root]))]
        while stack:
            name, pending = stack[-1]
            nxt = next((n for n in pending if n not in on_path), None)
            if nxt is None:
                length[name] = 1 + max(_known(length, uses[name]), default=0)
                on_path.discard(name)
                stack.pop()
            elif nxt not in length:
                on_path.add(nxt)
                stack.append((nxt, iter(uses[nxt])))
    return max(length.values(), default=0)


def _known(length: dict[str, int], names: Iterable[str]) -> Iterator[int]:
    return (length[n] for n in names if n in length)
