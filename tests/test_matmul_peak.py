"""The MFU denominator's probe grows its products only until one takes long enough, so that a dtype the hardware
lacks (bf16 on AVX2) costs a second at start rather than minutes of 2048^3 products."""

import torch

from kernels import matmul_peak


def probe_sizes(monkeypatch, min_product_s: float) -> list[int]:
    sizes: list[int] = []
    real_mm = torch.mm

    def recording_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        sizes.append(a.shape[0])
        return real_mm(a, b)

    monkeypatch.setattr(matmul_peak, "MIN_PRODUCT_S", min_product_s)
    monkeypatch.setattr(matmul_peak.torch, "mm", recording_mm)
    peak = matmul_peak.measure_matmul_peak(torch.float32, torch.device("cpu"))
    assert peak > 0
    return sizes


def test_a_product_that_takes_long_enough_stops_the_growth(monkeypatch):
    assert set(probe_sizes(monkeypatch, 0.0)) == {matmul_peak.SMALLEST}


def test_fast_products_grow_to_the_largest_size_and_no_further(monkeypatch):
    sizes = probe_sizes(monkeypatch, float("inf"))
    assert sizes[0] == matmul_peak.SMALLEST and max(sizes) == matmul_peak.LARGEST
    assert sizes[-3:] == [matmul_peak.LARGEST] * 3, "the best of three at the final size"
