"""CPU tensors on 2 MB pages, for what the kernels read in bulk every step: the KV caches and the weights.

Decode attention reads blocks spread over a pool of gigabytes, and on 4 KB pages nearly every block misses the TLB;
under a hypervisor each miss walks two page tables. On the AMX Xeon (KVM), decode attention over a 2 GB cache with
its blocks in random order took 0.84-0.86x the time on 2 MB pages, and an engine's decode steps at 64 streams
0.93-0.96x (0.97-0.98x on a fresh pool, whose blocks lie mostly in order). Linux gives these pages to a private
anonymous mapping marked MADV_HUGEPAGE when transparent huge pages are in ``madvise`` or ``always`` mode; elsewhere
the same tensors land on 4 KB pages."""

import contextlib
import mmap
import threading
from collections.abc import Sequence

import torch

HUGE_PAGE_BYTES = 2 << 20
_ALIGNMENT = 64  # bytes between tensors that share a mapping start on a cache line


def _mapping(nbytes: int) -> torch.Tensor:
    """Zeroed bytes that start on a 2 MB boundary, backed by 2 MB pages where the OS gives them; the tensor keeps
    the mapping alive."""
    # Whole 2 MB pages past the first boundary, wherever the mapping starts: a page the mapping only partly covers
    # is never a huge one.
    pages = -(-nbytes // HUGE_PAGE_BYTES)
    memory = mmap.mmap(-1, (pages + 1) * HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        with contextlib.suppress(OSError):  # transparent huge pages turned off: 4 KB pages
            memory.madvise(advice)
    raw = torch.frombuffer(memory, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE_BYTES
    # Written now, so that the pages are taken at load and not at a step's first touch.
    return raw[start : start + nbytes].zero_()


def zeros(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A zero-filled CPU tensor on 2 MB pages where the OS gives them."""
    nbytes = dtype.itemsize * int(torch.Size(shape).numel())
    return _mapping(max(nbytes, 1))[:nbytes].view(dtype).view(shape)


def zeros_on(device: torch.device, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """``torch.zeros``, on 2 MB pages where the device is the CPU: for the KV caches."""
    return zeros(shape, dtype) if device.type == "cpu" else torch.zeros(shape, dtype=dtype, device=device)


class _Arena:
    """Copies of tensors, side by side in mappings of at least ``chunk_bytes``: a layer's weights are too small to
    fill a 2 MB page each. A mapping is freed when the last tensor in it is."""

    def __init__(self, chunk_bytes: int) -> None:
        self.chunk_bytes = chunk_bytes
        self.lock = threading.Lock()  # engines of a multi-model server load on threads of their own
        self.free = torch.empty(0, dtype=torch.uint8)

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        nbytes = -(-tensor.nbytes // _ALIGNMENT) * _ALIGNMENT
        with self.lock:
            if nbytes > self.free.numel():
                self.free = _mapping(max(nbytes, self.chunk_bytes))
            place, self.free = self.free[: tensor.nbytes], self.free[nbytes:]
        return place.view(tensor.dtype).view(tensor.shape).copy_(tensor)


_weights = _Arena(64 << 20)


def copy(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of a CPU tensor on 2 MB pages where the OS gives them, for weights read every step."""
    return _weights.copy(tensor)
