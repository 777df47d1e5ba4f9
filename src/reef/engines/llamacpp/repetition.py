"""Degenerate repetition: an answer that has started to repeat itself, token for token.

A small model can fall into a loop ("I can help you with that. I can help you with that. …") and
stay in it until its window is full: minutes on a CPU for nothing a client wants. `Repetition`
watches one sequence's tokens. For each period p up to `max_period` it counts how many tokens in
a row equal the token p places before them; once the tail of the answer is a block of p tokens
repeated exactly, over at least `min_span` tokens and at least `min_repeats` times, the answer
is looping and should end (the engine ends it as a stop sequence would, finish_reason "stop":
coding agents fail a call that ends "length", as cut short). An answer held to a grammar (a JSON
schema, a forced tool call) is not watched: ended early it would not parse.

Natural text repeats single words and short phrases, never dozens of tokens over and over: with
the defaults, one token said 64 times in a row, a 10-token phrase 7 times, a 40-token sentence
3 times.
"""

from __future__ import annotations

MAX_PERIOD = 128  # the longest block (in tokens) whose repeats are caught
MIN_SPAN = 64  # tokens the repeats must cover
MIN_REPEATS = 3  # whole blocks the repeats must hold


class Repetition:
    def __init__(
        self, max_period: int = MAX_PERIOD, min_span: int = MIN_SPAN, min_repeats: int = MIN_REPEATS
    ) -> None:
        self.max_period = max_period
        self.min_span = min_span
        self.min_repeats = min_repeats
        self._tokens: list[int] = []
        # _runs[p]: how many of the latest tokens equal, each, the token p places before it.
        self._runs = [0] * (max_period + 1)

    def looping(self, token: int) -> bool:
        """Take the answer's next token; True once its tail is a block repeated (see module)."""
        tokens, runs = self._tokens, self._runs
        tokens.append(token)
        newest = len(tokens) - 1
        for period in range(1, min(self.max_period, newest) + 1):
            if tokens[newest - period] != token:
                runs[period] = 0
                continue
            runs[period] += 1
            span = runs[period] + period  # the tail that many tokens long has this period
            if span >= self.min_span and span >= self.min_repeats * period:
                return True
        return False
