"""Builders shared by the engine tests that need no model."""

from server.engine.block_manager import BlockManager
from server.engine.request import Request, SamplingParams
from server.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput


def make_request(request_id: str, prompt_len: int, max_tokens: int = 8, first_token: int = 100) -> Request:
    return Request(
        request_id=request_id,
        prompt_token_ids=list(range(first_token, first_token + prompt_len)),
        sampling_params=SamplingParams(temperature=0.0, max_tokens=max_tokens),
        max_tokens=max_tokens,
        eos_token_ids=(2,),
    )


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 32,
    max_queue_len: int = 100,
    prefix_caching: bool = True,
) -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_num_seqs, max_num_batched_tokens, max_queue_len),
        BlockManager(num_blocks, block_size, prefix_caching),
    )


def fake_model_output(output: SchedulerOutput, token: int = 7) -> list[list[int]]:
    """What a model would return: one token for each request brought up to date, none for partial chunks."""
    return [[token] if item.samples else [] for item in output.scheduled]


def run_to_completion(scheduler: Scheduler, max_steps: int = 10_000) -> list[SchedulerOutput]:
    outputs = []
    for _ in range(max_steps):
        if not scheduler.has_unfinished:
            return outputs
        output = scheduler.schedule()
        scheduler.update_from_output(output, fake_model_output(output))
        outputs.append(output)
    raise AssertionError("the scheduler did not finish")
