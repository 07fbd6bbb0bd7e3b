"""The draft policy alone: how many n-gram guesses a request gets, from its recent acceptance and what steps of
each size have cost. No model, no timing: step times are given."""

from server.engine.spec_decode.draft_length import (
    FIRST_PROBE_AFTER,
    TRUSTED_AFTER,
    DraftPolicy,
    StepTimes,
    expected_tokens,
)

# A decode step of one row, and verification steps a little dearer per row, as measured at one stream on the CPU.
MEASURED = {1: 1.0, 2: 1.15, 3: 1.18, 4: 1.21, 5: 1.24, 6: 1.27, 7: 1.3, 8: 1.33}


def policy(max_guesses: int = 7, seconds: dict[int, float] | None = None) -> DraftPolicy:
    return DraftPolicy(max_guesses, StepTimes(dict(MEASURED if seconds is None else seconds)))


def guesses(policy: DraftPolicy, room: int = 100) -> int:
    policy.start_step(1)
    wanted = policy.num_guesses("r", room)
    policy.proposed("r", wanted)
    return wanted


def test_expected_tokens_count_the_token_a_step_always_gives():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == 1.75


def test_a_request_whose_guesses_are_kept_gets_the_most_guesses_and_never_past_its_room():
    drafts = policy()
    for _ in range(3):
        wanted = guesses(drafts)
        drafts.observe_verification("r", wanted, wanted)
    assert guesses(drafts) == 7
    assert guesses(drafts, room=2) == 2
    assert guesses(drafts, room=0) == 0


def test_guessing_stops_after_a_run_of_rejections_and_resumes_after_a_kept_probe():
    drafts = policy()
    stopped_after = None
    for step in range(10):
        wanted = guesses(drafts)
        if wanted == 0:
            stopped_after = step
            break
        drafts.observe_verification("r", wanted, 0)
    assert stopped_after is not None and stopped_after <= 4
    # No guesses while it does not pay (the step it stopped is the first without), then a probe of one guess.
    idle = [guesses(drafts) for _ in range(FIRST_PROBE_AFTER)]
    assert idle == [0] * (FIRST_PROBE_AFTER - 1) + [1]
    # A rejected probe waits twice as long for the next one.
    drafts.observe_verification("r", 1, 0)
    idle = [guesses(drafts) for _ in range(2 * FIRST_PROBE_AFTER + 1)]
    assert idle == [0] * (2 * FIRST_PROBE_AFTER) + [1]
    # A kept probe (the text has started to repeat) brings guessing back, and more as guesses keep being kept.
    drafts.observe_verification("r", 1, 1)
    assert guesses(drafts) > 0
    for _ in range(4):
        wanted = guesses(drafts)
        drafts.observe_verification("r", wanted, wanted)
    assert guesses(drafts) == 7


def test_a_step_size_measured_dear_is_avoided():
    # Past eight rows the linears leave the few-rows kernel: a step of nine rows costs twice as much.
    drafts = policy(max_guesses=8, seconds={**MEASURED, 9: 2.4})
    for _ in range(3):
        wanted = guesses(drafts)
        drafts.observe_verification("r", wanted, wanted)
    assert guesses(drafts) == 7


def test_unmeasured_sizes_are_tried_then_their_measurement_decides():
    drafts = policy(seconds={1: 1.0})
    assert guesses(drafts) > 0
    for rows in range(2, 9):  # every size with guesses, as if measured five times as dear as one row
        for _ in range(TRUSTED_AFTER):
            drafts.step_times.observe(rows, 5.0)
    drafts.observe_verification("r", 1, 1)
    assert guesses(drafts) == 0


def test_one_slow_step_does_not_rule_its_size_out():
    times = StepTimes()
    times.observe(1, 1.0)
    times.observe(5, 40.0)  # something else had the cores
    assert times.estimate(5) < 1.3
    for seconds in (1.2, 1.3):
        times.observe(5, seconds)
    assert times.estimate(5) == 1.2
    times.observe(5, 40.0)
    assert times.estimate(5) < 3.2


def test_guesses_for_one_request_count_against_the_next_in_the_same_step():
    # At a batch of eight, rows are cheap until the ninth, then dear: the first request takes the cheap rows.
    seconds = {rows: 1.0 + 0.02 * rows for rows in range(1, 9)} | {rows: 3.0 for rows in range(9, 20)}
    drafts = DraftPolicy(4, StepTimes(seconds))
    drafts.start_step(2)
    first = drafts.num_guesses("a", 100)
    drafts.proposed("a", first)
    second = drafts.num_guesses("b", 100)
    assert first + 2 <= 8 and first > 0
    assert 2 + first + second <= 8


def test_a_finished_request_is_forgotten():
    drafts = policy()
    guesses(drafts)
    drafts.forget("r")
    assert "r" not in drafts.acceptance
