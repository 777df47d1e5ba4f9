"""The experience store: records of served calls and the feedback reported against them."""

from reef.store.experience import (
    ExperienceStore,
    Record,
    Report,
    ReportConflict,
    StoreError,
    UnknownRecords,
    new_id,
)
from reef.store.writer import StoreClosed

__all__ = [
    "ExperienceStore",
    "Record",
    "Report",
    "ReportConflict",
    "StoreClosed",
    "StoreError",
    "UnknownRecords",
    "new_id",
]
