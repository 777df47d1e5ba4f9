"""What the records' search index costs the hot path, and what it buys (issue 77), in one run.

    .venv/bin/python -m bench.speed.record_search [--records 4000] [--rounds 3] [--threads 8]

SQLite, as `reef serve` opens it (WAL, `synchronous=full`): records stored through the store's
writer from `--threads` threads at once (group commits, as concurrent calls are), each a chat
call of about 1.3 KB of JSON, into a store with the search index (migration 0024) searched
after every round, and into one never searched (the baseline: what the store did before), in
interleaved rounds. A search indexes the records stored since the last one before it looks;
serving writes nothing to the index. Then the time to index a round's records at the next
search, and to find the records holding a rare word, with the index and with the substring
scan the review's live filter uses, over every record stored.

Figures also go to bench/out/record_search.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.common.results import OUT
from reef.store import ExperienceStore, Record
from reef.store.review import newest_records

OUT_FILE = OUT / "record_search.json"
CONTEXT = "You are a helpful assistant for a shop that sells lamps and chairs. " * 12


def record(number: int) -> Record:
    rare = " zephyrine" if number % 500 == 0 else ""
    messages = [
        {"role": "system", "content": CONTEXT},
        {"role": "user", "content": f"Question {number}: which lamp suits a reading corner?{rare}"},
    ]
    answer = f"Answer {number}: a warm floor lamp with a shade that points down. " * 3
    return Record(
        "default",
        {"messages": messages, "max_tokens": 64},
        {"choices": [{"message": {"role": "assistant", "content": answer}}]},
        engine="bench",
        release_id="base",
    )


def store_records(store: ExperienceStore, first: int, count: int, threads: int) -> float:
    """Records/s storing `count` records from `threads` threads at once."""
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(store.add_record, record(n)) for n in range(first, first + count)]
        for future in futures:
            future.result().result()
    return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=4000, help="per round and store")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="reef-search-"))
    indexed = ExperienceStore(folder / "indexed.db")
    plain = ExperienceStore(folder / "plain.db")
    rates: dict[str, list[float]] = {"with the index": [], "without (baseline)": []}
    catch_up: list[float] = []
    for number in range(args.rounds):
        first = number * args.records
        for name, store in (("without (baseline)", plain), ("with the index", indexed)):
            rate = store_records(store, first, args.records, args.threads)
            rates[name].append(rate)
            print(f"round {number + 1}: {name:20} {rate:8.0f} records/s", flush=True)
        started = time.perf_counter()
        indexed.latest_records(search="zephyrine")  # indexes this round's records
        catch_up.append(time.perf_counter() - started)
    searches = {}
    for name, find in (
        (
            "index (reef records --search)",
            lambda: indexed.latest_records(limit=200, search="zephyrine"),
        ),
        ("substring scan (the review)", lambda: newest_records(indexed, None, "zephyrine", 200)),
    ):
        times = []
        for _ in range(5):
            started = time.perf_counter()
            found = find()
            times.append(time.perf_counter() - started)
        searches[name] = {"ms": round(statistics.median(times) * 1000, 2), "found": len(found)}
    total = args.rounds * args.records
    base = statistics.median(rates["without (baseline)"])
    with_index = statistics.median(rates["with the index"])
    print(f"\nstoring, median of {args.rounds} rounds of {args.records} ({args.threads} threads):")
    print(f"  without the index (baseline) {base:8.0f} records/s")
    print(f"  with the index               {with_index:8.0f} records/s  ({with_index / base:.2f}x)")
    print(
        f"indexing a round's {args.records} records at the next search: "
        f"{statistics.median(catch_up):.2f} s (median)"
    )
    print(f"finding a rare word among {total} records (median of 5):")
    for name, found in searches.items():
        print(f"  {name:31} {found['ms']:8.2f} ms  ({found['found']} found)")
    sizes = {name: (folder / f"{name}.db").stat().st_size for name in ("indexed", "plain")}
    print(f"file size: {sizes['indexed'] / sizes['plain']:.2f}x the baseline's")
    indexed.close()
    plain.close()
    OUT.mkdir(parents=True, exist_ok=True)
    OUT_FILE.write_text(
        json.dumps(
            {"rates": rates, "catch_up_s": catch_up, "searches": searches, "sizes": sizes},
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
