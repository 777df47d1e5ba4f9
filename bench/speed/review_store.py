"""How fast `reef review` opens and refreshes on a big project: 100,000 records with feedback on
a third of them, and 1,000 candidates with their evaluations.

    .venv/bin/python -m bench.speed.review_store [--records N] [--candidates N]

Builds the store in a temporary folder with the real stores' code, then times, against a plain
`SELECT COUNT(*) FROM records` measured in the same run: opening the source, each tab's read (a
refresh), and the app itself until its first table is drawn (Textual's headless pilot).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reef.config import load_config
from reef.review.local_source import LocalSource
from reef.store import ExperienceStore, Record, Report
from reef.store.candidates import Candidate, CandidateStore
from reef.tui.app import ReviewApp


def build(folder: Path, records: int, candidates: int) -> None:
    (folder / "reef.yaml").write_text("store:\n  synchronous: normal\n")
    with ExperienceStore(folder / ".reef/experience.db", synchronous="normal") as store:
        for start in range(0, records, 5000):
            futures = [
                store.add_record(_record(i)) for i in range(start, min(records, start + 5000))
            ]
            ids = [future.result() for future in futures]
            for done in [store.add_report(_report(i, r)) for i, r in enumerate(ids) if i % 3 == 0]:
                done.result()
        store_candidates = CandidateStore(store)
        for i in range(candidates):
            store_candidates.add(_candidate(i))


def _record(i: int) -> Record:
    return Record(
        scenario="default" if i % 4 else "staging",
        request={"messages": [{"role": "user", "content": f"question {i}: name a colour"}]},
        response={"choices": [{"message": {"role": "assistant", "content": f"answer {i}"}}]},
        engine="llamacpp",
        release_id="base",
        session=str(i),
    )


def _report(i: int, record_id: str) -> Report:
    scenario = "default" if i % 4 else "staging"
    return Report(scenario, [record_id], float(i % 2), "good" if i % 2 else "bad")


def _candidate(i: int) -> Candidate:
    results = [
        {
            "task_id": f"t{t}",
            "current_score": 0.0,
            "candidate_score": 1.0,
            "current_answer": "a" * 200,
            "candidate_answer": "b" * 200,
        }
        for t in range(10)
    ]
    evaluation = {"current_mean": 0.4, "candidate_mean": 0.6, "tasks": 10, "results": results}
    state = ("held", "rejected", "released")[i % 3]
    return Candidate("default", "harness", "/nonexistent", None, state=state, evaluation=evaluation)


def best_ms(work: Callable[[], Any], runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        work()
        times.append((time.perf_counter() - start) * 1000)
    return min(times)


async def first_draw_ms(source: LocalSource) -> float:
    app = ReviewApp(source)
    start = time.perf_counter()
    async with app.run_test(size=(120, 40)) as pilot:
        while app.polls == 0:
            await pilot.pause(0.01)
        return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--candidates", type=int, default=1_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        started = time.perf_counter()
        build(folder, args.records, args.candidates)
        print(
            f"built {args.records} records, {args.candidates} candidates "
            f"in {time.perf_counter() - started:.0f} s"
        )
        os.chdir(folder)
        config = load_config(None)
        source = LocalSource(config)
        baseline = best_ms(lambda: source.store.query("SELECT COUNT(*) AS n FROM records"))
        figures = {
            "open the source": best_ms(lambda: LocalSource(config).close(), runs=3),
            "candidates tab read": best_ms(source.candidates),
            "candidates, held only": best_ms(lambda: source.candidates("held")),
            "scenarios tab read": best_ms(source.scenarios),
            "releases tab read": best_ms(source.releases),
            "records tab read": best_ms(source.records),
            "records search": best_ms(lambda: source.records("question 99999")),
            "app open to first table": statistics.median(
                asyncio.run(first_draw_ms(source)) for _ in range(3)
            ),
        }
        print(f"baseline SELECT COUNT(*) FROM records: {baseline:.1f} ms")
        for name, ms in figures.items():
            print(f"{name:>26}: {ms:7.1f} ms  ({ms / baseline:5.1f}x baseline)")
        source.close()


if __name__ == "__main__":
    main()
