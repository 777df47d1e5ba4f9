"""What "is it learning?" costs each read: a scenario's live pass rates, read cold and read again
with nothing new (the review TUI asks every second, `/metrics` at every scrape).

    .venv/bin/python -m bench.speed.live_progress [--records 2000] [--reads 20]

Builds a store of `--records` calls over four releases, half of them scored, in a temporary
folder, and times in the same run: the baseline, a read as every read was before the figures
were kept (every call decoded and scored by a regex scorer, `--reads` times); reads with nothing
new (kept); and a read after one more report (read again).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from reef.evaluation.live import PROGRESS_CALLS, live_progress, read_progress
from reef.evaluation.tasks import ScorerSpec
from reef.store import ExperienceStore, Record, Report

SCORER = ScorerSpec(type="regex", pattern=r"Cheers\W*$")


def build(store: ExperienceStore, records: int) -> str:
    """`records` calls over four releases, every other one scored; the last call's id."""
    record_id = ""
    for number in range(records):
        record = Record(
            scenario="default",
            request={"messages": [{"role": "user", "content": f"Question {number} " + "x" * 200}]},
            response={
                "choices": [{"message": {"role": "assistant", "content": "An answer. " * 20}}]
            },
            engine="bench",
            release_id=f"default@{number * 4 // records}",
        )
        record_id = store.add_record(record).result()
        if number % 2:
            store.add_report(Report("default", [record_id], score=float(number % 3 == 0))).result()
    return record_id


def timed(read: Callable[[], object], times: int = 1) -> float:
    """The median wall time of `read`, in milliseconds."""
    spent = []
    for _ in range(times):
        started = time.perf_counter()
        read()
        spent.append((time.perf_counter() - started) * 1000)
    return statistics.median(spent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--reads", type=int, default=20)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as folder,
        ExperienceStore(Path(folder) / "experience.db") as store,
    ):
        last = build(store, args.records)
        before = timed(
            lambda: read_progress(store, "default", 0.5, SCORER, PROGRESS_CALLS), args.reads
        )

        def read() -> object:
            return live_progress(store, "default", 0.5, SCORER)

        read()  # the first read keeps the figures
        kept = timed(read, args.reads)
        store.add_report(Report("default", [last], score=1.0)).result()
        again = timed(read)
    print(f"{args.records} calls")
    print(f"baseline, every read in full:  {before:8.2f} ms")
    print(f"read, nothing new (kept):      {kept:8.2f} ms  ({kept / before:.4f}x the baseline)")
    print(f"read after one report:         {again:8.2f} ms  ({again / before:.2f}x)")


if __name__ == "__main__":
    main()
