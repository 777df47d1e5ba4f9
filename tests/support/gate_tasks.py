"""Gate tasks the release tests share: prompts whose answer passes when it signs off."""

from __future__ import annotations

from reef.evaluation.tasks import FEEDBACK_GROUP, EvalTask, ScorerSpec


def sign_off_tasks(count: int = 3, group: str = FEEDBACK_GROUP) -> list[EvalTask]:
    """`count` tasks, `Sign off N.`, passed by an answer that says "Cheers" (by default the
    users' held-out feedback, as a recipe's gate has them)."""
    return [
        EvalTask(
            id=f"f{n}",
            messages=[{"role": "user", "content": f"Sign off {n}."}],
            scorer=ScorerSpec(type="contains", value="Cheers"),
            group=group,
        )
        for n in range(count)
    ]
