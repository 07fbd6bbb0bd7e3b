"""Scheduler behaviour with a real block manager and fake model outputs, in vLLM's style: no model."""

import pytest

from server.engine.request import QueueFullError, RequestStatus
from tests.engine_helpers import fake_model_output, make_request, make_scheduler, run_to_completion


def test_new_requests_are_prefilled_then_decoded_one_token_per_step():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", prompt_len=10, max_tokens=3))
    first = scheduler.schedule()
    assert [(s.request.request_id, s.num_new_tokens) for s in first.scheduled] == [("a", 10)]
    scheduler.update_from_output(first, fake_model_output(first))
    second = scheduler.schedule()
    assert [(s.num_new_tokens, s.is_decode) for s in second.scheduled] == [(1, True)]


def test_decodes_and_chunked_prefill_share_one_step_under_the_token_budget():
    scheduler = make_scheduler(max_num_batched_tokens=12)
    scheduler.add_request(make_request("short", prompt_len=5, max_tokens=4))
    step = scheduler.schedule()
    scheduler.update_from_output(step, fake_model_output(step))
    scheduler.add_request(make_request("long", prompt_len=30, max_tokens=2))
    mixed = scheduler.schedule()
    shapes = [(s.request.request_id, s.num_new_tokens) for s in mixed.scheduled]
    assert shapes == [("short", 1), ("long", 11)]
    assert mixed.num_scheduled_tokens == 12
    assert not mixed.scheduled[1].samples


def test_a_prompt_longer_than_the_budget_is_chunked_and_samples_only_at_its_end():
    scheduler = make_scheduler(max_num_batched_tokens=8)
    request = make_request("long", prompt_len=20, max_tokens=1)
    scheduler.add_request(request)
    chunks = []
    for _ in range(3):
        output = scheduler.schedule()
        chunks.append([(s.num_new_tokens, s.samples) for s in output.scheduled])
        scheduler.update_from_output(output, fake_model_output(output))
    assert chunks == [[(8, False)], [(8, False)], [(4, True)]]
    assert request.status == RequestStatus.FINISHED_LENGTH
    assert request.output_token_ids == [7]


def test_max_num_seqs_caps_the_batch():
    scheduler = make_scheduler(max_num_seqs=2, max_num_batched_tokens=100)
    for i in range(4):
        scheduler.add_request(make_request(f"r{i}", prompt_len=3))
    output = scheduler.schedule()
    assert len(output.scheduled) == 2
    assert len(scheduler.waiting) == 2


def test_the_waiting_queue_is_bounded():
    scheduler = make_scheduler(max_queue_len=2)
    scheduler.add_request(make_request("a", 3))
    scheduler.add_request(make_request("b", 3))
    with pytest.raises(QueueFullError):
        scheduler.add_request(make_request("c", 3))


def test_running_out_of_blocks_preempts_the_newest_request_by_recompute():
    scheduler = make_scheduler(num_blocks=6, block_size=4, max_num_batched_tokens=64)
    old = make_request("old", prompt_len=8, max_tokens=10)
    new = make_request("new", prompt_len=8, max_tokens=10, first_token=500)
    scheduler.add_request(old)
    scheduler.add_request(new)
    preempted = []
    for output in run_to_completion(scheduler):
        preempted += [r.request_id for r in output.preempted]
    assert "new" in preempted and "old" not in preempted
    assert new.num_preemptions > 0
    assert old.output_token_ids == [7] * 10 and new.output_token_ids == [7] * 10
    assert scheduler.block_manager.num_free_blocks == 6


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_a_preempted_request_recomputes_its_generated_tokens_before_sampling_again(prefix_caching):
    scheduler = make_scheduler(num_blocks=6, block_size=4, max_num_batched_tokens=64, prefix_caching=prefix_caching)
    scheduler.add_request(make_request("old", prompt_len=8, max_tokens=10))
    victim = make_request("new", prompt_len=8, max_tokens=10, first_token=500)
    scheduler.add_request(victim)
    while victim.num_preemptions == 0:
        output = scheduler.schedule()
        scheduler.update_from_output(output, fake_model_output(output))
    generated = len(victim.output_token_ids)
    while True:
        output = scheduler.schedule()
        mine = [s for s in output.scheduled if s.request is victim]
        scheduler.update_from_output(output, fake_model_output(output))
        if mine:
            break
    resumed = mine[0]
    assert resumed.samples and resumed.start + resumed.num_new_tokens == 8 + generated
    # With prefix caching, the victim's freed but still-hashed first block is found again.
    assert resumed.start == (4 if prefix_caching else 0)


