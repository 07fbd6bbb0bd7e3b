"""The engine on its own thread: requests go in through a queue, outputs come back to asyncio streams.

The thread may also build the engine first (the model loads there), so that a server answers its probes and
/metrics while it loads.

``LLMEngine`` is not thread-safe, so one background thread owns it: only that thread calls
``add_request``, ``abort_request`` and ``step`` (the last, and the loading, through a device thread that the
engines of one server share, where there is one; the owner waits for it). Callers on the event loop submit
commands through a thread-safe queue that the thread drains between steps, and blocks on when there is nothing to
run.
Each step's outputs go back to the event loop in one ``call_soon_threadsafe`` call.
"""

import asyncio
import contextlib
import gc
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TypeVar

from server.engine.constraint import TokenConstraint
from server.engine.engine import LLMEngine
from server.engine.request import Request, RequestOutput, SamplingParams
from server.engine.stats import EngineInfo
from server.models.tokenizer import Tokenizer

logger = logging.getLogger("vigil.engine")


ENGINE_STOPPED = "the engine loop was stopped"
T = TypeVar("T")


class EngineDeadError(RuntimeError):
    """The engine loop has failed or stopped; no request can run any more."""


class EngineStoppedError(EngineDeadError):
    """The engine loop was stopped on purpose (shutdown) while requests were still running."""


class EngineLoadingError(RuntimeError):
    """The engine is still being built (the model loads): nothing can run yet."""


@dataclass(frozen=True)
class EngineHealth:
    """A snapshot of the loop. Times are ``time.monotonic()`` values. While ``loading``, the pool is not sized yet
    and its counts are 0."""

    loading: bool
    alive: bool
    error: str | None
    last_step_at: float | None
    step_started_at: float | None
    num_steps: int
    num_unfinished: int
    num_free_blocks: int
    num_blocks: int
    num_running: int
    num_waiting: int
    max_num_seqs: int


class OutputStream:
    """The outputs of a group of engine requests (one HTTP request's choices), in arrival order; with
    ``final_only``, each request's last output alone (it holds the whole text, tokens and logprobs), as vLLM's
    ``RequestOutputKind.FINAL_ONLY`` does for an unstreamed answer.

    Iteration ends when every request of the group has finished. ``close()`` aborts those that have not.
    """

    def __init__(self, engine: "AsyncEngine", request_ids: list[str], final_only: bool = False) -> None:
        self._engine = engine
        self.final_only = final_only
        # A final-only stream's requests' output tokens so far, kept by the engine's thread, since their other
        # outputs never come: what a request aborted before its end has cost.
        self.num_generated: dict[str, int] = {}
        self._unfinished = set(request_ids)
        self._items: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

    def __aiter__(self) -> "OutputStream":
        return self

    async def __anext__(self) -> RequestOutput:
        if not self._unfinished:
            raise StopAsyncIteration
        item = await self._items.get()
        if isinstance(item, BaseException):
            self._unfinished.clear()
            raise item
        if item.finished:
            self._unfinished.discard(item.request_id)
        return item

    def close(self) -> None:
        if self._unfinished:
            self._engine.abort(sorted(self._unfinished))
            self._unfinished.clear()

    def _put(self, item: RequestOutput | BaseException) -> None:
        self._items.put_nowait(item)


@dataclass
class _Add:
    requests: list[Request]
    stream: OutputStream
    accepted: asyncio.Future


@dataclass
class _Abort:
    request_ids: list[str]


class _Stop:
    pass


