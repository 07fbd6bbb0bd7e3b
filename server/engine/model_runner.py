"""Builds the paged batch for a step (positions, slots, block tables), runs the model as the execution plan says
(server/engine/execution_plan.py) and samples."""

from dataclasses import dataclass, field

import torch

from kernels.backend import AttentionBatch
from server.engine.decode_graphs import DecodeGraphs
from server.engine.execution_plan import ExecutionPlan
from server.engine.kv_pool import allocate_kv_caches
from server.engine.logprobs import gather_logprobs
from server.engine.request import TokenLogprob
from server.engine.sampler import Sampler
from server.engine.scheduler import ScheduledRequest, SchedulerOutput
from server.models.interface import Model
from server.models.one_call_decode import OneCallDecode

# Prompt logprobs need the whole vocabulary's logits at every prompt position: this many positions at a time.
PROMPT_LOGPROBS_ROWS = 256


@dataclass
class PromptLogprobs:
    """Logprobs of a request's prompt tokens ``first_position`` onwards, computed in this step."""

    first_position: int
    entries: list[TokenLogprob]


@dataclass
class ModelRunnerOutput:
    """Per scheduled request, in order: its new tokens (none if it is not up to date yet; one, or with
    speculative guesses the guesses kept and one more) and its token's logprobs (None unless asked); by request id,
    the prompt logprobs this step computed; and, per request that had guesses, how many it kept."""

    sampled: list[list[int]]
    logprobs: list[TokenLogprob | None]
    prompt_logprobs: dict[str, PromptLogprobs] = field(default_factory=dict)
    accepted_lengths: list[int] = field(default_factory=list)


