"""How many guesses each request gets in the next step: as many as are expected to pay for their verification
rows, judged from the request's recent acceptance and from what steps of each size have cost on this machine.
Where guessing does not pay (text that does not repeat) a request stops guessing, and probes with one guess now
and then in case its text has started to repeat."""

from dataclasses import dataclass, field

# A request's acceptance is the chance that a guess is kept, given the guesses before it were: decayed counts of
# kept guesses and of tries (each kept guess, and the first rejected one), starting from one kept in two.
DECAY = 0.7
PRIOR_KEPT, PRIOR_TRIES = 1.0, 2.0
# A step size (rows) not measured yet is assumed to cost this much more per extra row than the nearest measured
# one below it: cheap enough that each size gets tried, after which its measured time decides.
UNMEASURED_ROW_COST = 0.05
# A step size's time is the least of its first few measurements, then a running mean that follows a faster step
# more readily than a slower one: a step slowed by something else on the machine should not rule its size out.
TRUSTED_AFTER = 3
FASTER_WEIGHT, SLOWER_WEIGHT = 0.5, 0.05
# Steps without guesses before a request that stopped guessing tries one guess again, doubling up to the maximum.
FIRST_PROBE_AFTER, MAX_PROBE_AFTER = 8, 64


@dataclass
class Acceptance:
    kept: float = PRIOR_KEPT
    tries: float = PRIOR_TRIES
    idle_steps: int = 0
    probe_after: int = FIRST_PROBE_AFTER

    @property
    def rate(self) -> float:
        return self.kept / self.tries

    def observe(self, num_guesses: int, num_kept: int) -> None:
        self.kept = DECAY * self.kept + num_kept
        self.tries = DECAY * self.tries + num_kept + (num_kept < num_guesses)


def expected_tokens(rate: float, num_guesses: int) -> float:
    """Tokens a step gives a request with ``num_guesses`` guesses: the one it always gets and each guess kept."""
    return sum(rate**i for i in range(num_guesses + 1))


@dataclass
class StepTimes:
    """Seconds of decode steps (no prompt rows) by their number of rows, and how often each was measured."""

    seconds: dict[int, float] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)

    def observe(self, rows: int, seconds: float) -> None:
        old, count = self.seconds.get(rows), self.counts.get(rows, 0)
        if old is None or count < TRUSTED_AFTER:
            new = seconds if old is None else min(old, seconds)
        else:
            new = old + (FASTER_WEIGHT if seconds < old else SLOWER_WEIGHT) * (seconds - old)
        self.seconds[rows], self.counts[rows] = new, count + 1

    def estimate(self, rows: int) -> float:
        """Measured, or from the nearest measured size (below it if any) and UNMEASURED_ROW_COST; with nothing
        measured, relative to a one-row step of 1.0. A size measured fewer than TRUSTED_AFTER times is taken at
        the lower of the two, so that it is tried again."""
        measured = self.seconds.get(rows)
        if measured is not None and self.counts.get(rows, TRUSTED_AFTER) >= TRUSTED_AFTER:
            return measured
        others = [r for r in self.seconds if r != rows]
        if not others:
            guess = 1.0 + UNMEASURED_ROW_COST * (rows - 1)
        else:
            near = max((r for r in others if r < rows), default=min(others))
            if near < rows:
                guess = self.seconds[near] * (1.0 + UNMEASURED_ROW_COST * (rows - near))
            else:
                guess = self.seconds[near] / (1.0 + UNMEASURED_ROW_COST * (near - rows))
        return guess if measured is None else min(measured, guess)


@dataclass
class DraftPolicy:
    """Guesses per request for one step. Requests are decided in turn; each takes the number of guesses that
    makes the step's expected tokens per second highest, given the rows and tokens decided before it."""

    max_guesses: int
    step_times: StepTimes = field(default_factory=StepTimes)
    acceptance: dict[str, Acceptance] = field(default_factory=dict)

    def start_step(self, num_decoding: int) -> None:
        """Before deciding for the ``num_decoding`` requests that will decode in the next step."""
        self._rows = self._tokens = float(num_decoding)

    def num_guesses(self, request_id: str, room: int) -> int:
        """How many guesses ``request_id`` should propose (at most ``room``); call propose_count after proposing
        with how many it did."""
        state = self.acceptance.setdefault(request_id, Acceptance())
        limit = min(self.max_guesses, room)
        best, best_rate = 0, self._tokens / self.step_times.estimate(int(self._rows))
        for k in range(1, limit + 1):
            tokens = self._tokens + expected_tokens(state.rate, k) - 1
            rate = tokens / self.step_times.estimate(int(self._rows) + k)
            if rate > best_rate:
                best, best_rate = k, rate
        if best == 0 and limit > 0:
            if state.idle_steps < state.probe_after:
                state.idle_steps += 1
            else:
                state.idle_steps, state.probe_after = 0, min(2 * state.probe_after, MAX_PROBE_AFTER)
                best = 1
        return best

    def proposed(self, request_id: str, num_guesses: int) -> None:
        """The request proposed ``num_guesses`` guesses for the next step."""
        if num_guesses:
            state = self.acceptance[request_id]
            self._tokens += expected_tokens(state.rate, num_guesses) - 1
            self._rows += num_guesses

    def observe_verification(self, request_id: str, num_guesses: int, num_kept: int) -> None:
        state = self.acceptance.get(request_id)
        if state is None:
            return
        state.observe(num_guesses, num_kept)
        if num_kept:
            state.probe_after = FIRST_PROBE_AFTER

    def forget(self, request_id: str) -> None:
        self.acceptance.pop(request_id, None)
