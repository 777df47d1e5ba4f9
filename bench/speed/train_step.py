"""One LoRA training step on the embedded model: Reef's trainer against plain peft, same settings.

    .venv/bin/python -m bench.speed.train_step [--steps 3] [--threads 1|2|auto]

Both train a rank-8 LoRA on q/k/v/o of SmolLM2-135M (dequantised from the served GGUF, cached),
with AdamW at the same learning rate, on the same batch of 4 examples of 128 tokens (64 prompt,
64 completion), for the same number of steps, after one warm-up step each. The baseline is a
plain peft loop (`get_peft_model`, labels with the prompt masked, `loss.backward()`). Printed:
seconds per step, completion tokens per second, peak memory, and Reef's ratio to the baseline.
With `--threads auto` the baseline runs on every CPU and Reef's trainer chooses each step's
count (`LoraSettings.threads`), as the recipes do by default.
"""

from __future__ import annotations

import argparse
import copy
import resource
import tempfile
import time
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model

from reef.engines.llamacpp import embedded_model_path
from reef.threads import available_cpus
from reef.training import LoraSettings, TrainingExample, load_base, train_lora

PROMPT, COMPLETION, BATCH = 64, 64, 4


def examples(vocab: int) -> list[TrainingExample]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(100, vocab - 100, (BATCH, PROMPT + COMPLETION), generator=generator)
    return [TrainingExample(row[:PROMPT].tolist(), row[PROMPT:].tolist()) for row in ids]


def reef_seconds_per_step(base, batch, steps: int, threads) -> float:  # type: ignore[no-untyped-def]
    settings = LoraSettings(
        steps=steps + 1, batch_size=BATCH, max_length=PROMPT + COMPLETION, threads=threads
    )
    times: list[float] = []
    last = [time.perf_counter()]

    def on_step(_step: int, _loss: float) -> None:
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now

    train_lora(base, batch, settings, on_step=on_step)
    return sum(times[1:]) / steps  # the first step warms up


def peft_seconds_per_step(base, batch, steps: int) -> float:  # type: ignore[no-untyped-def]
    config = LoraConfig(
        r=8,
        lora_alpha=16,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
    )
    model = get_peft_model(copy.deepcopy(base.model), config)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-4)
    inputs = torch.tensor([e.prompt_ids + e.completion_ids for e in batch])
    labels = inputs.clone()
    labels[:, :PROMPT] = -100
    times = []
    for _ in range(steps + 1):
        started = time.perf_counter()
        loss = model(input_ids=inputs, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - started)
    return sum(times[1:]) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", default="1", help="a count, or auto")
    args = parser.parse_args()
    threads = "auto" if args.threads == "auto" else int(args.threads)
    torch.set_num_threads(available_cpus() if threads == "auto" else threads)
    cache = Path(tempfile.gettempdir()) / "reef-bench-base"
    started = time.perf_counter()
    base = load_base(embedded_model_path(), cache)
    print(f"base loaded in {time.perf_counter() - started:.1f} s (cached in {cache})")
    batch = examples(base.model.config.vocab_size)
    baseline = peft_seconds_per_step(base, batch, args.steps)
    reef = reef_seconds_per_step(base, batch, args.steps, threads)
    tokens = BATCH * COMPLETION
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{'':22}{'s/step':>8}{'tokens/s':>10}")
    print(f"{'plain peft (baseline)':22}{baseline:>8.2f}{tokens / baseline:>10.1f}")
    print(f"{'reef.training':22}{reef:>8.2f}{tokens / reef:>10.1f}")
    print(f"ratio reef / peft: {baseline / reef:.2f}x throughput; peak memory {peak:.0f} MiB")


if __name__ == "__main__":
    main()
