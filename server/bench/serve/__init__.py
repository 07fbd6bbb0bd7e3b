"""``bench serve``: a streaming load test of any OpenAI-compatible server (Vigil, vLLM, llama.cpp), optionally
beside a second one on the same workload."""
