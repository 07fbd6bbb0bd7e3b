"""The model's matrix products: fp16-stored weights compute fp32 products of the rounded weights, and a wide
layer computed in slices equals the whole."""

import torch
import torch.nn.functional as F

from server.models.linear import CHUNKED_OUTPUT_FEATURES, ChunkedLinear, DenseLinear, Fp16WeightLinear, make_linear


def test_fp16_weights_are_an_fp32_product_of_the_rounded_weights():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 64, generator=generator) * 0.1
    x = torch.randn(5, 64, generator=generator)
    layer = make_linear(weight, torch.float16)
    assert isinstance(layer, Fp16WeightLinear)
    expected = F.linear(x, weight.half().float())
    assert layer(x).dtype == torch.float32
    torch.testing.assert_close(layer(x), expected, rtol=1e-6, atol=1e-6)
    assert (layer(x) - F.linear(x, weight)).abs().max() > 0, "the weights were not rounded at all"


def test_wide_cpu_layers_are_sliced_and_equal_the_whole():
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(CHUNKED_OUTPUT_FEATURES + 3000, 32, generator=generator)
    x = torch.randn(3, 32, generator=generator)
    for weight_dtype, rounded in ((torch.float32, weight), (torch.float16, weight.half().float())):
        layer = make_linear(weight, weight_dtype)
        assert isinstance(layer, ChunkedLinear) and len(layer.parts) > 1
        torch.testing.assert_close(layer(x), F.linear(x, rounded), rtol=1e-6, atol=1e-5)
    assert isinstance(make_linear(weight[:CHUNKED_OUTPUT_FEATURES], torch.float32), DenseLinear)
