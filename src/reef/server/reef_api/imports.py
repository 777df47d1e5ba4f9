"""`POST /reef/records/batch`: records made elsewhere, imported as experience.

The body is what `reef_client.record_import` and `reef import` send, `{"records": [...]}`, each
an envelope `{"agent_record_id", "request_type", "payload", ...}`:

- `inference`: `payload` is the chat request with its `response` (`{"messages": [...], ...,
  "response": {"choices": [...]}}`, or `{"request": {...}, "response": {...}}`). It is stored as
  a record whose id is the `agent_record_id`, so reports can reference it as a receipt, with
  `engine: "import"` (the mark of an imported record), the envelope's `session` and `release_id`
  (default `base`), and its `metadata` kept as an `import` annotation;
- `report`: `payload` is a report (`references`, `score`, `feedback`, `metadata`) whose id is the
  `agent_record_id`; its references are records of the scenario, stored or earlier in the batch.

Importing is idempotent by id: an id already stored with the same content is acknowledged again
and not stored twice (a client that lost an answer resends the batch); with other content it is a
409 naming it. Everything is checked before anything is stored, and the batch's records commit
in one transaction before the answer, a receipt per envelope in order, goes out: an
acknowledged record is on disk, and a refused batch stores nothing.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reef.errors import BadRequest, NotFound, PayloadTooLarge, describe_validation_error
from reef.inference.binding import BASE_RELEASE
from reef.protocol import ChatRequest
from reef.server.http import read_json
from reef.server.state import ServerState, scenario_from
from reef.store import ExperienceStore, Record, Report, ReportConflict, UnknownRecords
from reef.store.imports import insert_new_records, stored_otherwise, stored_rows

# reef_client refuses batches of 10 MiB or more (MAX_REQUEST_BYTES); server.max_body_bytes may
# bound them lower.
MAX_IMPORT_BYTES = 10 * 1024 * 1024
MAX_BATCH_RECORDS = 1000
IMPORT_ENGINE = "import"
ANNOTATION_SOURCE = "import"
# The ids a client may give its records: report ids' alphabet, so a record id fits in a report.
RECORD_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
PLAIN = re.compile(r"[A-Za-z0-9_.:@/-]{1,128}")
REQUEST_TYPES = ("inference", "report")
# SQLite's default limit on bound parameters in one statement, with room to spare.


class Envelope(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_record_id: str
    request_type: str
    payload: dict[str, Any]
    scenario: str | None = None
    session: str | None = Field(None, max_length=256)
    release_id: str | None = None
    created_at: float | None = Field(None, ge=0)
    metadata: dict[str, Any] | None = None


class ReportPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    references: list[str] = Field(min_length=1, max_length=1000)
    score: float | None = None
    feedback: str | dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


@dataclass
class Batch:
    """A checked batch: the records and reports to store, and each envelope's receipt."""

    scenario: str
    records: list[Record]
    annotations: dict[str, dict[str, Any]]  # record id -> the import annotation's data
    reports: list[Report]
    receipts: list[dict[str, str]]


def _refuse(index: int, record_id: Any, problem: str) -> BadRequest:
    named = f" (agent_record_id {record_id!r})" if isinstance(record_id, str) else ""
    return BadRequest(f"records[{index}]{named}: {problem}", code="invalid_record")


def check_batch(
    body: dict[str, Any], scenario: str, score_range: tuple[float, float] = (0.0, 1.0)
) -> Batch:
    """The body as a batch, or a 400 naming the first envelope that is wrong and how (a
    report's score outside the scenario's `score_range` too, as `POST /reef/report` refuses)."""
    extra = sorted(set(body) - {"records"})
    if extra:
        raise BadRequest(f'unknown key(s) {", ".join(extra)}: the body is {{"records": [...]}}')
    envelopes = body.get("records")
    if not isinstance(envelopes, list) or not envelopes:
        raise BadRequest('send {"records": [...]}: a non-empty list of record envelopes')
    if len(envelopes) > MAX_BATCH_RECORDS:
        raise BadRequest(
            f"a batch holds at most {MAX_BATCH_RECORDS} records, this one {len(envelopes)}: "
            "send them in several batches"
        )
    batch = Batch(scenario, [], {}, [], [])
    kinds: dict[str, tuple[str, str]] = {}  # id -> (request type, content hash) in this batch
    for index, raw in enumerate(envelopes):
        if not isinstance(raw, dict):
            raise _refuse(index, None, "each record is a JSON object")
        record_id = raw.get("agent_record_id")
        try:
            envelope = Envelope.model_validate(raw)
        except ValidationError as error:
            raise _refuse(index, record_id, describe_validation_error(error)) from None
        _check_envelope(index, envelope, scenario)
        if envelope.request_type == "inference":
            record = _record(index, envelope, scenario)
            fingerprint = record.content_hash
            if envelope.metadata:
                batch.annotations[record.id] = {"metadata": envelope.metadata}
        else:
            report = _report(index, envelope, scenario, score_range)
            fingerprint = report.content_hash
        seen = kinds.get(envelope.agent_record_id)
        if seen is not None and seen != (envelope.request_type, fingerprint):
            raise _refuse(
                index,
                envelope.agent_record_id,
                "the batch holds this id twice with different content: give each record its own id",
            )
        if seen is None:
            if envelope.request_type == "inference":
                batch.records.append(record)
            else:
                batch.reports.append(report)
        kinds[envelope.agent_record_id] = (envelope.request_type, fingerprint)
        batch.receipts.append(
            {
                "agent_record_id": envelope.agent_record_id,
                "request_type": envelope.request_type,
                "scenario": scenario,
            }
        )
    return batch


