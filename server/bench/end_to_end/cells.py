"""The table's cells: which two servers each one weighs, and on which workload."""

from dataclasses import dataclass
from enum import Enum


class Workload(Enum):
    RANDOM = "random prompts, greedy"
    REPETITIVE = "repetitive prompts (bench spec's), greedy"
    RANDOM_TEXT = "random prompts, sampled at temperature 1.0"


class Peer(Enum):
    """The llama-server models; None for a Vigil server."""

    Q4_1 = "Q4_1"
    BF16 = "BF16"


# The flag that names each peer's GGUF file.
GGUF_FLAG = {Peer.Q4_1: "--q4-gguf", Peer.BF16: "--bf16-gguf"}


@dataclass(frozen=True)
class Server:
    """A Vigil server with these flags, or llama-server with a peer's GGUF."""

    name: str
    vigil_flags: tuple[str, ...] = ()
    peer: Peer | None = None


@dataclass(frozen=True)
class Cell:
    key: str  # what --cells names
    a: Server
    b: Server
    workload: Workload
    concurrency: int

    @property
    def title(self) -> str:
        return f"{self.a.name} ÷ {self.b.name}{WORKLOAD_SUFFIX[self.workload]}, c = {self.concurrency}"


WORKLOAD_SUFFIX = {Workload.RANDOM: "", Workload.REPETITIVE: ", repetitive",
                   Workload.RANDOM_TEXT: ", random text"}


def servers(speculative_config: str) -> dict[str, Server]:
    return {
        "default": Server("default"),
        "int8": Server("int8", ("--quantization", "int8")),
        "int4": Server("int4", ("--quantization", "int4")),
        "speculation": Server("speculation", ("--speculative-config", speculative_config)),
        "llama-q4": Server("llama-server Q4_1", peer=Peer.Q4_1),
        "llama-bf16": Server("llama-server BF16", peer=Peer.BF16),
    }


# key: A, B, workload; issue 37's table, in its order.
LAYOUT = (
    ("int8", "int8", "default", Workload.RANDOM),
    ("int4", "int4", "default", Workload.RANDOM),
    ("spec-repetitive", "speculation", "default", Workload.REPETITIVE),
    ("spec-random-text", "speculation", "default", Workload.RANDOM_TEXT),
    ("default-vs-llama-bf16", "default", "llama-bf16", Workload.RANDOM),
    ("int4-vs-llama-q4", "int4", "llama-q4", Workload.RANDOM),
    ("default-vs-llama-q4", "default", "llama-q4", Workload.RANDOM),
)
KEYS = tuple(key for key, *_ in LAYOUT)


def table_cells(keys: list[str], concurrencies: list[int], speculative_config: str) -> list[Cell]:
    """The named cells at every concurrency, one concurrency after another."""
    by_name = servers(speculative_config)
    return [Cell(key, by_name[a], by_name[b], workload, concurrency)
            for concurrency in concurrencies for key, a, b, workload in LAYOUT if key in keys]
