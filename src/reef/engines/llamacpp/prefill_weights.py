"""Which weights read prompts (`engine.llamacpp.prefill_weights`): the served ones, a copy made
once from them in a format faster for prompts, or a file the user names (see handover.py).

`auto` writes the served GGUF in each of `CANDIDATES` (llama.cpp's own conversion, about a
second each for the embedded model) into the machine's cache, named by the file's path, size
and time, and times one prompt on each and on the served file. The fastest copy reads prompts if
it is at least `MIN_SPEED_UP` times as fast as the served weights; the others are deleted, and
the verdict is kept beside the copy for the next start. Both candidates hold every weight of a
4- or 8-bit file exactly (F32) or to within rounding (BF16); which is faster depends on the
CPU's kernels, which the timing finds out. No copy is made of a 16- or 32-bit file, which reads
prompts at its best already, nor one that would take more than `MEMORY_SHARE` of the memory
free: two copies of a large model are for the user to decide on, by naming a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from reef.errors import EngineUnavailable, ReefError
from reef.user_cache import user_cache_dir

log = logging.getLogger("reef.engine")

PrefillSetting = Literal["auto", "same"] | Path
CANDIDATES = {"bf16": 2, "f32": 4}  # formats tried, and their bytes per weight
MIN_SPEED_UP = 1.15  # the copy must read prompts this much faster to be worth a hand-over
PROBE_BLOCKS = 4  # 64-token blocks timed on each copy, after one that pages the weights in
MEMORY_SHARE = 0.5  # a copy may take at most this share of the memory free when it is made
VERDICT = "verdict.json"


def cache_dir() -> Path:
    """Where copies made for reading prompts are kept, for every project of the machine."""
    return user_cache_dir() / "prefill"


def parse_setting(value: str) -> PrefillSetting:
    """The setting as configured: auto, same, or a path (`~` expanded)."""
    if value in ("auto", "same"):
        return value  # type: ignore[return-value]
    return Path(value).expanduser()


def prefill_path(
    served: Path, setting: PrefillSetting, model: Any, n_threads: int, folder: Path | None = None
) -> Path | None:
    """The GGUF whose weights should read prompts for `served` (loaded as `model`), or None
    for the served weights themselves."""
    if setting == "same":
        return None
    if isinstance(setting, Path):
        if not setting.is_file():
            raise EngineUnavailable(
                f"engine.llamacpp.prefill_weights names {setting}, which is not a file: name a "
                "GGUF of the same model, or set auto or same"
            )
        return setting
    return _auto(served, model, n_threads, folder or cache_dir())


def undecided(served: Path, setting: PrefillSetting, folder: Path | None = None) -> bool:
    """Whether `auto` has yet to make and time its copies of `served` on this machine (its
    first start here): the engine then serves on the served weights while they are made."""
    if setting != "auto":
        return False
    return read_verdict(_place(served, folder or cache_dir()) / VERDICT) is None


def _place(served: Path, folder: Path) -> Path:
    return folder / f"{served.stem}-{_identity(served)}"


def _auto(served: Path, model: Any, n_threads: int, folder: Path) -> Path | None:
    import llama_cpp

    weights = llama_cpp.llama_model_n_params(model.model)
    if served.stat().st_size >= 1.9 * weights:
        log.info("llama.cpp: %s reads prompts on its own weights (16-bit or more)", served.name)
        return None
    place = _place(served, folder)
    verdict = read_verdict(place / VERDICT)
    if verdict is None:
        try:
            place.mkdir(parents=True, exist_ok=True)
            with _locked(place / ".lock"):  # engines starting together make the copies once
                verdict = read_verdict(place / VERDICT) or _choose(
                    served, place, weights, n_threads
                )
        # A copy that cannot be made or timed (llama.cpp raises ValueError for a file it cannot
        # load, RuntimeError for a read that fails) stops no serving.
        except (OSError, ValueError, RuntimeError, ReefError) as error:
            log.warning(
                "llama.cpp: no copy of %s to read prompts (%s): the served weights read them",
                served.name,
                error,
            )
            return None
    chosen, served_rate = verdict["chosen"], verdict["served_tokens_per_s"]
    if chosen is None:
        log.info(
            "llama.cpp: no copy of %s reads prompts %.2fx as fast as it here (%s against %.0f "
            "tokens/s): the served weights read them",
            served.name,
            MIN_SPEED_UP,
            _rates(verdict),
            served_rate,
        )
        return None
    log.info(
        "llama.cpp: prompts are read on a %s copy of %s (%s against %.0f tokens/s) and handed "
        "over to its own weights to decode (engine.llamacpp.prefill_weights)",
        chosen,
        served.name,
        _rates(verdict),
        served_rate,
    )
    return place / f"{chosen}.gguf"


def _choose(served: Path, place: Path, weights: int, n_threads: int) -> dict[str, Any]:
    """Write each candidate that fits, time it, keep the fastest worth it; the verdict."""
    from reef.engines.llamacpp.convert import convert

    free = _free_memory()
    rates: dict[str, float] = {}
    short_of_memory = False
    for kind, width in CANDIDATES.items():
        if free is not None and width * weights > MEMORY_SHARE * free:
            short_of_memory = True
            log.warning(
                "llama.cpp: no %s copy of %s to read prompts: it would take %.1f GB of the %.1f "
                "GB free",
                kind,
                served.name,
                width * weights / 1e9,
                free / 1e9,
            )
            continue
        copy = place / f"{kind}.gguf"
        partial = place / f"{kind}.partial-{os.getpid()}"  # no lock without fcntl: never shared
        convert(served, kind, partial, n_threads)
        os.replace(partial, copy)
        rates[kind] = prompt_rate(copy, n_threads)
    served_rate = prompt_rate(served, n_threads)
    fastest = max(rates, key=rates.__getitem__, default=None)
    chosen = fastest if fastest and rates[fastest] >= MIN_SPEED_UP * served_rate else None
    for kind in rates:
        if kind != chosen:
            (place / f"{kind}.gguf").unlink(missing_ok=True)
    verdict = {"served_tokens_per_s": served_rate, "copies_tokens_per_s": rates, "chosen": chosen}
    if short_of_memory and chosen is None:
        return verdict  # not kept: a later start, with more memory free, tries again
    partial = place / f"{VERDICT}.partial-{os.getpid()}"
    partial.write_text(json.dumps(verdict, indent=2) + "\n")
    os.replace(partial, place / VERDICT)
    return verdict


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (where the platform has file locks)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: engines starting together may each make the copies
        yield
        return
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _rates(verdict: dict[str, Any]) -> str:
    rates = verdict["copies_tokens_per_s"]
    return ", ".join(f"{kind} {rate:.0f}" for kind, rate in rates.items()) or "none made"


def prompt_rate(path: Path, n_threads: int) -> float:
    """Prompt tokens/s of `path`'s weights in the engine's blocks and cache types."""
    from reef.engines.llamacpp.context import batch_context, read_blocks
    from reef.engines.llamacpp.slots import BLOCK
    from reef.engines.llamacpp.weights import load_model

    model = load_model(path)
    context = batch_context(model, (PROBE_BLOCKS + 1) * BLOCK, 1, n_threads)
    tokens = list(range(1000, 1000 + (PROBE_BLOCKS + 1) * BLOCK))
    try:
        read_blocks(context.ctx, tokens[:BLOCK], BLOCK)  # pages the weights in
        started = time.perf_counter()
        read_blocks(context.ctx, tokens[BLOCK:], BLOCK, start=BLOCK)
        return PROBE_BLOCKS * BLOCK / (time.perf_counter() - started)
    except RuntimeError as error:
        raise EngineUnavailable(f"{path.name}: {error}") from error
    finally:
        context.close()
        model.close()


def _identity(path: Path) -> str:
    """The served file (its path, size and time) and the llama.cpp that timed its copies: another
    llama.cpp has other kernels, and the verdict is made again."""
    import llama_cpp

    stat = path.stat()
    key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{llama_cpp.__version__}"
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def read_verdict(record: Path) -> dict[str, Any] | None:
    """The verdict kept for these copies, if it reads as one `_choose` writes and its copy is
    still there; anything else (a corrupt or edited file) is no verdict, and is made again."""
    try:
        verdict = json.loads(record.read_text())
        chosen, rates = verdict["chosen"], verdict["copies_tokens_per_s"]
        numbers = [verdict["served_tokens_per_s"], *rates.values()]
        well_formed = (
            set(rates) <= set(CANDIDATES)
            and all(isinstance(n, int | float) and not isinstance(n, bool) for n in numbers)
            and (chosen is None or (chosen in CANDIDATES and chosen in rates))
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not well_formed:
        return None
    if chosen is not None and not (record.parent / f"{chosen}.gguf").is_file():
        return None
    return verdict


def forget_copy(copy: Path) -> None:
    """Drop the verdict that chose `copy` (one `auto` made), so the next start makes it again:
    a copy llama.cpp could not load."""
    (copy.parent / VERDICT).unlink(missing_ok=True)


def _free_memory() -> int | None:
    """Bytes of memory a new allocation can have: Linux's MemAvailable, else the free pages."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
