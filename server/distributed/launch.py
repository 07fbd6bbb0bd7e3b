"""Rank 0 brings up its workers: started as child processes (``python -m server.distributed.worker``), or already
started by torchrun; either way each connects back to rank 0 and says its rank."""

import contextlib
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta

import torch.distributed as dist

from server.distributed.channel import Channel, ChannelClosed
from server.distributed.environment import launched_rank
from server.distributed.group import START_TIMEOUT_S, STEP_TIMEOUT_S, open_store
from server.distributed.messages import Stop

COMMAND_ADDRESS_KEY = "vigil/command_address"
STOP_TIMEOUT_S = 10.0
_POLL_S = 0.5


class TensorParallelError(RuntimeError):
    """A tensor-parallel rank failed or died: the engine cannot step any more."""


class Workers:
    """Rank 0's side of ranks 1..N-1: a channel to each, and their processes where rank 0 started them."""

    def __init__(self, channels: list[Channel], processes: list[subprocess.Popen]) -> None:
        self.channels = channels
        self.processes = processes

    def send(self, message: object) -> None:
        for channel in self.channels:
            channel.send_message(message)

    def receive_numbers(self, timeout: float = STEP_TIMEOUT_S) -> list[float]:
        """One number from each worker, in rank order."""
        numbers = []
        for rank, channel in enumerate(self.channels, start=1):
            channel.sock.settimeout(timeout)
            try:
                numbers.append(channel.receive_number())
            except ChannelClosed:
                raise TensorParallelError(f"tensor-parallel rank {rank} {self._fate(rank)}") from None
            finally:
                channel.sock.settimeout(STEP_TIMEOUT_S)
        return numbers

    def check_alive(self) -> None:
        """Raises TensorParallelError where a started worker has exited."""
        for rank, process in enumerate(self.processes, start=1):
            if process.poll() is not None:
                raise TensorParallelError(f"tensor-parallel rank {rank} {self._fate(rank)}")

    def stop(self) -> None:
        """Tell every worker to stop where its line still works, then wait for the started processes, killing any
        that outlive ``STOP_TIMEOUT_S``."""
        for channel in self.channels:
            with contextlib.suppress(OSError):
                channel.send_message(Stop())
            channel.close()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in self.processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _fate(self, rank: int) -> str:
        process = self.processes[rank - 1] if self.processes else None
        code = process.poll() if process is not None else None
        return f"exited with status {code}" if code is not None else "closed its connection"


def launch_workers(size: int) -> tuple[dist.Store, Workers]:
    """The rendezvous store and a connected channel to every worker. Under torchrun (its environment set) the
    workers exist already; else rank 0 starts them on this machine."""
    launched = launched_rank(os.environ) is not None
    if launched and int(os.environ["WORLD_SIZE"]) != size:
        raise ValueError(f"--tensor-parallel-size {size} differs from torchrun's {os.environ['WORLD_SIZE']} processes")
    host = os.environ["MASTER_ADDR"] if launched else "127.0.0.1"
    listener = socket.create_server((host, 0), backlog=size)
    processes: list[subprocess.Popen] = []
    try:
        if launched:
            store = open_store(0, size)
        else:
            store = dist.TCPStore(host, 0, size, True, timeout=timedelta(seconds=START_TIMEOUT_S),
                                  wait_for_workers=False)
            processes = [_start_worker(rank, size, store.port) for rank in range(1, size)]
        store.set(COMMAND_ADDRESS_KEY, f"{host}:{listener.getsockname()[1]}")
        workers = Workers(_accept(listener, size, processes), processes)
    except BaseException:
        Workers([], processes).stop()
        raise
    finally:
        listener.close()
    return store, workers


def _start_worker(rank: int, size: int, store_port: int) -> subprocess.Popen:
    env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(size),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store_port)}
    return subprocess.Popen([sys.executable, "-m", "server.distributed.worker"], env=env, stdin=subprocess.DEVNULL)


def _accept(listener: socket.socket, size: int, processes: list[subprocess.Popen]) -> list[Channel]:
    """A channel per worker, in rank order; raises TensorParallelError if a started worker exits first, or when
    not all have connected within ``START_TIMEOUT_S``."""
    channels: dict[int, Channel] = {}
    listener.settimeout(_POLL_S)
    deadline = time.monotonic() + START_TIMEOUT_S
    while len(channels) < size - 1:
        Workers([], processes).check_alive()
        if time.monotonic() > deadline:
            raise TensorParallelError(f"only {len(channels)} of {size - 1} tensor-parallel workers connected")
        try:
            sock, _ = listener.accept()
        except TimeoutError:
            continue
        channel = Channel(sock, STEP_TIMEOUT_S)
        try:
            rank = int(channel.receive_number())
        except OSError:  # not one of ours: it closed or said nothing
            rank = 0
        if not 0 < rank < size or rank in channels:
            channel.close()
            continue
        channels[rank] = channel
    return [channels[rank] for rank in range(1, size)]
