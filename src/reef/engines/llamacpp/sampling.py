"""Sampling for one sequence of a llama.cpp batch, and logprobs read from its logits row.

Each running choice owns a llama.cpp sampler chain seeded with its own seed, so sequences that
decode in one batch sample independently, and a seed never needs the prompt cache cleared. The
chain is the one llama-cpp-python's `Llama.generate` builds (bias, penalties, grammar, then greedy
at temperature 0 or top-k, top-p, min-p, temperature and a seeded draw), so the same seed over the
same logits gives the same tokens as before batching.

Logprobs are the log-softmax of the raw logits row llama.cpp holds for the sequence's output
(before bias or grammar): one pass over the vocabulary per token, instead of `logits_all=True`,
which keeps every row and runs about ten times slower.
"""

from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

# Sampling defaults when the request does not say: OpenAI's temperature and top_p, with
# llama.cpp's top_k and min_p to cut the long tail that makes small models ramble.
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_K = 40
DEFAULT_MIN_P = 0.05
PENALTY_LAST_N = 64  # llama-cpp-python's window for presence and frequency penalties
# llama_token_data as numpy lays it out: the candidates a sampler chain filters.
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


@dataclass
class Sampling:
    max_tokens: int
    # Whether reaching max_tokens ends the answer as a stop ("stop"): the limit was the
    # server's cap on answers, not the client's max_tokens, nor the room left in the window.
    limit_is_a_stop: bool
    logit_bias: dict[int, float]
    temperature: float
    top_p: float
    stops: list[str]
    top_logprobs: int | None
    presence_penalty: float
    frequency_penalty: float
    seed: int
    top_k: int = DEFAULT_TOP_K

    def as_served(self) -> dict[str, Any]:
        """The settings the answer was sampled with, defaults included, as a record keeps them:
        training corrects for the behaviour policy, and these say what it was."""
        greedy = self.temperature == 0
        return {
            "temperature": self.temperature,
            "top_p": None if greedy else self.top_p,
            "top_k": None if greedy else self.top_k,
            "min_p": None if greedy else DEFAULT_MIN_P,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            "stop": self.stops,
        }

    def for_choice(self, index: int) -> Sampling:
        """The sampling of choice `index` of n: each choice its own seed, derived from the first."""
        if index == 0:
            return self
        return dataclasses.replace(self, seed=(self.seed + index) & 0xFFFFFFFF)

    @property
    def hold(self) -> int:
        """Characters a stream holds back: a stop sequence may be starting in them."""
        return max((len(stop) for stop in self.stops), default=1) - 1


class SequenceSampler:
    """A llama.cpp sampler chain for one choice; `sample` also advances its grammar.

    A greedy choice with nothing that keeps state (no grammar, no penalties) is the most likely
    token after the logit bias: numpy's argmax over the logits row the engine reads anyway for
    logprobs, a tenth of what building llama.cpp's candidate array of the whole vocabulary
    costs, every token."""

    def __init__(self, vocab: Any, n_vocab: int, sampling: Sampling, grammar: str | None) -> None:
        import llama_cpp

        self._greedy = (
            sampling.temperature == 0
            and grammar is None
            and not (sampling.presence_penalty or sampling.frequency_penalty)
        )
        self._bias = _bias_arrays(sampling.logit_bias)
        self._chain = None
        if not self._greedy:
            params = llama_cpp.llama_sampler_chain_default_params()
            self._chain = llama_cpp.llama_sampler_chain_init(params)
            for sampler in _samplers(vocab, n_vocab, sampling, grammar):
                llama_cpp.llama_sampler_chain_add(self._chain, sampler)

    def sample(self, row: np.ndarray, context: Any = None, index: int = 0) -> int:
        """The token drawn from `row`, the logits of batch output `index` of `context` (or kept
        from an earlier call when `context` is None), accepted into the chain."""
        import llama_cpp

        if self._greedy:
            if self._bias is None:
                return int(row.argmax())
            tokens, values = self._bias
            biased = row.copy()
            biased[tokens] += values
            return int(biased.argmax())
        if context is not None:
            return int(llama_cpp.llama_sampler_sample(self._chain, context, index))
        return self._sample_kept(row)

    def _sample_kept(self, row: np.ndarray) -> int:
        """What llama_sampler_sample does over a context's logits, over `row`: the chain applied
        to every token with its logit, the selected token accepted."""
        import llama_cpp

        candidates = np.zeros(len(row), dtype=_TOKEN_DATA)
        candidates["id"] = np.arange(len(row), dtype=np.int32)
        candidates["logit"] = row
        data = candidates.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data))
        array = llama_cpp.llama_token_data_array(data, len(row), -1, False)
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(array))
        if not 0 <= array.selected < len(row):
            raise RuntimeError("llama.cpp's sampler chain selected no token")
        # The chain may have sorted or cut the array in place: read the id from where it points.
        token = int(array.data[array.selected].id)
        llama_cpp.llama_sampler_accept(self._chain, token)
        return token

    def close(self) -> None:
        import llama_cpp

        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)  # frees the samplers it holds
            self._chain = None


