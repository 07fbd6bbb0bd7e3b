"""The machine's matrix-multiply peak in a dtype, measured with ``torch.mm``: the denominator of MFU."""

import time

import torch


def measure_matmul_peak(dtype: torch.dtype, device: torch.device, size: int = 2048, repeats: int = 3) -> float:
    """FLOP/s of the best of ``repeats`` square products of ``size``, after one warm-up."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best
