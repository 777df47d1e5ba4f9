"""The trainer's tokenizer must give the token ids llama.cpp gives, or training misses its target.

The engine renders a chat prompt and tokenizes it with llama.cpp (`add_bos` as the vocabulary
says, special tokens parsed). The trainer tokenizes the same texts with transformers. Both are
compared here on real texts before training, and training is refused when they differ.

llama.cpp is opened with `vocab_only=True`: the vocabulary loads (under a second for SmolLM2),
the weights do not.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from reef.errors import BadRequest


class TokenizerMismatch(BadRequest):
    """The trainer's tokenizer splits a text differently from the serving engine's."""

    code = "tokenizer_mismatch"


@contextmanager
def engine_vocab(gguf_path: Path) -> Iterator[Any]:
    """llama.cpp's vocabulary of `gguf_path`, without its weights."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf_path), vocab_only=True, verbose=False)
    try:
        yield llm
    finally:
        llm.close()


def engine_ids(llm: Any, text: str) -> list[int]:
    """The ids the engine serves for `text`: BOS if the vocabulary adds one, specials parsed."""
    return list(llm.tokenize(text.encode("utf-8"), add_bos=True, special=True))


def trainer_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """The ids the trainer gets for `text`, with the special tokens its tokenizer adds."""
    return list(tokenizer(text)["input_ids"])


def check_tokenizer(
    tokenizer: PreTrainedTokenizerBase, gguf_path: Path, samples: list[str]
) -> None:
    """Raise TokenizerMismatch unless `tokenizer` gives llama.cpp's ids for every sample."""
    with engine_vocab(gguf_path) as llm:
        for number, text in enumerate(samples):
            ours, theirs = trainer_ids(tokenizer, text), engine_ids(llm, text)
            if ours != theirs:
                raise TokenizerMismatch(_describe(number, text, ours, theirs, gguf_path))


def align_tokenizer(tokenizer: PreTrainedTokenizerBase, gguf_path: Path) -> None:
    """Give a GGUF-loaded tokenizer the special tokens llama.cpp reads from the same file.

    transformers' GGUF loader gets some of them wrong: for SmolLM2 it makes `<|im_start|>` the
    EOS token (llama.cpp: `<|im_end|>`) and adds a BOS token that the file says not to add.
    """
    with engine_vocab(gguf_path) as llm:
        bos, eos = llm.token_bos(), llm.token_eos()
        probe = llm.tokenize(b"a", add_bos=True, special=True)
        adds_bos = bos >= 0 and len(probe) > 0 and probe[0] == bos
        names = {token: _piece(llm, token) for token in (bos, eos) if token >= 0}
    if eos in names:
        tokenizer.eos_token = names[eos]
    if bos in names:
        tokenizer.bos_token = names[bos]
    if tokenizer.pad_token is None and eos in names:
        tokenizer.pad_token = names[eos]
    if hasattr(tokenizer, "add_bos_token"):
        tokenizer.add_bos_token = adds_bos  # the Llama tokenizers rebuild their post-processor


def encode_completion(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """A demonstration's completion ids: the text without BOS, then the model's end of turn.

    The end of turn is the EOS token: the engine stops there (`<|im_end|>` for SmolLM2), so a
    trained completion ends the way a served one does.
    """
    eos = tokenizer.eos_token_id
    if eos is None:
        raise BadRequest("the tokenizer has no EOS token to end a completion with")
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return [*ids, int(eos)]


def _piece(llm: Any, token: int) -> str:
    return bytes(llm.detokenize([token], special=True)).decode("utf-8", errors="replace")


def _describe(number: int, text: str, ours: list[int], theirs: list[int], gguf: Path) -> str:
    at = next(
        (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
        min(len(ours), len(theirs)),
    )
    shown = text if len(text) <= 80 else text[:77] + "..."
    return (
        f"the trainer's tokenizer does not match llama.cpp's for {gguf.name}: sample {number} "
        f"{shown!r} differs at token {at}: trainer {ours[at : at + 8]} "
        f"(of {len(ours)} ids), llama.cpp {theirs[at : at + 8]} (of {len(theirs)} ids). "
        "Train with the tokenizer from the served model's own file (load_base does this)."
    )