class AsyncEngine:
    """Runs ``engine``, or a function that builds one: that runs first on the loop thread, and until it returns
    the engine is ``loading``. If it raises, the engine is dead and ``load_error`` says why.

    Engines of one server that share a ``device`` (a one-thread executor) load and step on its thread, one at a
    time: a step already spreads over every core (or the whole GPU), and on the CPU each thread that starts
    parallel work gets its own OpenMP pool, whose workers stop spinning once pooled threads outnumber the cores.
    With two served models each on its own thread, int4 decode took 6.5-8.1 against 2.6 ms a token (Zen 5)."""

    def __init__(self, engine: LLMEngine | Callable[[], LLMEngine], device: Executor | None = None) -> None:
        self._device = device
        self._engine = engine if isinstance(engine, LLMEngine) else None
        self._load = None if isinstance(engine, LLMEngine) else engine
        self.load_error: Exception | None = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, OutputStream] = {}  # owned by the loop thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._error: str | None = None
        self._stopped = False
        self._last_step_at: float | None = None
        self._num_steps = 0
        self._step_started_at: float | None = None
        self._ids = itertools.count()

    # --- read-only facts about the model, safe from any thread -------------------------------------------

    @property
    def loading(self) -> bool:
        return self._engine is None and self.load_error is None

    @property
    def info(self) -> EngineInfo:
        return self._built().info

    @property
    def tokenizer(self) -> Tokenizer:
        return self._built().tokenizer

    @property
    def max_model_len(self) -> int:
        return self._built().max_model_len

    @property
    def vocab_size(self) -> int:
        """The width of the model's logits (token ids lie below it)."""
        return self._built().vocab_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._built().eos_token_ids

    def make_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        cache_salt: str = "",
        constraint: TokenConstraint | None = None,
    ) -> Request:
        """Validate and tokenize (raises InvalidRequestError). Thread-safe: call it off the event loop."""
        return self._built().make_request(request_id, prompt, params, cache_salt=cache_salt, constraint=constraint)

    def check_prompt_length(self, text: str) -> None:
        """Raises InvalidRequestError for a text too long to fit the context, before any tokenizing."""
        self._built().check_prompt_length(text)

    def _built(self) -> LLMEngine:
        if self._engine is None:
            raise EngineDeadError("the engine failed to load") if self.load_error else EngineLoadingError()
        return self._engine

    # --- lifecycle ---------------------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="vigil-engine-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the loop to abort what is still running, end every stream with EngineStoppedError, and exit."""
        if self._thread is None or self._stopped:
            return
        self._stopped = True
        self._commands.put(_Stop())

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        """Whether the engine's thread is still alive: loading the model, or serving commands."""
        return self._thread is not None and self._thread.is_alive()

    # --- the event loop's side -----------------------------------------------------------------------------

    async def add(self, requests: list[Request], final_only: bool = False) -> OutputStream:
        """Queue all of ``requests`` or none; raises QueueFullError, EngineLoadingError or EngineDeadError.
        ``final_only``: the stream gets each request's last output alone, and the event loop is not woken for
        the others (at one stream, about 100 µs of its CPU a token, taken from the step on a busy host)."""
        if self.loading:
            raise EngineLoadingError()
        if self._stopped:
            raise EngineStoppedError(ENGINE_STOPPED)
        if self._error is not None or self._loop is None:
            raise EngineDeadError("engine error" if self._error else "the engine loop is not running")
        stream = OutputStream(self, [r.request_id for r in requests], final_only)
        accepted = self._loop.create_future()
        self._commands.put(_Add(requests, stream, accepted))
        try:
            await accepted
        except asyncio.CancelledError:
            self.abort([r.request_id for r in requests])
            raise
        return stream

    def abort(self, request_ids: list[str]) -> None:
        self._commands.put(_Abort(request_ids))

    def next_request_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    def health(self) -> EngineHealth:
        scheduler = self._engine.scheduler if self._engine is not None else None
        block_manager = scheduler.block_manager if scheduler is not None else None
        alive = self._thread is not None and self._thread.is_alive() and self._error is None
        return EngineHealth(
            loading=self.loading,
            alive=alive,
            error=self._error,
            last_step_at=self._last_step_at,
            step_started_at=self._step_started_at,
            num_steps=self._num_steps,
            num_unfinished=len(self._streams),
            num_free_blocks=block_manager.num_free_blocks if block_manager is not None else 0,
            num_blocks=block_manager.num_blocks if block_manager is not None else 0,
            num_running=len(scheduler.running) if scheduler is not None else 0,
            num_waiting=len(scheduler.waiting) if scheduler is not None else 0,
            max_num_seqs=scheduler.config.max_num_seqs if scheduler is not None else 0,
        )

    # --- the loop thread -------------------------------------------------------------------------------------

    def _run(self) -> None:
        if self._load is not None:
            try:
                self._engine = self._on_device(self._load)
            except Exception as error:  # a model that cannot load: the server says so in one line and exits
                logger.debug("the engine failed to load", exc_info=error)
                self.load_error = error
                self._error = f"{type(error).__name__}: {error}"
        # What exists now (the model, torch, the app) lives as long as the server. Left in the collector's care,
        # each full collection walks all of it, some 260K objects and 50-100 ms with the GIL held, during which
        # every stream stalls; frozen, a collection walks only what requests have made since.
        gc.freeze()
        while True:
            try:
                self._serve_commands()
                return
            except Exception as error:  # a bug outside step(): fail as loudly, and keep answering commands
                self._die(error)

    def _serve_commands(self) -> None:
        """Returns on _Stop."""
        while True:
            busy = self._error is None and self._engine.has_work()
            command = self._next_command(block=not busy)
            while command is not None:
                if isinstance(command, _Stop):
                    self._fail_all(EngineStoppedError(ENGINE_STOPPED))
                    return
                self._handle(command)
                command = self._next_command(block=False)
            if self._error is None and self._engine.has_work():
                self._step()

    def _next_command(self, block: bool) -> object | None:
        try:
            return self._commands.get(block=block)
        except queue.Empty:
            return None

    def _handle(self, command: object) -> None:
        if isinstance(command, _Add):
            self._add(command)
        elif isinstance(command, _Abort):
            for request_id in command.request_ids:
                if self._streams.pop(request_id, None) is not None:
                    self._engine.abort_request(request_id)

    def _add(self, command: _Add) -> None:
        if self._error is not None:
            self._call_soon(_settle, command.accepted, EngineDeadError("engine error"))
            return
        added: list[str] = []
        try:
            for request in command.requests:
                self._engine.add_request(request)
                added.append(request.request_id)
        except Exception as error:  # QueueFullError, or anything else: the group goes in whole or not at all
            for request_id in added:
                self._engine.abort_request(request_id)
            self._call_soon(_settle, command.accepted, error)
            return
        for request_id in added:
            self._streams[request_id] = command.stream
        self._call_soon(_settle, command.accepted, None)

    def _step(self) -> None:
        try:
            outputs = self._on_device(self._timed_step)
        except Exception as error:
            self._die(error)
            return
        self._last_step_at = time.monotonic()
        self._num_steps += 1
        deliveries = []
        for output in outputs:
            stream = self._streams.pop(output.request_id, None) if output.finished else self._streams.get(
                output.request_id
            )
            if stream is None:
                continue
            if output.finished or not stream.final_only:
                deliveries.append((stream, output))
            else:
                stream.num_generated[output.request_id] = len(output.outputs[0].token_ids)
        if deliveries:
            self._call_soon(_deliver, deliveries)

    def _timed_step(self) -> list[RequestOutput]:
        """A step, timed from its start on the device: not while it waits for another engine's."""
        self._step_started_at = time.monotonic()
        try:
            return self._engine.step()
        finally:
            self._step_started_at = None

    def _on_device(self, work: Callable[[], T]) -> T:
        """``work()`` on the shared device thread, or here when there is none."""
        return work() if self._device is None else self._device.submit(work).result()

    def _die(self, error: Exception) -> None:
        logger.error("the engine loop failed; the engine is now dead", exc_info=error)
        self._error = f"{type(error).__name__}: {error}"
        self._fail_all(EngineDeadError("engine error"))

    def _fail_all(self, error: EngineDeadError) -> None:
        streams = set(self._streams.values())
        self._streams.clear()
        if self._error is None:
            for request_id in list(self._engine.requests):
                self._engine.abort_request(request_id)
        if streams:
            self._call_soon(_deliver, [(stream, error) for stream in streams])

    def _call_soon(self, callback: Callable, *args: object) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the event loop has closed: nobody is left to tell
            self._loop.call_soon_threadsafe(callback, *args)


def _settle(future: asyncio.Future, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _deliver(deliveries: list[tuple[OutputStream, RequestOutput | BaseException]]) -> None:
    for stream, item in deliveries:
        stream._put(item)
