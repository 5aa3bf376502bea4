"""What a rejected launch contract reports: each variable, its value and what is allowed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with the contract: the variable, its value and what is allowed."""

    variable: str
    value: str | None  # None: the variable is not set
    message: str
    allowed: str

    def __str__(self) -> str:
        shown = "unset" if self.value is None else repr(self.value)
        return f"{self.variable}={shown}: {self.message}; allowed: {self.allowed}"


class ContractError(ValueError):
    """The pod's launch contract is missing values or inconsistent; lists every problem."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        count = f"{len(self.problems)} problem" + ("s" if len(self.problems) != 1 else "")
        super().__init__(f"invalid launch contract ({count}):\n{lines}")
