"""--gpu-memory-utilization is each engine's own share of the device, weights and KV pool together: what else the
device holds (another engine in the process, another process) does not shrink it, and a share that was not free
as the engine started is refused with a message. Sized with the arithmetic's own inputs, since no GPU runs here."""

import pytest

from server.engine.kv_pool import gpu_kv_budget

GIB = 2**30
TOTAL = 140 * GIB


def test_the_pool_is_the_share_less_the_engines_own_weights():
    # 1 GiB in use before (the CUDA context), 2 GiB of weights loaded since.
    assert gpu_kv_budget(TOTAL, TOTAL - 3 * GIB, 1 * GIB, 0.5) == 70 * GIB - 2 * GIB


def test_a_second_engine_in_the_process_gets_its_own_share():
    share = 0.15
    first_weights = second_weights = 1 * GIB
    first = gpu_kv_budget(TOTAL, TOTAL - first_weights, 0, share)
    in_use = first_weights + first  # the first engine's weights and its pool, allocated
    second = gpu_kv_budget(TOTAL, TOTAL - in_use - second_weights, in_use, share)
    assert second == first == int(TOTAL * share) - first_weights


def test_a_share_larger_than_what_was_free_is_refused():
    with pytest.raises(ValueError, match=r"asks for 126.0 GiB of the GPU, but only 40.0 of its 140.0 GiB were free"):
        gpu_kv_budget(TOTAL, 39 * GIB, 100 * GIB, 0.9)
