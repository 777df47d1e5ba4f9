"""Data-parallel LoRA and policy training over several processes, with `torch.distributed` (gloo).

`train_lora` and `train_policy` come here when `settings.processes` is above 1. There are two
ways to get the processes (ranks):

- **Reef starts them**: a plain process calls `train_lora(base, examples, settings)`; Reef starts
  `processes` local ranks (`torch.multiprocessing`, forked from a server that imported the
  training modules once, or spawned where the platform has no forkserver), each joins a gloo
  group on 127.0.0.1 and a free port, and the caller gets rank 0's adapter back on a copy of its
  own base, with `on_step` called in the caller as rank 0 reports each step. The base's tensors
  reach the ranks through shared memory (torch moves them there), not by loading the model
  again. As with any spawn, a script that trains must guard its entry point
  (`if __name__ == "__main__"`).
- **A launcher started them** (`torchrun`, `accelerate launch`): RANK, WORLD_SIZE, MASTER_ADDR and
  MASTER_PORT are set (or a process group is already up), every rank calls `train_lora` with the
  same examples and settings, and the ranks join that group instead of spawning; WORLD_SIZE must
  equal `processes`. Every rank returns the same adapter and calls `on_step` with the same
  losses: export from rank 0.

Each step, every rank draws the same batch as the single-process run would (the same seeded
order, `adapter.batches`), takes its contiguous shard of it (`shard`: sizes differ by at most one,
a rank may get none), and computes its part of the loss. The single-process loss is a mean over
the batch's *examples* (each example's loss a mean over its completion tokens, `loss.py`), so a
rank's part is the sum of `weight * loss` over its shard divided by the whole batch's size
(`shard_loss`): the parts add up to the single-process loss, and their gradients to its
gradient. One all-reduce per step sums the gradients and the loss (`Group.synchronise`), then
every rank takes the same AdamW step. Averaging the ranks' own means instead would be wrong
whenever the shards differ in size (3 examples over 2 ranks), and weighting ranks by their token
counts would be wrong whenever examples differ in length; the tests check both. The policy loss
is a mean over the examples that have trained tokens, so there a rank's part divides by that
count over the whole batch (summed once, at the start).

Determinism: every rank seeds as the single-process run does (`settings.seed`) and builds the
same LoRA, and rank 0's initial adapter weights are broadcast anyway (a resumed adapter too), so
all ranks start equal and stay equal. After that each rank reseeds torch with `seed + rank`, so
that LoRA dropout draws different masks on different ranks (with dropout the update is then not
the single-process one, only as random; without dropout it is the same up to float rounding).

Data parallelism here runs on the CPU: a base on a GPU is refused (there one process trains,
through Unsloth where it is installed; Unsloth is never distributed). Across machines it is
whatever the launcher provides: torchrun's nodes join one group, and gloo carries the tensors.
"""

from __future__ import annotations

import io
import os
import queue as queues
import socket
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from peft import PeftModel

from reef.errors import BadRequest
from reef.training.adapter import (
    LoraSettings,
    OnStep,
    TrainedAdapter,
    load_lora,
    new_lora,
    peft_folder,
    seed_everything,
)
from reef.training.base import Base
from reef.training.loss import Batch, example_losses

__all__ = [
    "Group",
    "finish_rank",
    "in_parallel",
    "joined_group",
    "launched",
    "shard",
    "shard_loss",
    "start_model",
]

# How long the caller waits for rank 0's result once every rank has exited.
RESULT_WAIT_S = 60.0


@dataclass
class Group:
    """This process's place among the ranks, and the gloo group their collectives run on."""

    rank: int
    size: int
    handle: dist.ProcessGroup | None = None  # None: the default group

    def all_reduce(self, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM) -> torch.Tensor:
        dist.all_reduce(tensor, op=op, group=self.handle)
        return tensor

    def broadcast(self, parameters: Sequence[torch.Tensor]) -> None:
        """Every rank's `parameters` become rank 0's."""
        with torch.no_grad():
            for parameter in parameters:
                dist.broadcast(parameter.data, src=0, group=self.handle)

    def synchronise(
        self, parameters: Sequence[torch.nn.Parameter], loss: torch.Tensor
    ) -> torch.Tensor:
        """After each rank's backward: sum the gradients and the loss over the ranks, in one
        all-reduce. Each rank's part is already scaled to the whole batch (`shard_loss`), so the
        sums are the single-process gradient and loss (a parameter without a gradient counts
        as zeros). Returns the whole batch's loss."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
        flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1).to(grads[0])])
        self.all_reduce(flat)
        offset = 0
        for parameter, grad in zip(parameters, grads, strict=True):
            count = grad.numel()
            parameter.grad = flat[offset : offset + count].view_as(grad).clone()
            offset += count
        return flat[offset].clone()


def shard(items: Sequence[int], rank: int, size: int) -> list[int]:
    """Rank `rank`'s contiguous part of `items` among `size` ranks: the first `len % size` ranks
    take one more (5 over 2: 3 and 2; 1 over 2: 1 and none)."""
    count, extra = divmod(len(items), size)
    start = rank * count + min(rank, extra)
    return list(items[start : start + count + (1 if rank < extra else 0)])


def shard_loss(model: torch.nn.Module, batch: Batch, batch_size: int) -> torch.Tensor:
    """This rank's part of the batch loss: its examples' `weight * loss` summed, divided by the
    whole batch's size, so that the ranks' parts sum to `loss.batch_loss` of the whole batch."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    return (example_losses(logits, batch) * batch.weights).sum() / batch_size