def _bias_arrays(bias: dict[int, float]) -> tuple[np.ndarray, np.ndarray] | None:
    if not bias:
        return None
    return np.array(list(bias), dtype=np.int64), np.array(list(bias.values()), dtype=np.float32)


def _samplers(vocab: Any, n_vocab: int, sampling: Sampling, grammar: str | None) -> list[Any]:
    import llama_cpp

    chain = []
    if sampling.logit_bias:
        biases = (llama_cpp.llama_logit_bias * len(sampling.logit_bias))(
            *(llama_cpp.llama_logit_bias(t, b) for t, b in sampling.logit_bias.items())
        )
        chain.append(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(biases), biases))
    if sampling.presence_penalty or sampling.frequency_penalty:
        chain.append(
            llama_cpp.llama_sampler_init_penalties(  # the pinned llama.cpp's takes n_vocab
                n_vocab, PENALTY_LAST_N, 1.0, sampling.frequency_penalty, sampling.presence_penalty
            )
        )
    if grammar is not None:
        chain.append(llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root"))
    if sampling.temperature == 0:
        chain.append(llama_cpp.llama_sampler_init_greedy())
        return chain
    chain += [
        llama_cpp.llama_sampler_init_top_k(sampling.top_k),
        llama_cpp.llama_sampler_init_top_p(sampling.top_p, 1),
        llama_cpp.llama_sampler_init_min_p(DEFAULT_MIN_P, 1),
        llama_cpp.llama_sampler_init_temp(sampling.temperature),
        llama_cpp.llama_sampler_init_dist(sampling.seed),
    ]
    return chain


def logits_row(context: Any, index: int, n_vocab: int) -> np.ndarray:
    """The raw logits of batch output `index` (a view: read it before the next decode)."""
    import llama_cpp

    pointer = llama_cpp.llama_get_logits_ith(context, index)
    return np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), (n_vocab,))


def logprob_of(
    row: np.ndarray, token: int, top: int | None, scratch: np.ndarray | None = None
) -> tuple[float, list[tuple[int, float]]]:
    """`token`'s log-softmax under `row`, and the `top` most likely tokens with theirs;
    `scratch`, an array of the row's shape, spares an allocation per token."""
    peak = row.max()
    shifted = np.subtract(row, peak, out=scratch)
    log_norm = float(peak) + float(np.log(np.exp(shifted, out=shifted).sum()))
    logprob = float(row[token]) - log_norm
    if not top:
        return logprob, []
    best = np.argpartition(row, -top)[-top:]
    best = best[np.argsort(row[best])[::-1]]
    return logprob, [(int(t), float(row[t]) - log_norm) for t in best]
