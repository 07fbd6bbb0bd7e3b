"""Vigil: an observability-first paged-KV LLM inference server."""

from server.engine.request import RequestOutput, SamplingParams
from server.llm import LLM

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