class ModelRunner:
    def __init__(
        self,
        model: Model,
        plan: ExecutionPlan,
        one_call: OneCallDecode | None,
        num_blocks: int,
        block_size: int,
        max_blocks_per_seq: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        """``one_call``: the compiled layer loop, which runs every step's layers where ``plan`` takes it; decode
        steps are captured in CUDA graphs here where it says so."""
        self.model = model
        self.plan = plan
        self.one_call = one_call
        self.block_size = block_size
        self.device = device
        self.kv_caches = allocate_kv_caches(model.config, num_blocks, block_size, dtype, device)
        self.sampler = Sampler(model.layer_ops.greedy_tokens)
        self.decode_graphs = None
        if plan.decode_graph_sizes:
            self.decode_graphs = DecodeGraphs(model, self.kv_caches, plan.decode_graph_sizes, max_blocks_per_seq,
                                              block_size, device)

    def execute(self, output: SchedulerOutput) -> ModelRunnerOutput:
        """One forward pass; new tokens for each scheduled request that is now up to date."""
        input_ids, positions, batch, last_rows = self._prepare(output)
        hidden = self._forward(input_ids, positions, batch)
        scheduled = output.scheduled
        result = ModelRunnerOutput([[] for _ in scheduled], [None] * len(scheduled),
                                   self._prompt_logprobs(output, hidden))
        # One logits call and one sampler pass for the step: a request's last row, and with guesses the rows of its
        # last known token and of each guess (the target's next token after 0..k guesses).
        sampling = [i for i, s in enumerate(scheduled) if s.samples or s.spec_token_ids]
        if sampling:
            rows = [row for i in sampling
                    for row in range(last_rows[i] - len(scheduled[i].spec_token_ids), last_rows[i] + 1)]
            logits = self.model.compute_logits(_rows_of(hidden, rows))
            step = self.sampler.sample_step(logits, [scheduled[i].request for i in sampling],
                                            [list(scheduled[i].spec_token_ids) for i in sampling])
            for i, tokens, logprobs in zip(sampling, step.appended, step.logprobs, strict=True):
                result.sampled[i], result.logprobs[i] = tokens, logprobs
                if scheduled[i].spec_token_ids:
                    result.accepted_lengths.append(len(tokens) - 1)
        return result

    def _forward(self, input_ids: list[int], positions: list[int], batch: AttentionBatch) -> torch.Tensor:
        if self.decode_graphs is not None:
            hidden = self.decode_graphs.run(input_ids, positions, batch)
            if hidden is not None:
                return hidden
        device = self.device
        ids = torch.tensor(input_ids, dtype=torch.long, device=device)
        at = torch.tensor(positions, dtype=torch.long, device=device)
        meta = self.model.attention.prepare(batch)
        if self.one_call is not None:
            return self.one_call(ids, at, self.kv_caches, meta)
        return self.model.forward(ids, at, self.kv_caches, meta)

    def _prompt_logprobs(self, output: SchedulerOutput, hidden: torch.Tensor) -> dict[str, PromptLogprobs]:
        """For the requests that asked: each prompt token this step's rows predict (the row at position ``p``
        predicts the token at ``p + 1``), under the model's own distribution."""
        found: dict[str, PromptLogprobs] = {}
        row = 0
        for item in output.scheduled:
            num_top = item.request.sampling_params.prompt_logprobs
            positions = _predicted_prompt_positions(item)
            if num_top is not None and positions:
                first_row = row + positions[0] - 1 - item.start
                targets = [item.request.prompt_token_ids[p] for p in positions]
                found[item.request.request_id] = PromptLogprobs(
                    positions[0], self._gather(hidden, first_row, targets, num_top)
                )
            row += item.num_new_tokens
        return found

    def _gather(self, hidden: torch.Tensor, first_row: int, targets: list[int], num_top: int) -> list[TokenLogprob]:
        entries: list[TokenLogprob] = []
        for offset in range(0, len(targets), PROMPT_LOGPROBS_ROWS):
            chunk = targets[offset : offset + PROMPT_LOGPROBS_ROWS]
            start = first_row + offset
            logits = self.model.compute_logits(hidden[start : start + len(chunk)])
            token_ids = torch.tensor(chunk, dtype=torch.long, device=logits.device)
            entries += gather_logprobs(logits, token_ids, [num_top] * len(chunk))
        return entries

    def _prepare(self, output: SchedulerOutput) -> tuple[list[int], list[int], AttentionBatch, list[int]]:
        """Token ids, positions, the attention batch and each request's last row, built once for the whole
        step."""
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        last_rows: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefill_tables: list[list[int]] = []
        query_starts = [0]
        prefill_lens: list[int] = []
        block_size = self.block_size
        for item in output.scheduled:
            request, start = item.request, item.start
            end = start + item.num_new_tokens
            known = end - len(item.spec_token_ids)
            all_ids = request.all_token_ids if item.num_new_tokens > 1 else None
            for pos in range(start, end):
                if pos >= known:
                    input_ids.append(item.spec_token_ids[pos - known])
                else:
                    input_ids.append(all_ids[pos] if all_ids is not None else request.token_at(pos))
                positions.append(pos)
                slots.append(item.block_ids[pos // block_size] * block_size + pos % block_size)
            last_rows.append(len(input_ids) - 1)
            # The scheduler puts these first. A guess's row is a decode row over the keys up to its own, so that
            # verification runs the decode kernels (and the compiled loop) and sums as a plain decode step does.
            if item.feeds_one_token:
                decode_tables += [item.block_ids] * item.num_new_tokens
                decode_lens += range(start + 1, end + 1)
            else:
                prefill_tables.append(item.block_ids)
                query_starts.append(query_starts[-1] + item.num_new_tokens)
                prefill_lens.append(end)
        batch = AttentionBatch(slots, decode_tables, decode_lens, prefill_tables, query_starts, prefill_lens)
        return input_ids, positions, batch, last_rows


def _rows_of(hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """``hidden``'s rows (ascending): a view where they are consecutive, as every row of a decode step is, else a
    gathered copy."""
    if rows[-1] - rows[0] == len(rows) - 1:
        return hidden[rows[0] : rows[-1] + 1]
    return hidden[torch.tensor(rows, dtype=torch.long, device=hidden.device)]


def _predicted_prompt_positions(item: ScheduledRequest) -> list[int]:
    """The prompt positions (from 1) whose token this step's rows predict."""
    last = min(item.start + item.num_new_tokens, item.request.num_prompt_tokens - 1)
    return list(range(item.start + 1, last + 1))
