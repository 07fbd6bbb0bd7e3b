"""The machine's matrix-multiply peak in a dtype, measured with ``torch.mm``: the denominator of MFU."""

import time

import torch

# The probe grows its square products from the smallest size until one takes this long (or it reaches the largest):
# a dtype the hardware lacks (bf16 on AVX2 CPUs, about 1 GFLOP/s a core) then costs a second at start, not minutes.
MIN_PRODUCT_S = 0.05
SMALLEST, LARGEST = 256, 2048


def measure_matmul_peak(dtype: torch.dtype, device: torch.device, repeats: int = 3) -> float:
    """FLOP/s of the best of ``repeats`` square products, after a warm-up, at the first size from SMALLEST that
    takes MIN_PRODUCT_S, or at LARGEST."""
    size = SMALLEST
    while True:
        a = torch.randn(size, size, device=device).to(dtype)
        b = torch.randn(size, size, device=device).to(dtype)
        torch.mm(a, b)
        if size >= LARGEST or _time_product(a, b) >= MIN_PRODUCT_S:
            break
        size *= 2
    best = min(_time_product(a, b) for _ in range(repeats))
    return 2 * size**3 / best


def _time_product(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.device.type == "cuda":
        torch.cuda.synchronize(a.device)
    started = time.perf_counter()
    torch.mm(a, b)
    if a.device.type == "cuda":
        torch.cuda.synchronize(a.device)
    return time.perf_counter() - started
