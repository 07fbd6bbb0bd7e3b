"""The online repetition-loop detector and the quality checks built on it."""

from hypothesis import given, settings
from hypothesis import strategies as st

from server.engine.repetition import RepetitionDetector, has_repetition_loop
from telemetry.quality import output_anomalies, repetition_ratio


def test_a_span_repeated_back_to_back_is_flagged_at_the_last_repeat():
    span = [11, 12, 13, 14, 15]
    detector = RepetitionDetector(min_repeats=4, max_period=8, min_span_tokens=16)
    flags = [detector.add(t) for t in [1, 2, 3] + span * 4]
    assert flags.index(True) == len(flags) - 1
    assert detector.detected_period == 5


def test_three_repeats_or_a_short_stutter_are_not_loops():
    assert not has_repetition_loop([1, 2, 3, 4, 5] * 3)
    assert not has_repetition_loop([7, 7, 7, 7, 9, 10])
    assert not has_repetition_loop(list(range(500)))


def test_a_period_longer_than_the_window_is_not_seen():
    span = list(range(40))
    assert not has_repetition_loop(span * 5, max_period=32)
    assert has_repetition_loop(span * 5, max_period=40)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=12), st.integers(4, 6), st.lists(st.integers(100, 200)))
def test_any_span_repeated_often_enough_is_found(span, repeats, prefix):
    tokens = prefix + span * max(repeats, -(-16 // len(span)) + 1)
    assert has_repetition_loop(tokens, min_repeats=4, max_period=32, min_span_tokens=16)


def test_the_state_per_request_stays_bounded_whatever_the_output_length():
    detector = RepetitionDetector(max_period=16)
    for token in range(100_000):
        detector.add(token % 1000)
    assert len(detector._recent) == 16 and len(detector._runs) == 17


def test_repetition_ratio():
    assert repetition_ratio(list(range(20))) == 0.0
    assert repetition_ratio([1, 2] * 20) > 0.9
    assert repetition_ratio([1, 2, 3]) == 0.0


def test_output_anomaly_kinds():
    loop = [5, 6, 7, 8] * 10
    assert output_anomalies([], "stop", None) == ["empty"]
    assert output_anomalies([2], "stop", None, eos_token_ids=(2,)) == ["empty"]
    assert output_anomalies(loop, "length", None) == ["repetition_loop", "length_capped"]
    assert output_anomalies(loop[:20], "stop", "repetition") == ["repetition_loop"]
    assert output_anomalies(list(range(30)), "length", None) == []
    assert output_anomalies([], "abort", None) == []
