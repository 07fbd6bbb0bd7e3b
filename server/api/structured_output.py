"""Structured output through llguidance: a request's grammar compiled off the event loop and the engine thread,
within bounds of size and time, into one constraint per choice that the engine's sampler applies as a token
bitmask at every step.

The engine knows only its ``TokenConstraint`` shape (``server/engine/constraint.py``); llguidance stays here.
"""

import asyncio
import json
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import llguidance
from llguidance.gbnf_to_lark import GbnfToLarkError, any_to_lark

from server.api.errors import invalid_request
from server.api.grammar_spec import GrammarSpec
from server.engine.async_engine import AsyncEngine

# A grammar's source past this many characters is refused unread: compiling grows with it (a 700 kB JSON schema
# takes about a second here), and no sane schema comes near.
MAX_GRAMMAR_CHARS = 256 * 1024
COMPILE_TIMEOUT_S = 5.0
COMPILE_THREADS = 2
CACHED_GRAMMARS = 64
ERROR_CHARS = 400
# Compact JSON, one space after ',' and ':'. Free whitespace lets a small model emit newlines until max_tokens.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def llguidance_grammar(spec: GrammarSpec) -> str:
    """The spec in llguidance's own grammar format; raises ValueError for a source that cannot be read."""
    if spec.kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(spec.source, overrides=JSON_OPTIONS)
    if spec.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.source)
    if spec.kind == "choice":
        choices = json.loads(spec.source)
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))
    return llguidance.LLMatcher.grammar_from_lark(any_to_lark(spec.source))


class GrammarConstraint:
    """One choice's place in its grammar: the engine's ``TokenConstraint``."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher

    def fill_bitmask(self, bitmask) -> None:  # noqa: ANN001 - a torch int32 row; torch is not imported here
        self._matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.numel() * bitmask.element_size())

    def accept_token(self, token_id: int) -> None:
        self._matcher.consume_token(token_id)  # a refused token puts the matcher in its error state: it stops

    def is_finished(self) -> bool:
        return self._matcher.is_stopped()


class CompiledGrammar:
    """A grammar ready to use, its first mask already computed; every choice gets its own copy."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher

    def new_constraint(self) -> GrammarConstraint:
        return GrammarConstraint(self._matcher.deep_copy())


class GrammarCompiler:
    """Compiles in its own threads (llguidance releases the GIL while it works), so that neither the event loop
    nor the engine loop waits; a grammar over ``MAX_GRAMMAR_CHARS`` or slower than ``timeout_s`` is a 400. Its
    work is bounded by llguidance's own limits too, so a thread given up on still ends. Compiled grammars are
    kept, most recently used first."""

    def __init__(self, engine: AsyncEngine, timeout_s: float = COMPILE_TIMEOUT_S) -> None:
        self._engine = engine
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="vigil-grammar")
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._tokenizer_lock = threading.Lock()
        self._cache: OrderedDict[GrammarSpec, CompiledGrammar] = OrderedDict()

    async def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Raises APIError 400 naming ``spec.param`` for a grammar that is too large, invalid or too slow."""
        if len(spec.source) > MAX_GRAMMAR_CHARS:
            raise invalid_request(
                f"{spec.param} is {len(spec.source)} characters long; at most {MAX_GRAMMAR_CHARS} are allowed",
                param=spec.param,
            )
        compiled = self._cache.get(spec)
        if compiled is not None:
            self._cache.move_to_end(spec)
            return compiled
        work = asyncio.wrap_future(self._pool.submit(self._compile, spec))
        try:
            compiled = await asyncio.wait_for(work, self.timeout_s)
        except TimeoutError:
            raise invalid_request(
                f"{spec.param} took longer than {self.timeout_s:g} s to compile; simplify it", param=spec.param
            ) from None
        self._cache[spec] = compiled
        if len(self._cache) > CACHED_GRAMMARS:
            self._cache.popitem(last=False)
        return compiled

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _compile(self, spec: GrammarSpec) -> CompiledGrammar:
        tokenizer = self._llg_tokenizer()
        try:
            grammar = llguidance_grammar(spec)
        except (ValueError, GbnfToLarkError) as error:
            raise invalid_request(f"invalid {spec.param}: {error}"[:ERROR_CHARS], param=spec.param) from None
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise invalid_request(f"invalid {spec.param}: {matcher.get_error()}"[:ERROR_CHARS], param=spec.param)
        matcher.compute_bitmask()  # builds the lexer's first states here, rather than in an engine step
        return CompiledGrammar(matcher)

    def _llg_tokenizer(self) -> llguidance.LLTokenizer:
        """Built on first use (about half a second), from the engine's own tokenizer, vocabulary and EOS."""
        with self._tokenizer_lock:
            if self._tokenizer is None:
                engine = self._engine
                self._tokenizer = llguidance.LLTokenizer(
                    engine.tokenizer.to_json(), n_vocab=engine.vocab_size, eos_token=list(engine.eos_token_ids)
                )
            return self._tokenizer


async def compile_grammar(compiler: GrammarCompiler, spec: GrammarSpec | None) -> CompiledGrammar | None:
    return None if spec is None else await compiler.compile(spec)
