"""Nothing private crosses users (issue 72): private data in a prompt, an answer, a
demonstration or a teacher's answer keeps its call out of learning and out of the gate, and a
tree a learner or an agent writes with some is refused. On a real SQLite store and a real git
chain; the red-team strings are the issue's and more of each kind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reef.config import load_config
from reef.evaluation.private import first_private, luhn, private_data
from reef.evaluation.replay import replay_tasks
from reef.releases.workflow import CandidateRefused, ReleaseWorkflow
from reef.sdk.view import ExperienceView
from reef.store import ExperienceStore, Record, Report

PRIVATE = [
    "Hello Bob Jones! Your card 5555 4444 3333 2222 is on file.",
    "Alice Smith, card 4111 1111 1111 1111, expires 12/29",
    "my card is 4111-1111-1111-1111",
    "card number 378282246310005",  # an American Express test number, 15 digits
    "my IBAN is DE89 3704 0044 0532 0130 00",
    "pay GB82 WEST 1234 5698 7654 32 today",
    "call me at +1 415 555 2671",
    "call me on (415) 555-2671",
    "reach me at +44 20 7946 0958",
    "write to alice.smith@example.com",
    "my api key is sk-proj-abcdEFGH1234567890abcdEFGH1234567890xyz",
    "my password is hunter2!",
    'password = "hunter2!"',
    "the api key: 9f8e7d6c5b4a",
    # The same said other ways: no possessive, a colon, a sign, words between, a PIN.
    "password is hunter2!",
    "pw: hunter2!",
    "Password=Sup3rS3cret",
    "the password for the wifi is Blue42Cat",
    "My passcode is 4321-abc",
    "my pin is 1234",
    "use the token abc123XYZ789 to log in",
    "AKIAIOSFODNN7EXAMPLE",
    "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    "-----BEGIN RSA PRIVATE KEY-----",
]
ORDINARY = [
    "What is 10 minus 4? 10 minus 4 is 6.",
    "The capital of France is Paris.",
    "In 2023, 1,234,567 people lived there.",
    "2^10 = 1024",
    "Pi is 3.14159265358979323846",
    "Order 12345 shipped in 1969 and 2001.",
    "Call getUserAccountSettingsFromDatabase() first.",
    "See https://docs.python.org/3/library/functions.html",
    "The ISBN is 978-3-16-148410-0",
    "Tell every user to email their password to the helpdesk.",
    "1 2 3 4 5 6 7 8 9 10 11 12 13",
    "The sum of 1234 and 5678 is 6912.",
    "Temperature 98.6F at 12:30",
    "Google's DNS is 8.8.8.8.",
]


@pytest.mark.parametrize("text", PRIVATE)
def test_private_data_is_found(text: str) -> None:
    assert private_data(text), text


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_is_not_private(text: str) -> None:
    assert private_data(text) == [], text


def test_luhn() -> None:
    assert luhn("4111111111111111") and luhn("378282246310005")
    assert not luhn("4111111111111112")


def test_a_finding_says_only_its_kind_and_last_characters() -> None:
    found = first_private({"messages": [{"content": "card 4111 1111 1111 1111"}]})
    assert found is not None and found.kind == "card" and found.masked == "card …11"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ExperienceStore]:
    with ExperienceStore(tmp_path / "experience.db") as opened:
        yield opened


def call(store: ExperienceStore, question: str, answer: str, feedback: Any = None) -> str:
    record = Record(
        scenario="default",
        request={"messages": [{"role": "user", "content": question}]},
        response={"choices": [{"message": {"role": "assistant", "content": answer}}]},
        engine="test",
        release_id="base",
    )
    record_id = store.add_record(record).result()
    store.add_report(Report("default", [record_id], score=1.0, feedback=feedback)).result()
    return record_id


def test_private_data_anywhere_in_a_call_keeps_it_out_of_learning(store: ExperienceStore) -> None:
    clean = call(store, "What is 2+2?", "4.")
    kept_out = [
        call(store, "My card is 4111 1111 1111 1111. What is my name?", "Bob."),  # prompt
        call(store, "What is my name?", "Hello Bob Jones! Your card 5555 4444 3333 2222."),
        call(  # a demonstration (a user's, or a teacher's answer arriving as one)
            store,
            "Who am I?",
            "I don't know.",
            {"demonstration": "You are Alice Smith, alice.smith@example.com."},
        ),
        call(store, "Help", "Sure.", "my password is hunter2! please remember it"),  # feedback
    ]
    view = ExperienceView(store, "default", consumed=set())
    learned = {turn.record_id for t in view.trajectories for turn in t.turns}
    assert learned == {clean}
    assert view.counts.private == len(kept_out)


def test_a_private_good_answer_is_never_a_gate_task(store: ExperienceStore) -> None:
    for n in range(40):  # about one in four good answers is held back for the gate's replay
        call(store, f"Question {n}: my email is user{n}@example.com", f"Noted {n}.")
        call(store, f"Question {n}: what is {n} plus 1?", f"{n + 1}.")
    tasks = replay_tasks(store, "default", threshold=0.5, limit=100)
    assert tasks, "some clean good answers are held back"
    assert all(first_private(task.messages) is None for task in tasks)


@pytest.fixture
def workflow(tmp_path: Path, store: ExperienceStore) -> ReleaseWorkflow:
    (tmp_path / "reef.yaml").write_text(f"state_dir: {tmp_path}/.reef\n")
    return ReleaseWorkflow(load_config(tmp_path / "reef.yaml", env={}), store)


EXAMPLES = (
    b'{"user": "What is my name?", "assistant": "Hello Bob Jones! Your card 5555 4444 3333 '
    b'2222 is on file."}\n'
)


@pytest.mark.parametrize("source", ["harness_evolve", "agent", "sft"])
def test_a_tree_a_learner_or_an_agent_wrote_with_private_data_is_refused(
    workflow: ReleaseWorkflow, source: str
) -> None:
    files = {"AGENTS.md": b"Be brief.\n", "examples.jsonl": EXAMPLES}
    with pytest.raises(CandidateRefused, match=r"examples.jsonl holds private data \(card …22\)"):
        workflow.propose("default", "harness", files, source=source)
    (refused,) = workflow.candidates.list("default")
    assert refused.state == "rejected" and "5555" not in (refused.decision or "")


def test_a_tree_a_human_published_is_theirs_to_serve(workflow: ReleaseWorkflow) -> None:
    files = {"AGENTS.md": b"Write to support@example.com for refunds.\n"}
    assert workflow.propose("default", "harness", files, source="cli").state == "proposed"


@pytest.mark.parametrize(
    "text",
    [
        "Revert 3f1c0a9e2b4d7c6e5f4a3b2c1d0e9f8a7b6c5d4e and run the tests",
        "Hi 01a251fe9d8c_4f2e8a7b6c5d (a record id)",
        "open src/reef/engines/llamacpp/handover.py at line 120",
        "the run 550e8400-e29b-41d4-a716-446655440000 failed",
        "export PATH=/usr/local/bin:$PATH",
        "token = int(key)",
        "if password is None:",
        "the password is correct",
        "the password must be 8 characters long",
        "token limit: 4096",
        "the pin 13 of the board",
        "token: Optional[str] = None",
        "def login(password: str, token: str | None = None) -> bool:",
        "api_key = os.environ['OPENAI_API_KEY']",
    ],
)
def test_an_agent_s_ids_hashes_and_paths_are_not_secrets(text: str) -> None:
    """Agents' calls are full of these: taking them for keys would leave nothing to learn."""
    assert private_data(text) == [], text


def test_a_bare_run_of_digits_is_a_number_not_a_phone() -> None:
    assert private_data("the population was 4155552671 and the epoch 1796671973") == []
    assert [f.kind for f in private_data("call 415-555-2671")] == ["phone"]
