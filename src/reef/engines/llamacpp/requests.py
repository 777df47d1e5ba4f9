"""What a request becomes before it queues: checked, rendered with the model's own chat template,
tokenized, and its sampling settled. Done on the event loop, a few milliseconds, so that a bad
request is refused at once and requests queue in arrival order; thread-safe, since it only reads
the model's vocabulary and template (`count_prompt_tokens` is called from other threads)."""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from typing import Any, Protocol

from reef.engines.llamacpp.sampling import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, Sampling
from reef.engines.llamacpp.structured import OutputConstraint, output_constraint
from reef.errors import Unsupported
from reef.protocol import ChatRequest, ChunkFactory


@dataclass
class PreparedRequest:
    """A request checked and tokenized before it joins the queue."""

    request: ChatRequest
    prompt: list[int]
    sampling: Sampling
    chunks: ChunkFactory
    received_at: float
    constraint: OutputConstraint | None = None


class TokenLimits(Protocol):
    """The engine's window and token limits, read at each request (they may change)."""

    n_ctx: int  # each slot's context window: one request's prompt and completion
    default_max_tokens: int  # a request that sets no limit
    max_tokens_cap: int | None  # no request gets more


class RequestReader:
    """Reads requests for one loaded model: its vocabulary (`model`), its chat template
    (`formatter`), and the engine's `limits`."""

    def __init__(self, model: Any, formatter: Any, limits: TokenLimits) -> None:
        self._model = model
        self._formatter = formatter
        self._limits = limits

    def prepare(self, request: ChatRequest, model_name: str) -> PreparedRequest:
        """`request` checked (chat template, context window, logit_bias, grammar) and
        tokenized, answered under `model_name`."""
        prompt = self.prompt_tokens(request)
        constraint = output_constraint(request)
        if constraint is not None:
            self._check_grammar(constraint.grammar)
        return PreparedRequest(
            request=request,
            prompt=prompt,
            sampling=self._sampling(request, len(prompt), model_name),
            chunks=ChunkFactory(model=model_name),
            received_at=time.perf_counter(),
            constraint=constraint,
        )

    def prompt_tokens(self, request: ChatRequest) -> list[int]:
        """The tokens the model reads for `request`: its chat template rendered with the
        request's tools, as a served call would be."""
        if request.raw_prompt is not None:  # a legacy text completion: no chat template
            text = request.raw_prompt.encode("utf-8")
            return list(self._model.tokenize(text, add_bos=True, special=False))
        messages = [template_message(m.role, m.text(), m.tool_calls) for m in request.messages]
        try:
            rendered = self._formatter(messages=messages, tools=request.tools)
        except Exception as error:  # a template's raise_exception, or a jinja error
            raise Unsupported(
                f"the model's chat template rejected these messages: {error}"
            ) from None
        return list(
            self._model.tokenize(
                rendered.prompt.encode("utf-8"), add_bos=not rendered.added_special, special=True
            )
        )

    def _check_grammar(self, grammar: str) -> None:
        """Refuse, before the request queues, a grammar llama.cpp cannot parse."""
        import llama_cpp

        sampler = llama_cpp.llama_sampler_init_grammar(self._model.vocab, grammar.encode(), b"root")
        if not sampler:
            raise Unsupported(
                "llama.cpp could not build a grammar from this schema: simplify the JSON schema "
                "(response_format or the forced tool's parameters)",
                code="unsupported_schema",
            )
        llama_cpp.llama_sampler_free(sampler)

    def _sampling(self, request: ChatRequest, prompt_length: int, model_name: str) -> Sampling:
        limits = self._limits
        room = limits.n_ctx - prompt_length
        if room < 1:
            raise Unsupported(
                f"the prompt is {prompt_length} tokens and the engine's context window is "
                f"{limits.n_ctx}: shorten the messages or raise engine.llamacpp.n_ctx",
                code="context_length_exceeded",  # OpenAI's code for it
            )
        wanted = request.token_limit() or limits.default_max_tokens
        if limits.max_tokens_cap is not None:
            wanted = min(wanted, limits.max_tokens_cap)
        return Sampling(
            # More than the window holds after the prompt is clamped to what it holds (OpenAI
            # refuses; agents that ask for tens of thousands of tokens would then fail).
            max_tokens=min(wanted, room),
            limit_is_a_stop=request.capped_by_server and wanted <= room,
            logit_bias=self._logit_bias(request, model_name),
            temperature=DEFAULT_TEMPERATURE if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=DEFAULT_TOP_K if request.top_k is None else request.top_k,
            stops=request.stop_sequences(),
            top_logprobs=(request.top_logprobs or 0) if request.logprobs else None,
            presence_penalty=request.presence_penalty or 0.0,
            frequency_penalty=request.frequency_penalty or 0.0,
            seed=random.getrandbits(32) if request.seed is None else request.seed & 0xFFFFFFFF,
        )

    def _logit_bias(self, request: ChatRequest, model_name: str) -> dict[int, float]:
        """`logit_bias` as token id -> bias, refusing ids this model's vocabulary lacks."""
        raw = getattr(request, "logit_bias", None) or {}
        n_vocab = self._model.n_vocab()
        bias = {}
        for key, value in raw.items():
            try:
                token = int(key)
            except (TypeError, ValueError):
                token = -1
            if not 0 <= token < n_vocab:
                raise Unsupported(
                    f"logit_bias key {key!r} is not a token id of {model_name} (ids are 0 to "
                    f"{n_vocab - 1})",
                    code="invalid_logit_bias",
                )
            bias[token] = float(value)
        return bias


def template_message(
    role: str, text: str, tool_calls: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """A message as chat templates expect it: string content, `developer` read as `system`."""
    if tool_calls and not text:
        text = "\n".join(json.dumps(call.get("function", call)) for call in tool_calls)
    return {"role": "system" if role == "developer" else role, "content": text}
