"""The error the operator reports for a spec that can never work: every problem, field-named."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tpuserve_operator.conditions import Reason


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a spec: the field path, what is wrong, and a CamelCase reason."""

    field: str
    message: str
    reason: Reason = Reason.INVALID_SPEC

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class InvalidSpec(ValueError):
    """A spec that can never work as written. Carries every problem found, not only the first.

    `str(err)` is the sentence the operator writes into the `Valid` condition and the Event,
    and what `tpuserve render` prints, so all three always agree.
    """

    def __init__(self, problems: Sequence[Problem]) -> None:
        if not problems:
            raise ValueError("InvalidSpec needs at least one problem")
        self.problems = tuple(problems)
        super().__init__("; ".join(str(p) for p in self.problems))

    @property
    def reason(self) -> Reason:
        """The first problem's reason: the condition carries one reason."""
        return self.problems[0].reason
