"""`reef model prepare|forget`: serving the model in the weight format that is fastest here."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from reef.cli.options import ConfigOption, project_config
from reef.cli.output import console, fail
from reef.config import ReefConfig
from reef.engines import resolve_kind, served_model_path
from reef.engines.llamacpp.convert import FORMATS
from reef.engines.llamacpp.prepare import AUTO_FORMATS, DEFAULT_DECODE_FLOOR, DEFAULT_MAX_DRIFT
from reef.errors import ReefError
from reef.threads import available_cpus

app = typer.Typer(
    help="The served model's weights: a copy in a format faster on this machine.",
    no_args_is_help=True,
)


def _source(config: Path | None) -> tuple[ReefConfig, Path]:
    resolved = project_config(config)
    kind, _ = resolve_kind(resolved.engine)
    source = served_model_path(resolved.engine) if kind == "llamacpp" else None
    if source is None or not source.is_file():
        fail(f"reef model works on a llama.cpp GGUF file; this project serves on {kind}", code=2)
    return resolved, source


@app.command("prepare")
def prepare(
    formats: Annotated[
        list[str] | None,
        typer.Option(
            "--format",
            help=f"A format to try ({', '.join(FORMATS)}); repeat it for more. "
            f"Default: {', '.join(AUTO_FORMATS)}.",
        ),
    ] = None,
    max_drift: Annotated[
        float,
        typer.Option(
            help="The mean |difference| of the top token's log-probability, in nats, a copy may "
            "show against the file on the probe prompts.",
        ),
    ] = DEFAULT_MAX_DRIFT,
    decode_floor: Annotated[
        float,
        typer.Option(
            help="The share of the file's decode tokens/s a copy must reach (below 1: trade "
            "decode speed for prompt speed, as agents' long prompts gain).",
        ),
    ] = DEFAULT_DECODE_FLOOR,
    threads: Annotated[int | None, typer.Option(help="Threads (default: the config's).")] = None,
    config: ConfigOption = None,
) -> None:
    """Convert the served GGUF into faster formats, time them and compare their answers with the
    file's; keep the fastest that stays within the bounds for `reef serve` to load."""
    from reef.engines.llamacpp.prepare import prepare as run_prepare

    resolved, source = _source(config)
    chosen = formats or list(AUTO_FORMATS)
    unknown = [kind for kind in chosen if kind not in FORMATS]
    if unknown:
        fail(f"unknown format {unknown[0]!r}: choose among {', '.join(FORMATS)}", code=2)
    n_threads = threads or resolved.engine.llamacpp.n_threads or available_cpus()
    try:
        with console.status(f"preparing {source.name}") as status:
            kept, trials, source_speed = run_prepare(
                source,
                resolved.state_dir,
                chosen,
                n_threads,
                max_drift=max_drift,
                decode_floor=decode_floor,
                progress=lambda message: status.update(message),
            )
    except ReefError as error:
        fail(error.message)
    table = Table(
        title=f"{source.name}: prompt {source_speed.prompt_tokens_per_s:.0f} tokens/s, "
        f"decode {source_speed.decode_tokens_per_s:.0f} tokens/s"
    )
    for header in ("format", "prompt", "decode", "same answers", "drift (nats)", "MB", "kept"):
        table.add_column(header, justify="left" if header in ("format", "kept") else "right")
    for trial in trials:
        table.add_row(
            trial.format,
            f"{trial.speed.prompt_tokens_per_s / source_speed.prompt_tokens_per_s:.2f}x",
            f"{trial.speed.decode_tokens_per_s / source_speed.decode_tokens_per_s:.2f}x",
            f"{trial.drift.identical_answers}/{trial.drift.probes}",
            f"{trial.drift.mean_abs_logprob_diff:.3f}",
            f"{trial.size_bytes / 1e6:.0f}",
            "yes" if kept is not None and trial.format == kept.format else f"no: {trial.refused}",
        )
    console.print(table)
    if kept is None:
        console.print("no format is faster here within the bounds: reef serve loads the file")
        return
    console.print(
        f"reef serve now loads {kept.path} ({kept.format}, written in {kept.conversion_s:.1f} s); "
        "`reef model forget` goes back to the file",
        highlight=False,
        soft_wrap=True,
    )


@app.command("forget")
def forget(config: ConfigOption = None) -> None:
    """Delete the prepared copy: `reef serve` loads the configured file again."""
    from reef.engines.llamacpp.prepare import forget as forget_copy

    resolved, source = _source(config)
    removed = forget_copy(source, resolved.state_dir)
    console.print(f"removed {removed}" if removed else f"no prepared copy of {source.name}")