def launched() -> bool:
    """Whether a launcher started this process as one rank of several (torchrun and accelerate
    set RANK and WORLD_SIZE), or a process group is already up."""
    if dist.is_available() and dist.is_initialized():
        return True
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def in_parallel(
    rank_job: RankJob,
    base: Base,
    examples: list[Any],
    settings: LoraSettings,
    on_step: OnStep | None,
    resume_from: Path | None,
) -> TrainedAdapter:
    """`rank_job` on each rank: in the launcher's group (torchrun), or on ranks started here."""
    _check(base, settings.processes, resume_from)
    if launched():
        with joined_group(settings.processes) as group:
            return rank_job(group, base, examples, settings, resume_from, on_step)
    payload = _spawn(rank_job, settings.processes, (base, examples, settings, resume_from), on_step)
    return _rebuild(base, settings, resume_from, payload)


# What every rank does around its job.


def start_model(
    group: Group, base: Base, settings: LoraSettings, resume_from: Path | None
) -> PeftModel:
    """The same LoRA on every rank: seeded as one process seeds it, then rank 0's weights."""
    seed_everything(settings.seed)
    model = load_lora(base, resume_from) if resume_from is not None else new_lora(base, settings)
    group.broadcast([p for p in model.parameters() if p.requires_grad])
    torch.manual_seed(settings.seed + group.rank)  # dropout masks differ from rank to rank
    return model


def finish_rank(group: Group, trained: TrainedAdapter) -> TrainedAdapter:
    """The largest peak resident memory of any rank, on every rank."""
    peak = group.all_reduce(torch.tensor(trained.peak_memory_bytes), dist.ReduceOp.MAX)
    trained.peak_memory_bytes = int(peak)
    return trained


# The process group: joined (a launcher's) or made here (spawned ranks).


@contextmanager
def joined_group(processes: int) -> Iterator[Group]:
    """The launcher's group as a `Group` of `processes` ranks (WORLD_SIZE must say as many).

    Reef starts the default group (gloo, from the environment) when none is up, and ends it
    after; in a group someone else started (accelerate's, perhaps NCCL) the collectives run on a
    gloo group made for this run, as the tensors here are on the CPU."""
    started = not dist.is_initialized()
    if started:
        size = int(os.environ["WORLD_SIZE"])
        if size != processes:
            raise BadRequest(
                f"processes is {processes} but the launcher started {size} ranks (WORLD_SIZE): "
                "set processes to the number of ranks"
            )
        dist.init_process_group("gloo")
    size = dist.get_world_size()
    if size != processes:
        raise BadRequest(
            f"processes is {processes} but the process group has {size} ranks: "
            "set processes to the number of ranks"
        )
    handle = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    try:
        yield Group(rank=dist.get_rank(), size=size, handle=handle)
    finally:
        if handle is not None:
            dist.destroy_process_group(handle)
        if started:
            dist.destroy_process_group()


Payload = dict[str, Any]
RankJob = Callable[..., TrainedAdapter]