def _check_envelope(index: int, envelope: Envelope, scenario: str) -> None:
    record_id = envelope.agent_record_id
    if not RECORD_ID.fullmatch(record_id):
        raise _refuse(
            index,
            record_id,
            "agent_record_id must be 1 to 128 letters, digits, '_', '.', ':' or '-'",
        )
    if envelope.request_type not in REQUEST_TYPES:
        raise _refuse(
            index,
            record_id,
            f"request_type {envelope.request_type!r} cannot be imported: send one of "
            f"{', '.join(REQUEST_TYPES)}",
        )
    if envelope.scenario is not None and envelope.scenario != scenario:
        raise _refuse(
            index,
            record_id,
            f"the record says scenario {envelope.scenario!r} and the x-reef-scenario header "
            f"{scenario!r}: import each scenario's records with its own header",
        )
    if envelope.release_id is not None and not PLAIN.fullmatch(envelope.release_id):
        raise _refuse(index, record_id, "release_id must be 1 to 128 letters, digits and '_.:@/-'")
    if envelope.request_type == "report" and (envelope.session or envelope.release_id):
        raise _refuse(index, record_id, "a report has no session or release_id: drop them")


def _record(index: int, envelope: Envelope, scenario: str) -> Record:
    payload = dict(envelope.payload)
    record_id = envelope.agent_record_id
    response = payload.pop("response", None)
    if "request" in payload:
        request = payload.pop("request")
        if payload:
            raise _refuse(
                index,
                record_id,
                f"payload has {', '.join(sorted(payload))} beside request and response: put "
                "them in the request",
            )
    else:
        request = payload
    if not isinstance(request, dict):
        raise _refuse(index, record_id, "payload.request must be a chat request object")
    try:
        ChatRequest.model_validate(request)
    except ValidationError as error:
        problem = describe_validation_error(error)
        raise _refuse(index, record_id, f"the chat request: {problem}") from None
    created_at = envelope.created_at if envelope.created_at is not None else time.time()
    answer = _response(index, record_id, response, request, created_at)
    return Record(
        id=record_id,
        scenario=scenario,
        session=envelope.session,
        request=request,
        response=answer,
        engine=IMPORT_ENGINE,
        model=answer["model"],
        release_id=envelope.release_id or BASE_RELEASE,
        usage=answer.get("usage") if isinstance(answer.get("usage"), dict) else None,
        created_at=created_at,
    )


def _response(
    index: int, record_id: str, response: Any, request: dict[str, Any], created_at: float
) -> dict[str, Any]:
    """The answer as a `chat.completion`: the fields a record's readers count on filled in."""
    if not isinstance(response, dict):
        raise _refuse(
            index,
            record_id,
            'payload.response is required: the answer, {"choices": [{"message": {"role": '
            '"assistant", "content": ...}}]}',
        )
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        raise _refuse(index, record_id, "payload.response.choices must be a non-empty list")
    filled = []
    for position, choice in enumerate(choices):
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict) or not (
            isinstance(message.get("content"), str | None) or message.get("tool_calls")
        ):
            raise _refuse(
                index,
                record_id,
                f"payload.response.choices[{position}].message must be an object with content "
                "or tool_calls",
            )
        filled.append(
            {
                "index": position,
                "finish_reason": "stop",
                **choice,
                "message": {"role": "assistant", **message},
            }
        )
    model = response.get("model") or request.get("model") or "unknown"
    return {
        "id": f"chatcmpl-{record_id}",
        "object": "chat.completion",
        "created": int(created_at),
        **response,
        "model": str(model),
        "choices": filled,
    }


