"""CPU tensors on 2 MB pages (kernels/huge_pages.py): zeros and copies hold the right values in mappings marked
MADV_HUGEPAGE, small copies share one mapping, and an engine's KV caches and bf16 weights land there."""

import sys
import threading
from pathlib import Path

import pytest
import torch

from kernels import huge_pages
from server import LLM

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
needs_thp = pytest.mark.skipif(
    sys.platform != "linux" or not THP_MODE.exists() or "[never]" in THP_MODE.read_text(),
    reason="no transparent huge pages on this OS: the tensors stay on 4 KB pages",
)


def _mapping_of(tensor: torch.Tensor) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping that holds the tensor's first byte."""
    address = tensor.data_ptr()
    fields: dict[str, str] | None = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(part, 16) for part in head.split("-"))
            if fields is not None:
                break
            if start <= address < end:
                fields = {}
        elif fields is not None:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    assert fields is not None, "no mapping holds the tensor"
    return fields


def _on_huge_pages(tensor: torch.Tensor) -> bool:
    mapping = _mapping_of(tensor)
    return "hg" in mapping["VmFlags"].split() and mapping["THPeligible"] == "1"


@needs_thp
def test_zeros_are_zero_and_on_huge_pages():
    cache = huge_pages.zeros((300, 16, 3, 64), torch.bfloat16)
    assert cache.shape == (300, 16, 3, 64) and cache.dtype == torch.bfloat16 and cache.is_contiguous()
    assert not cache.any()
    assert cache.data_ptr() % huge_pages.HUGE_PAGE_BYTES == 0
    assert _on_huge_pages(cache)
    cache[7, 3] = 1.5
    assert cache.sum().item() == 1.5 * 3 * 64


@needs_thp
def test_every_size_gets_whole_huge_pages_wherever_its_mapping_lands():
    # Mappings land where the OS puts them; the tensor's aligned bytes must still cover whole 2 MB pages.
    kept = []
    for megabytes in (0.3, 1.0, 1.8, 1.95, 2.1, 3.9) * 4:
        tensor = huge_pages.zeros((int(megabytes * 2**20),), torch.uint8)
        kept.append(tensor)
        assert _on_huge_pages(tensor), f"{megabytes} MB"


def test_zeros_on_a_cpu_device_and_of_no_elements():
    assert huge_pages.zeros_on(torch.device("cpu"), (4, 5), torch.float32).equal(torch.zeros(4, 5))
    assert huge_pages.zeros((0, 3), torch.float16).shape == (0, 3)


@needs_thp
def test_copies_keep_values_and_share_a_mapping():
    sources = [torch.randn(576, 576).bfloat16(), torch.randn(3, 5).bfloat16(), torch.arange(7, dtype=torch.int32)]
    copies = [huge_pages.copy(source) for source in sources]
    for source, copy in zip(sources, copies, strict=True):
        assert copy.equal(source) and copy.is_contiguous() and copy.data_ptr() != source.data_ptr()
        assert copy.data_ptr() % 64 == 0 and _on_huge_pages(copy)
    # Side by side, each on the next cache line after the last.
    assert copies[1].data_ptr() == copies[0].data_ptr() + sources[0].nbytes
    assert copies[2].data_ptr() == copies[1].data_ptr() + 64
    copies[0].zero_()
    assert sources[0].any(), "a copy shares no memory with its source"


def test_copies_from_many_threads_do_not_overlap():
    copies: list[torch.Tensor] = []
    lock = threading.Lock()

    def copy_some(seed: int) -> None:
        made = [huge_pages.copy(torch.full((1000,), seed + i, dtype=torch.int64)) for i in range(50)]
        with lock:
            copies.extend(made)

    threads = [threading.Thread(target=copy_some, args=(1000 * t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    starts = sorted(c.data_ptr() for c in copies)
    assert all(b - a >= 8000 for a, b in zip(starts, starts[1:], strict=False))
    assert all(c.eq(c[0]).all() for c in copies) and len({c[0].item() for c in copies}) == 200


@needs_thp
def test_an_engine_keeps_its_kv_caches_and_bf16_weights_on_huge_pages(tiny_folder):
    engine = LLM(model=str(tiny_folder), dtype="bfloat16", kv_cache_memory=16 * 2**20).engine
    k_cache, v_cache = engine.runner.kv_caches[0]
    assert _on_huge_pages(k_cache) and _on_huge_pages(v_cache)
    qkv = engine.runner.model.layers[0].attention.qkv
    weight = qkv.packed if hasattr(qkv, "packed") else qkv.weight
    assert _on_huge_pages(weight)
