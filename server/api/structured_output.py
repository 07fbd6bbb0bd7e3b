"""Structured output through llguidance: a request's grammar compiled within bounds of size, shape, time and
memory, into one constraint per choice that the engine's sampler applies as a token bitmask at every step.

A grammar is first compiled in a worker process (``grammar_process.py``), where a crash or a runaway compile
costs only that process and that request's 400; only then does the server compile it for itself, on a thread
whose stack is many times the worker's. Compiles are shared fairly between tenants (``fair_slots.py``), and
compiled grammars are cached per tenant, as the prefix cache is.

The engine knows only its ``TokenConstraint`` shape (``server/engine/constraint.py``); llguidance stays here.
"""

import asyncio
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable

import llguidance

from server.api.errors import APIError, invalid_request
from server.api.fair_slots import FairSlots, TenantQueueFull
from server.api.grammar_process import CheckTimedOut, GrammarWorker, WorkerCrashed, WorkerTokenizer, WorkerUnavailable
from server.api.grammar_shape import shape_problem
from server.api.grammar_spec import GrammarSpec
from server.api.llguidance_grammar import compile_matcher
from server.engine.async_engine import AsyncEngine

# A grammar's source past this many characters is refused unread: compiling grows with it (a 700 kB JSON schema
# takes about a second here), and no sane schema comes near.
MAX_GRAMMAR_CHARS = 256 * 1024
COMPILE_TIMEOUT_S = 5.0
COMPILE_WORKERS = 2
MAX_WAITING_COMPILES_PER_TENANT = 16
WORKER_MEMORY_BYTES = 1 << 30
WORKER_STACK_BYTES = 16 << 20
# Compiling is deterministic, so a grammar that fit the worker's stack fits one eight times its size.
SERVER_STACK_BYTES = 8 * WORKER_STACK_BYTES
CACHED_GRAMMARS = 64
ERROR_CHARS = 400

