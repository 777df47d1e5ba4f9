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

__all__ = [
    "ExperienceStore",
    "Record",
    "Report",
    "ReportConflict",
    "StoreError",
    "UnknownRecords",
    "new_id",
]
