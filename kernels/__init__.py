"""Paged-attention kernels: Triton for CUDA, torch for everything else (and as the oracle)."""
