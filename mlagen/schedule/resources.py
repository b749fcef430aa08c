"""The resources a schedule needs on its target, against what the target has: one ``Need``
per resource, gathered into a ``ResourceReport`` (``rules.can_implement`` makes one).

Each backend's counter (``Backend.resources``) returns the same formulas its kernel uses to
lay out memory, so a schedule that passes the check fits when it runs (an emulator checks
capacity again and raises if a count was wrong).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Need:
    name: str          # e.g. "LMEM bytes per core"
    needed: int
    available: int
    key: str           # the schedule key most responsible, for the error's line
    detail: str = ""   # how `needed` was counted

    @property
    def ok(self) -> bool:
        return self.needed <= self.available


@dataclass(frozen=True)
class ResourceReport:
    needs: list[Need] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(n.ok for n in self.needs)

    @property
    def worst_key(self) -> str:
        bad = [n for n in self.needs if not n.ok]
        return max(bad, key=lambda n: n.needed / max(n.available, 1)).key if bad else ""

    def message(self) -> str:
        bad = [n for n in self.needs if not n.ok]
        return "; ".join(f"needs {n.needed} {n.name} but the target has {n.available}"
                         + (f" ({n.detail})" if n.detail else "") for n in bad)

    def table(self) -> str:
        return "\n".join(f"  {n.name:<32} {n.needed:>12} / {n.available:<12} "
                         f"{'ok' if n.ok else 'TOO MUCH'}  {n.detail}" for n in self.needs)

