"""Output-quality checks on finished requests: pure functions over token ids."""

from collections.abc import Sequence

from server.engine.repetition import has_repetition_loop


def repetition_ratio(tokens: Sequence[int], n: int = 4) -> float:
    """1 - distinct n-grams / total n-grams: 0 for fresh text, near 1 for a loop; 0 when too short to say."""
    total = len(tokens) - n + 1
    if total <= 0:
        return 0.0
    distinct = len({tuple(tokens[i : i + n]) for i in range(total)})
    return 1.0 - distinct / total


def output_anomalies(
    tokens: Sequence[int], finish_reason: str, stop_reason: object, eos_token_ids: Sequence[int] = ()
) -> list[str]:
    """The anomaly kinds one finished output shows: ``empty``, ``repetition_loop``, ``length_capped``.

    An output of nothing but end-of-sequence tokens counts as empty.
    """
    if finish_reason == "abort":
        return []
    if all(t in eos_token_ids for t in tokens):
        return ["empty"]
    looping = stop_reason == "repetition" or has_repetition_loop(tokens)
    kinds = []
    if looping:
        kinds.append("repetition_loop")
        if finish_reason == "length":
            kinds.append("length_capped")
    return kinds
