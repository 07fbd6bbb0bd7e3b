"""The real server (``python -m server serve``) as a subprocess on a free 127.0.0.1 port, for tests; its engine
state is read from /metrics, as an operator would."""

import atexit
import os
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from server.bench.local_server import SERVER_PROGRAM, LocalServer

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 240.0
# Small and fast: float32 (bf16 matmuls are slow on most CPUs), a small KV pool, a short context.
FAST_ENGINE_ARGS = ("--dtype", "float32", "--kv-cache-memory", "256MiB", "--max-model-len", "1024")


def metric_samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a /metrics page, keyed by name and label set."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


class APIServer(LocalServer):
    """``program`` may be a test's own wrapper around ``server.__main__`` (see tests/serve_with_switches.py)."""

    def __init__(
        self,
        model_folder: Path,
        *extra_args: str,
        env: dict[str, str] | None = None,
        program: tuple[str, ...] = SERVER_PROGRAM,
        port: int | None = None,
    ) -> None:
        log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"vigil-api-test-{os.getpid()}-{time.monotonic_ns()}.log"
        # One torch thread: on a small shared machine, OpenMP threads that wait on each other behind other
        # processes make steps many times slower; one thread also leaves a core to the HTTP side and the tests.
        # The repo goes before any PYTHONPATH given, which stays: packages installed outside the venv (a GPU machine).
        python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": python_path, **(env or {})}
        if "VIGIL_API_KEYS" not in (env or {}):
            environment.pop("VIGIL_API_KEYS", None)
        args = ("--model", str(model_folder), "--served-model-name", "smollm", *FAST_ENGINE_ARGS, *extra_args)
        super().__init__(args, log_path, env=environment, program=program, port=port)

    def wait_ready(self, headers: dict[str, str] | None = None) -> "APIServer":
        return super().wait_ready(READY_TIMEOUT_S, headers)

    def engine_state(self, headers: dict[str, str] | None = None) -> dict[str, float]:
        """Requests in the engine, KV blocks free and in all, and engine steps run, from /metrics."""
        response = httpx.get(f"{self.base_url}/metrics", headers=headers, timeout=10)
        response.raise_for_status()
        samples = metric_samples(response.text)

        def value(name: str, **labels: str) -> float:
            return samples.get((name, frozenset({"model": "smollm", **labels}.items())), 0.0)

        free, used = value("vigil_kv_cache_blocks", state="free"), value("vigil_kv_cache_blocks", state="used")
        return {
            "num_unfinished": value("vigil_num_requests_running") + value("vigil_num_requests_waiting"),
            "num_free_blocks": free,
            "num_blocks": free + used,
            "num_steps": value("vigil_engine_step_duration_seconds_count"),
        }

    def wait_all_blocks_free(self, timeout: float = 10.0, headers: dict[str, str] | None = None) -> dict[str, float]:
        """Wait until no request is unfinished and every KV block is free; raises if that never happens.
        Returns how long that took, in ``seconds`` and in engine ``steps`` run meanwhile."""
        started = time.monotonic()
        first = state = self.engine_state(headers)
        while time.monotonic() - started < timeout:
            if state["num_unfinished"] == 0 and state["num_blocks"] and state["num_free_blocks"] == state["num_blocks"]:
                return {"seconds": time.monotonic() - started, "steps": state["num_steps"] - first["num_steps"]}
            time.sleep(0.02)
            state = self.engine_state(headers)
        raise AssertionError(f"KV blocks still in use after {timeout}s: {state}")


_shared: APIServer | None = None


def shared_server(model_folder: Path) -> APIServer:
    """One plain server (no keys) for every test module that does not need its own."""
    global _shared
    if _shared is None or _shared.process.poll() is not None:
        _shared = APIServer(model_folder).wait_ready()
        atexit.register(_shared.stop)
    return _shared
