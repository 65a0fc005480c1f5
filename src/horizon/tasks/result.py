"""What a verifier returns for one final sandbox state (`horizon.tasks.verifier.verify`, the importers'
graders)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    reward: float
    passed: int
    total: int
    output: str
    infra_error: str = ""       # non-empty: the sandbox failed, `reward` means nothing (never trained on)
    details: dict = dataclasses.field(default_factory=dict)   # grader-specific counts (swebench: failing tests)

    @property
    def infra(self) -> bool:
        return bool(self.infra_error)