def _report(
    index: int, envelope: Envelope, scenario: str, score_range: tuple[float, float]
) -> Report:
    record_id = envelope.agent_record_id
    try:
        payload = ReportPayload.model_validate(envelope.payload)
    except ValidationError as error:
        raise _refuse(index, record_id, f"payload: {describe_validation_error(error)}") from None
    score = payload.score
    if score is None and payload.feedback is None:
        raise _refuse(index, record_id, "a report needs a score, a feedback, or both")
    if isinstance(envelope.payload.get("score"), bool):
        raise _refuse(index, record_id, "payload.score must be a number, not a boolean")
    low, high = score_range
    if score is not None and not low <= score <= high:
        raise _refuse(
            index,
            record_id,
            f"payload.score {score:g} is outside {scenario}'s score range [{low:g}, {high:g}] "
            "(gate.canary.score_range): send it within the range, or widen the range",
        )
    try:
        return Report(
            id=record_id,
            scenario=scenario,
            references=payload.references,
            score=score,
            feedback=payload.feedback,
            metadata=payload.metadata,
            **({"created_at": envelope.created_at} if envelope.created_at is not None else {}),
        )
    except ValueError as error:
        raise _refuse(index, record_id, str(error)) from None


# -- storing ----------------------------------------------------------------------------------


def _prepare(store: ExperienceStore, batch: Batch) -> tuple[list[Record], list[Report]]:
    """What of the batch is new; a conflict or an unknown reference refuses all of it (reads,
    before anything is written)."""
    stored = stored_rows(store, "records", [r.id for r in batch.records])
    new_records = []
    for record in batch.records:
        row = stored.get(record.id)
        if row is None:
            new_records.append(record)
        elif row["content_hash"] != record.content_hash:
            raise stored_otherwise("record", record.id, row["scenario"])
    reports = stored_rows(store, "reports", [r.id for r in batch.reports])
    new_reports = []
    for report in batch.reports:
        row = reports.get(report.id)
        if row is None:
            new_reports.append(report)
        elif row["content_hash"] != report.content_hash:
            raise stored_otherwise("report", report.id, row["scenario"])
    in_batch = {record.id for record in batch.records}
    wanted = sorted({ref for report in new_reports for ref in report.references} - in_batch)
    known = {
        ref
        for ref, row in stored_rows(store, "records", wanted).items()
        if row["scenario"] == batch.scenario
    }
    missing = [ref for ref in wanted if ref not in known]
    if missing:
        raise NotFound(
            f"report(s) reference record(s) not in scenario {batch.scenario!r}: "
            f"{', '.join(missing[:20])}: import the records before the reports that grade them "
            "(an earlier line of the file, or an earlier batch)",
            code="unknown_record",
        )
    return new_records, new_reports


async def import_batch(state: ServerState, batch: Batch) -> tuple[int, int]:
    """Store the batch's new records, then its new reports; (stored, already there)."""
    store = state.store
    records, reports = await run_in_threadpool(_prepare, store, batch)
    added = 0
    if records:
        job = insert_new_records(records, batch.annotations, ANNOTATION_SOURCE)
        added = await asyncio.wrap_future(store.write(job))
    for report in reports:
        try:
            _, created = await store.add_report_async(report)
        except UnknownRecords as error:
            raise NotFound(str(error), code="unknown_record") from None
        except ReportConflict:
            raise stored_otherwise("report", report.id, report.scenario) from None
        added += created
    total = len(batch.records) + len(batch.reports)
    return added, total - added


def _releases_on_the_chain(state: ServerState, batch: Batch, scenario: str) -> None:
    """Refuse a record that names a release this scenario's chain does not have: its calls
    would read as that release's (blocking: git)."""
    named = {record.release_id for record in batch.records} - {BASE_RELEASE}
    if not named:
        return  # the usual import: calls of the base, no chain to read
    known = {release.release_id for release in state.workflow.chain.releases(scenario)}
    places = {receipt.get("agent_record_id"): n for n, receipt in enumerate(batch.receipts)}
    for record in batch.records:
        if record.release_id != BASE_RELEASE and record.release_id not in known:
            raise _refuse(
                places.get(record.id, 0),
                record.id,
                f"release_id {record.release_id!r} is not a release of scenario {scenario!r}: "
                "drop it (an imported call is the base's) or name one `reef release list` shows",
            )


async def records_batch(request: Request) -> Response:
    state: ServerState = request.app.state.reef
    scenario = scenario_from(request.headers)
    limit = min(state.config.server.max_body_bytes, MAX_IMPORT_BYTES)
    try:
        body = await read_json(request, limit)
    except PayloadTooLarge:
        raise PayloadTooLarge(
            f"an import batch is at most {limit} bytes: send fewer records per request "
            "(`reef import --batch-bytes`, reef_client's max_batch_bytes), or raise "
            "server.max_body_bytes; nothing of this batch was stored"
        ) from None
    batch = check_batch(body, scenario, state.config.gate_for(scenario).canary.score_range)
    await run_in_threadpool(_releases_on_the_chain, state, batch, scenario)
    added, again = await import_batch(state, batch)
    return JSONResponse({"records": batch.receipts, "imported": added, "duplicates": again})


routes = [Route("/reef/records/batch", records_batch, methods=["POST"])]
