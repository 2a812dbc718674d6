"""A synthetic timing of a schedule: an in-order issue model with scoreboard waits.

Used as the measurer in CPU tests (and for dry runs without a GPU): instructions issue in order,
each `stall` cycles after the previous one; an instruction waits for the scoreboards in its wait
mask, which clear a fixed latency after their setters issued. Moving a load earlier lets its
latency overlap more work, so the model rewards what the assembly game is after. It is no model of
a real GPU, only a deterministic objective with the right shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from polytile.sass.cubin import NO_BARRIER
from polytile.sass.schedule import Schedule

DEFAULT_LATENCIES = {"LDG": 400, "STG": 20, "LDS": 30, "LDSM": 30, "STS": 20, "LDGSTS": 400, "LDC": 40}


@dataclass
class IssueModel:
    """Measurer whose `measure` returns simulated cycles (plus optional relative noise)."""

    latencies: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_LATENCIES))
    other_latency: int = 20
    noise: float = 0.0
    seed: int = 0
    calls: int = 0

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def measure(self, schedule: Schedule) -> float:
        self.calls += 1
        a = schedule.analysis
        clear_at = [0.0] * 6
        t = 0.0
        finish = 0.0
        for instruction in schedule.order:
            control = a.controls[instruction]
            for b in control.waits:
                t = max(t, clear_at[b])
            latency = self.latencies.get(a.instructions[instruction].base, self.other_latency)
            for b in (control.write_barrier, control.read_barrier):
                if b != NO_BARRIER:
                    release = t + (latency if b == control.write_barrier else 4)
                    clear_at[b] = max(clear_at[b], release)
            finish = max(finish, t + latency)
            t += schedule.stall(instruction)
        total = max(t, finish)
        if self.noise:
            total *= 1.0 + self.noise * float(self._rng.standard_normal())
        return total
