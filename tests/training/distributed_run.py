"""One rank of `test_distributed.py`'s torchrun test: `torchrun ... distributed_run.py job.json`.

Loads the tiny model, trains with the job's settings (every rank calls `train_lora`, which joins
torchrun's group), and saves this rank's losses and adapter weights to the job's `out`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from reef.training import LoraSettings, TrainingExample, load_base, train_lora


def main(job_file: str) -> None:
    job = json.loads(Path(job_file).read_text())
    torch.set_num_threads(1)
    base = load_base(Path(job["model"]), Path(job["cache"]))
    examples = [TrainingExample(prompt, completion) for prompt, completion in job["examples"]]
    trained = train_lora(base, examples, LoraSettings(**job["settings"]))
    weights = {
        name: p.detach().clone() for name, p in trained.model.named_parameters() if p.requires_grad
    }
    out = job["out"].format(rank=os.environ["RANK"])
    torch.save({"losses": trained.losses, "weights": weights}, out)


if __name__ == "__main__":
    main(sys.argv[1])
