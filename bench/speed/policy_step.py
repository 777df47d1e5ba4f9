"""One policy update of the RL recipes, on the CPU and (where there is one) on the GPU.

    .venv/bin/python -m bench.speed.policy_step [--steps 2] [--rollouts 8] [--threads N]

The update `tttd` makes each step: `train_policy` on `--rollouts` rollouts of 300 prompt and 260
completion tokens (a 26-circle packing), with a rank-8 LoRA on q/k/v/o, on a randomly initialised
model of SmolLM2-135M's shape (no download: the weights' values do not change the time). The
baseline is the same update on the CPU, measured in the same run. Printed per device: the
reference pass (old and base log-probs), seconds per gradient step, completion tokens per second,
and the GPU's speed-up over the CPU.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from reef.testing.tiny import tiny_tokenizer
from reef.training import Base, PolicyExample, PolicySettings, train_policy

PROMPT, COMPLETION = 300, 260
SMOLLM2_135M = LlamaConfig(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)


def base_on(device: str) -> Base:
    torch.manual_seed(0)
    model = LlamaForCausalLM(SMOLLM2_135M).to(device).eval()
    here = Path(".")
    return Base(model=model, tokenizer=tiny_tokenizer(), source=here, weights=here, gguf=None)


def rollouts(count: int) -> list[PolicyExample]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 49000, (count, PROMPT + COMPLETION), generator=generator)
    advantages = torch.linspace(-1.0, 2.0, count).tolist()
    return [
        PolicyExample.sequence(row[:PROMPT].tolist(), row[PROMPT:].tolist(), advantage)
        for row, advantage in zip(ids, advantages, strict=True)
    ]


def measure(device: str, examples: list[PolicyExample], steps: int) -> dict[str, float]:
    base = base_on(device)
    stamps: list[float] = []
    settings = PolicySettings(steps=steps, max_length=PROMPT + COMPLETION)
    started = time.perf_counter()
    trained = train_policy(
        base, examples, settings, on_step=lambda _s, _l: stamps.append(time.perf_counter())
    )
    if device == "cuda":
        torch.cuda.synchronize()
    per_step = (stamps[-1] - stamps[0]) / (steps - 1) if steps > 1 else trained.seconds
    reference = stamps[0] - started - per_step  # the copy, the LoRA and the reference pass
    return {
        "per_step": per_step,
        "reference": reference,
        "tokens_per_s": len(examples) * COMPLETION / per_step,
        "peak_gpu_gb": (trained.peak_gpu_bytes or 0) / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    examples = rollouts(arguments.rollouts)
    devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    figures = {}
    for device in devices:
        figures[device] = measure(device, examples, arguments.steps)
        f = figures[device]
        print(
            f"{device:>4}: {f['per_step']:.3f} s per gradient step, {f['tokens_per_s']:.0f} "
            f"completion tokens/s, setup + reference pass {f['reference']:.2f} s"
            + (f", peak GPU memory {f['peak_gpu_gb']:.2f} GB" if device == "cuda" else ""),
            flush=True,
        )
    if "cuda" in figures:
        speedup = figures["cpu"]["per_step"] / figures["cuda"]["per_step"]
        print(
            f"GPU ({torch.cuda.get_device_name()}) vs CPU ({arguments.threads} threads): "
            f"{speedup:.1f}x faster per gradient step"
        )


if __name__ == "__main__":
    main()
