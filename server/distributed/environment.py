"""torchrun's environment (torch.distributed's env:// contract), read without importing torch."""

from collections.abc import Mapping

RENDEZVOUS_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launched_rank(environ: Mapping[str, str]) -> int | None:
    """This process's rank where a launcher such as torchrun started it (RANK, WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT set), else None."""
    if not all(name in environ for name in RENDEZVOUS_ENV):
        return None
    return int(environ["RANK"])