def _spawn(job: RankJob, processes: int, args: tuple[Any, ...], on_step: OnStep | None) -> Payload:
    """Run `job(group, *args, on_step)` on `processes` local ranks started here; rank 0's result.

    Rank 0 reports each step's loss over a queue, and `on_step` is called here as they come.
    A rank that fails ends the others, and its traceback is raised here
    (`torch.multiprocessing.ProcessRaisedException`)."""
    method = _start_method(job)
    messages = mp.get_context(method).Queue()
    port = _free_port()
    threads = max(1, torch.get_num_threads() // processes)  # the ranks share this process's CPUs
    ranks = mp.start_processes(
        _rank_main,
        args=(processes, port, threads, messages, job, args),
        nprocs=processes,
        join=False,
        start_method=method,
    )
    result: Payload | None = None
    try:
        while True:
            result = _read(messages, on_step, result, wait=0.05)
            if ranks.join(timeout=0.05):
                break
        while result is None:
            result = _read(messages, on_step, result, wait=RESULT_WAIT_S, required=True)
    finally:
        for process in ranks.processes:
            if process.is_alive():
                process.terminate()
                process.join()
    return result


# What a rank imports: loaded once by the fork server, not by every rank of every run.
RANK_MODULES = ["reef.training.lora", "reef.training.policy", "reef.training.distill"]


def _start_method(job: RankJob) -> str:
    """forkserver where the platform has it: the ranks fork from a server process that imported
    torch, transformers and peft once (about 5 s of CPU a rank, each run, when spawned afresh).
    The server only imports, never trains, so no torch thread pool is running when a rank
    forks; it lives as long as this process. It starts with the environment of the first run
    (OMP_WAIT_POLICY, read as torch loads, is the learning worker's from its start), and ranks
    set their thread count themselves. Where there is no forkserver (Windows): spawn."""
    if "forkserver" not in mp.get_all_start_methods():
        return "spawn"
    # Read when the server starts, once per process: the first job's module is loaded too.
    mp.set_forkserver_preload(list(dict.fromkeys([*RANK_MODULES, job.__module__])))
    return "forkserver"


def _read(
    messages: Any,
    on_step: OnStep | None,
    result: Payload | None,
    wait: float,
    required: bool = False,
) -> Payload | None:
    """Handle the messages waiting on the queue (the first within `wait` seconds)."""
    try:
        message = messages.get(timeout=wait)
    except queues.Empty:
        if required:
            raise RuntimeError("the ranks exited without rank 0's result") from None
        return result
    while True:
        kind, body = message
        if kind == "step":
            if on_step is not None:
                on_step(*body)
        else:
            result = body
        try:
            message = messages.get_nowait()
        except queues.Empty:
            return result


def _rank_main(
    index: int,
    processes: int,
    port: int,
    threads: int,
    messages: Any,
    job: RankJob,
    args: tuple[Any, ...],
) -> None:
    """One spawned rank: join the group on 127.0.0.1:`port`, run the job, send back rank 0's
    adapter weights and figures."""
    torch.set_num_threads(threads)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=index, world_size=processes
    )
    try:
        report = (lambda step, loss: messages.put(("step", (step, loss)))) if index == 0 else None
        trained = job(Group(rank=index, size=processes), *args, report)
        if index == 0:
            messages.put(("result", _payload(trained)))
    finally:
        dist.destroy_process_group()


def _payload(trained: TrainedAdapter) -> Payload:
    """The trained adapter's weights (torch.save bytes: no shared memory that dies with the
    rank) and its figures."""
    weights = {
        name: parameter.detach().cpu()
        for name, parameter in trained.model.named_parameters()
        if parameter.requires_grad
    }
    buffer = io.BytesIO()
    torch.save(weights, buffer)
    return {
        "weights": buffer.getvalue(),
        "losses": trained.losses,
        "seconds": trained.seconds,
        "peak_memory_bytes": trained.peak_memory_bytes,
    }


def _rebuild(
    base: Base, settings: LoraSettings, resume_from: Path | None, payload: Payload
) -> TrainedAdapter:
    """Rank 0's adapter on a copy of the caller's base, in eval mode."""
    seed_everything(settings.seed)
    model = load_lora(base, resume_from) if resume_from is not None else new_lora(base, settings)
    weights = torch.load(io.BytesIO(payload["weights"]), weights_only=True)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.requires_grad:
                parameter.copy_(weights[name])
    model.eval()
    return TrainedAdapter(
        model=model,
        losses=list(payload["losses"]),
        peak_memory_bytes=int(payload["peak_memory_bytes"]),
        seconds=float(payload["seconds"]),
        backend="peft",
        settings=settings,
    )


def _check(base: Base, processes: int, resume_from: Path | None) -> None:
    """Refuse here, in the caller, what every rank would refuse."""
    if resume_from is not None:
        peft_folder(resume_from)
    device = device_of(base.model)
    if device.type != "cpu":
        raise BadRequest(
            f"data-parallel training (processes {processes}) runs on the CPU, with gloo; the "
            f"base is on {device}: train in one process there (processes 1)"
        )


def device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def pad_id(base: Base) -> int:
    pad = base.tokenizer.pad_token_id
    return int(pad) if pad is not None else 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