def test_eos_stop_token_and_length_finish_requests_and_free_their_blocks():
    scheduler = make_scheduler()
    eos = make_request("eos", 4, max_tokens=10)
    stop = make_request("stop", 4, max_tokens=10)
    stop.sampling_params.stop_token_ids = [9]
    scheduler.add_request(eos)
    scheduler.add_request(stop)
    output = scheduler.schedule()
    scheduler.update_from_output(output, [[2], [9]])
    assert (eos.status, eos.stop_reason) == (RequestStatus.FINISHED_STOPPED, None)
    assert (stop.status, stop.stop_reason) == (RequestStatus.FINISHED_STOPPED, 9)
    assert not scheduler.has_unfinished
    assert scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_blocks


def test_ignore_eos_keeps_generating():
    scheduler = make_scheduler()
    request = make_request("r", 4, max_tokens=3)
    request.sampling_params.ignore_eos = True
    scheduler.add_request(request)
    for _ in range(3):
        output = scheduler.schedule()
        scheduler.update_from_output(output, [[2]])
    assert request.output_token_ids == [2, 2, 2]
    assert request.status == RequestStatus.FINISHED_LENGTH


def test_a_repeated_prompt_is_served_from_the_prefix_cache():
    scheduler = make_scheduler(block_size=4)
    scheduler.add_request(make_request("first", prompt_len=13, max_tokens=1))
    run_to_completion(scheduler)
    scheduler.add_request(make_request("second", prompt_len=13, max_tokens=1))
    output = scheduler.schedule()
    assert output.prefix_cache_hits == 12 and output.prefix_cache_queries == 13
    assert [(s.start, s.num_new_tokens) for s in output.scheduled] == [(12, 1)]


def test_aborting_a_waiting_or_running_request_frees_everything():
    scheduler = make_scheduler(max_num_seqs=1)
    running = make_request("running", 6)
    waiting = make_request("waiting", 6)
    scheduler.add_request(running)
    scheduler.add_request(waiting)
    scheduler.update_from_output(output := scheduler.schedule(), fake_model_output(output))
    scheduler.finish_request(waiting, RequestStatus.FINISHED_ABORTED)
    scheduler.finish_request(running, RequestStatus.FINISHED_ABORTED)
    assert not scheduler.has_unfinished
    assert scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_blocks


def test_a_request_that_cannot_be_admitted_is_counted_in_the_prefix_cache_only_once_admitted():
    scheduler = make_scheduler(num_blocks=6, block_size=4, max_num_batched_tokens=64)
    scheduler.add_request(make_request("holder", prompt_len=16, max_tokens=2))
    first = scheduler.schedule()
    scheduler.update_from_output(first, fake_model_output(first))
    blocked = make_request("blocked", prompt_len=21, max_tokens=1, first_token=500)
    scheduler.add_request(blocked)
    counted = []
    while scheduler.has_unfinished:
        output = scheduler.schedule()
        scheduler.update_from_output(output, fake_model_output(output))
        counted.append((output.prefix_cache_queries, [r.request_id for r in output.newly_scheduled]))
        if blocked in scheduler.waiting:
            assert blocked.num_cached_tokens == 0 and blocked.num_computed_tokens == 0
    assert counted[0] == (0, [])
    assert [queries for queries, admitted in counted if queries] == [21]
    assert [admitted for _, admitted in counted if admitted] == [["blocked"]]
    assert scheduler.block_manager.num_free_blocks == 6
