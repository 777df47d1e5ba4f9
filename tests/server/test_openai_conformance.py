"""OpenAI conformance beyond chat: `n` choices, legacy text completions and embeddings, on the
real embedded model through the real `openai` client; and upstream forwarding, with a second
Reef (upstream engine) in front of the first."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from reef.testing.processes import ServerProcess, free_port, reef_serve
from tests.conftest import SEED, TOKEN, endless

ASK = [{"role": "user", "content": "Name a colour."}]


def stored(http: httpx.Client, record_id: str) -> dict:
    return http.get(f"/reef/records/{record_id}").json()


def test_n_choices_come_back_in_one_record(client: OpenAI, http: httpx.Client) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="default", messages=ASK, n=3, max_tokens=6, seed=SEED + 11, extra_body=endless()
    )
    answer = raw.parse()
    assert [choice.index for choice in answer.choices] == [0, 1, 2]
    # Each choice has its own seed, the next after the request's: choice k is what a request of
    # its own with seed 11 + k answers.
    alone = [
        client.chat.completions.create(
            model="default", messages=ASK, max_tokens=6, seed=SEED + 11 + k, extra_body=endless()
        )
        .choices[0]
        .message.content
        for k in range(3)
    ]
    assert [choice.message.content for choice in answer.choices] == alone
    assert all(alone)
    record = stored(http, raw.headers["x-reef-agent-record-id"])
    assert len(record["response"]["choices"]) == 3
    assert answer.usage is not None
    assert answer.usage.completion_tokens == record["completion_tokens"]  # all choices counted
    assert answer.usage.completion_tokens > len(record["completion_token_ids"])
    assert len(record["completion_token_ids"]) <= 6  # choice 0's tokens


def test_n_choices_stream_with_their_indexes(client: OpenAI, http: httpx.Client) -> None:
    stream = client.chat.completions.create(
        model="default", messages=ASK, n=2, max_tokens=5, stream=True, extra_body=endless()
    )
    texts, finishes, receipt = {0: "", 1: ""}, {}, None
    for chunk in stream:
        receipt = getattr(chunk, "reef", None) or receipt
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts[0] and texts[1] and set(finishes) == {0, 1}
    assert receipt
    record = stored(http, receipt["agent_record_id"])
    assert [c["message"]["content"] for c in record["response"]["choices"]] == [
        texts[0],
        texts[1],
    ]


def test_text_completion_continues_the_prompt(client: OpenAI, http: httpx.Client) -> None:
    raw = client.completions.with_raw_response.create(
        model="default",
        prompt="The capital of France is",
        max_tokens=5,
        temperature=0,
        extra_body=endless(),
    )
    answer = raw.parse()
    assert answer.object == "text_completion"
    assert answer.choices[0].text and answer.choices[0].finish_reason == "length"
    assert answer.usage and answer.usage.completion_tokens == 5
    record = stored(http, raw.headers["x-reef-agent-record-id"])
    assert record["request"]["prompt"] == "The capital of France is"
    assert record["response"]["choices"][0]["text"] == answer.choices[0].text
    # No chat template: the prompt tokens are the text's own (plus BOS where the model has one).
    assert record["prompt_tokens"] <= 8


def test_text_completion_default_length_echo_and_logprobs(client: OpenAI) -> None:
    answer = client.completions.create(
        model="default", prompt="One, two, three,", echo=True, logprobs=2, temperature=0
    )
    choice = answer.choices[0]
    assert choice.text.startswith("One, two, three,")
    assert answer.usage and answer.usage.completion_tokens <= 16  # OpenAI's default max_tokens
    logprobs = choice.logprobs
    assert logprobs and logprobs.tokens and logprobs.token_logprobs
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    assert logprobs.top_logprobs and all(len(top) == 2 for top in logprobs.top_logprobs)
    assert (logprobs.text_offset or [0])[0] == len("One, two, three,")


def test_text_completion_streams(client: OpenAI, http: httpx.Client) -> None:
    stream = client.completions.create(
        model="default",
        prompt="Once upon a time",
        max_tokens=6,
        stream=True,
        logprobs=1,
        seed=SEED + 3,
        extra_body=endless(),
    )
    text, receipt, finish, ids, offsets = "", None, None, set(), []
    for chunk in stream:
        receipt = getattr(chunk, "reef", None) or receipt
        ids.add(chunk.id)
        for choice in chunk.choices:
            if choice.logprobs and choice.logprobs.text_offset:
                offsets += choice.logprobs.text_offset
            text += choice.text
            finish = choice.finish_reason or finish
    assert text and finish == "length" and receipt
    # One completion: one id on every chunk, the receipt's too; offsets count on across chunks.
    assert len(ids) == 1 and ids.pop().startswith("cmpl-")
    assert offsets[0] == 0 and offsets == sorted(offsets) and len(set(offsets)) > 1
    assert stored(http, receipt["agent_record_id"])["response"]["choices"][0]["text"] == text


def test_text_completion_refuses_what_it_cannot_do(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="suffix"):
        client.completions.create(model="default", prompt="def f(", suffix="return 1")
    with pytest.raises(openai.BadRequestError, match="one prompt per request"):
        client.completions.create(model="default", prompt=["a", "b"])


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_embeddings_are_normalised_and_meaningful(client: OpenAI) -> None:
    texts = ["the cat sat on the mat", "a cat is sitting on a mat", "quarterly tax returns"]
    answer = client.embeddings.create(model="default", input=texts)
    vectors = [item.embedding for item in answer.data]
    assert [item.index for item in answer.data] == [0, 1, 2]
    assert all(math.isclose(cosine(v, v), 1.0, rel_tol=1e-4) for v in vectors)
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])
    assert answer.usage.prompt_tokens > 0
    single = client.embeddings.create(model="default", input="the cat sat on the mat")
    assert single.data[0].embedding == pytest.approx(vectors[0], abs=1e-5)


def test_embeddings_as_floats_equal_the_sdks_base64(client: OpenAI, http: httpx.Client) -> None:
    as_floats = http.post(
        "/v1/embeddings", json={"input": "hello", "encoding_format": "float"}
    ).json()
    decoded = client.embeddings.create(model="default", input="hello").data[0].embedding
    assert decoded == pytest.approx(as_floats["data"][0]["embedding"], abs=1e-6)
    refused = http.post("/v1/embeddings", json={"input": "x", "encoding_format": "hex"})
    assert refused.status_code == 400
    assert "'float' or 'base64'" in refused.json()["error"]["message"]


def test_embeddings_of_token_ids_equal_those_of_their_text(
    client: OpenAI, http: httpx.Client
) -> None:
    """OpenAI's `input` may be token ids (one input) or lists of them (issue 75: refused)."""
    from reef.engines.llamacpp import embedded_model_path
    from reef.engines.llamacpp.weights import load_model

    model = load_model(embedded_model_path())
    try:
        ids = list(model.tokenize(b"the cat sat on the mat", add_bos=True, special=False))
        n_vocab = model.n_vocab()
    finally:
        model.close()
    text = client.embeddings.create(model="default", input="the cat sat on the mat")
    one = client.embeddings.create(model="default", input=ids)
    assert one.data[0].embedding == pytest.approx(text.data[0].embedding, abs=1e-5)
    assert one.usage.prompt_tokens == len(ids)
    many = client.embeddings.create(model="default", input=[ids, ids[:3]])
    assert [item.index for item in many.data] == [0, 1]
    assert many.data[0].embedding == pytest.approx(text.data[0].embedding, abs=1e-5)
    refused = http.post("/v1/embeddings", json={"input": [n_vocab + 5]})
    assert refused.status_code == 400
    assert "not in the model's vocabulary" in refused.json()["error"]["message"]


@pytest.fixture(scope="module")
def front(
    llama_server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A Reef on the upstream engine whose upstream is the llama.cpp Reef."""
    folder: Path = tmp_path_factory.mktemp("front")
    env = {"REEF_TOKEN": TOKEN, "REEF_UPSTREAM_API_KEY": TOKEN}
    server = reef_serve(
        folder,
        free_port(),
        "--engine",
        "upstream",
        "--upstream-url",
        f"{llama_server.url}/v1",
        env=env,
    )
    with server.start():
        yield server


def test_upstream_forwards_text_completions_and_embeddings(front: ServerProcess) -> None:
    client = OpenAI(base_url=front.url + "/v1", api_key=TOKEN, max_retries=0)
    raw = client.completions.with_raw_response.create(model="default", prompt="Hello", max_tokens=3)
    assert raw.parse().choices[0].text
    assert raw.headers["x-reef-agent-record-id"].startswith("rec_")
    embedded = client.embeddings.create(model="default", input="hello")
    assert len(embedded.data[0].embedding) > 100
    with pytest.raises(openai.BadRequestError, match="forwards text completions whole"):
        client.completions.create(model="default", prompt="Hi", max_tokens=2, stream=True)