_stack_size_lock = threading.Lock()


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
    """Compiles off the event loop and the engine loop: a grammar over ``MAX_GRAMMAR_CHARS``, of a refused shape,
    invalid, slower than ``timeout_s`` or fatal to the worker is a 400 naming its field; a tenant with
    ``MAX_WAITING_COMPILES_PER_TENANT`` compiles waiting gets a 429."""

    def __init__(
        self,
        engine: AsyncEngine,
        share_across_tenants: bool = False,
        timeout_s: float = COMPILE_TIMEOUT_S,
        workers: int = COMPILE_WORKERS,
        worker_memory_bytes: int = WORKER_MEMORY_BYTES,
    ) -> None:
        self._engine = engine
        self._share_across_tenants = share_across_tenants
        self.timeout_s = timeout_s
        self.worker_memory_bytes = worker_memory_bytes
        self._workers = [GrammarWorker(self._worker_tokenizer, worker_memory_bytes, WORKER_STACK_BYTES)
                         for _ in range(workers)]
        self._idle_workers: queue.SimpleQueue[GrammarWorker] = queue.SimpleQueue()
        for worker in self._workers:
            self._idle_workers.put(worker)
        self._slots = FairSlots(workers, per_tenant=max(1, workers // 2),
                                max_waiting_per_tenant=MAX_WAITING_COMPILES_PER_TENANT)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._tokenizer_lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, GrammarSpec], CompiledGrammar] = OrderedDict()

    async def compile(self, spec: GrammarSpec, tenant: str = "") -> CompiledGrammar:
        """Raises APIError 400 naming ``spec.param`` for a grammar that cannot be used, 429 for a tenant's full
        queue."""
        _check_before_compiling(spec)
        key = ("" if self._share_across_tenants else tenant, spec)
        compiled = self._cache.get(key)
        if compiled is not None:
            self._cache.move_to_end(key)
            return compiled
        try:
            await self._slots.acquire(tenant)
        except TenantQueueFull:
            raise APIError(429, f"{MAX_WAITING_COMPILES_PER_TENANT} of your grammars are already waiting to compile",
                           code="rate_limit_exceeded", retry_after=self.timeout_s) from None
        compiled = await self._compile_in_thread(spec, tenant)
        self._cache[key] = compiled
        if len(self._cache) > CACHED_GRAMMARS:
            self._cache.popitem(last=False)
        return compiled

    def shutdown(self) -> None:
        for worker in self._workers:
            worker.stop()

    async def _compile_in_thread(self, spec: GrammarSpec, tenant: str) -> CompiledGrammar:
        """The slot taken for ``tenant`` is given back when the thread ends, even if the caller has gone."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[CompiledGrammar] = loop.create_future()

        def finish(result: CompiledGrammar | None, error: BaseException | None) -> None:
            self._slots.release(tenant)
            if done.done():
                return
            if error is None:
                done.set_result(result)
            else:
                done.set_exception(error)

        def work() -> None:
            try:
                result, error = self._compile(spec), None
            except Exception as failure:  # noqa: BLE001 - handed to the waiting request as it is
                result, error = None, failure
            loop.call_soon_threadsafe(finish, result, error)

        _start_with_stack(work, SERVER_STACK_BYTES)
        return await asyncio.shield(done)

    def _compile(self, spec: GrammarSpec) -> CompiledGrammar:
        worker = self._idle_workers.get()
        try:
            error = worker.check(spec.kind, spec.source, self.timeout_s)
        except CheckTimedOut:
            raise invalid_request(f"{spec.param} took longer than {self.timeout_s:g} s to compile; simplify it",
                                  param=spec.param) from None
        except WorkerCrashed:
            raise invalid_request(
                f"{spec.param} could not be compiled: it crashed the grammar compiler or needed more than "
                f"{self.worker_memory_bytes >> 20} MiB; simplify it", param=spec.param) from None
        except WorkerUnavailable as failure:
            raise APIError(503, str(failure), code="grammar_worker_unavailable") from None
        finally:
            self._idle_workers.put(worker)
        if error is not None:
            raise invalid_request(f"invalid {spec.param}: {error}"[:ERROR_CHARS], param=spec.param)
        matcher = compile_matcher(self._llg_tokenizer(), spec.kind, spec.source)
        if isinstance(matcher, str):
            raise invalid_request(f"invalid {spec.param}: {matcher}"[:ERROR_CHARS], param=spec.param)
        return CompiledGrammar(matcher)

    def _worker_tokenizer(self) -> WorkerTokenizer:
        engine = self._engine
        return WorkerTokenizer(engine.tokenizer.to_json(), engine.vocab_size, list(engine.eos_token_ids))

    def _llg_tokenizer(self) -> llguidance.LLTokenizer:
        """Built on first use (about half a second), from the engine's own tokenizer, vocabulary and EOS."""
        with self._tokenizer_lock:
            if self._tokenizer is None:
                made = self._worker_tokenizer()
                self._tokenizer = llguidance.LLTokenizer(made.json, n_vocab=made.n_vocab, eos_token=made.eos)
            return self._tokenizer


def _check_before_compiling(spec: GrammarSpec) -> None:
    if len(spec.source) > MAX_GRAMMAR_CHARS:
        raise invalid_request(
            f"{spec.param} is {len(spec.source)} characters long; at most {MAX_GRAMMAR_CHARS} are allowed",
            param=spec.param,
        )
    problem = shape_problem(spec.kind, spec.source)
    if problem is not None:
        raise invalid_request(f"{spec.param} is refused before compiling: {problem}", param=spec.param)


def _start_with_stack(target: Callable[[], None], stack_bytes: int) -> None:
    with _stack_size_lock:
        previous = threading.stack_size(stack_bytes)
        try:
            threading.Thread(target=target, name="vigil-grammar", daemon=True).start()
        finally:
            threading.stack_size(previous)


async def compile_grammar(compiler: GrammarCompiler, spec: GrammarSpec | None, tenant: str) -> CompiledGrammar | None:
    return None if spec is None else await compiler.compile(spec, tenant)
