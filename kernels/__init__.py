"""Tensor kernels, knowing nothing of requests: paged attention, the KV store, a layer's elementwise ops and the
quantised and bf16 linear layers, each in up to three implementations with one signature. Triton for CUDA
tensors (``paged_attention``, ``cache_ops``, ``quantized_linear``); C++ for the CPU (``csrc/``, compiled at
install once per instruction-set variant, loaded by ``cpu``); torch (``reference``), the oracle of both and the
path wherever neither runs. ``backend`` picks the attention backend."""
