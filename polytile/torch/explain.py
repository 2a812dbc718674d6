"""What the backend took and what it left: ``polytile.torch.explain(model, *inputs)``.

The backend fills a ``Report`` as it compiles: one ``TakenGroup`` per group compiled by polytile
(its operations, the schedule's origin, the measured times beside torch's) and, for everything left
to torch, the operation and the reason (an operation polytile does not import, a dtype, a dynamic
size, a group torch runs faster, a build or check that failed).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TakenGroup:
    kind: str  # "gemm", "conv", "reduce" or "elementwise"
    ops: list[str]  # the aten operations fused into the kernel
    key: str  # the workload key of its Func (what tuning records are stored under)
    schedule: str  # "tuned" (from the records) or "default"
    polytile_us: float | None = None  # measured on random inputs at compile time (None: not measured)
    torch_us: float | None = None
    kernels: int = 1  # the kernels one call launches (GPU; a CPU call is one function)
    packed: int = 0  # constant weights it reads packed once (polytile.torch.packing), not per call


@dataclass
class LeftOp:
    op: str
    reason: str


@dataclass
class Report:
    """The backend's account of one or more compiled graphs."""

    taken: list[TakenGroup] = field(default_factory=list)
    left: list[LeftOp] = field(default_factory=list)
    graphs: int = 0
    cuda_graphs: int = 0  # compiled graphs replayed as CUDA graphs (Options.cuda_graphs)
    cuda_graph_replays: int = 0
    compile_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def kernels(self) -> int:
        """The kernels the taken groups launch, together (a product with its epilogue fused: one)."""
        return sum(g.kernels for g in self.taken)

    def leave(self, op: str, reason: str) -> None:
        self.left.append(LeftOp(op, reason))

    @property
    def taken_ops(self) -> Counter[str]:
        return Counter(op for g in self.taken for op in g.ops)

    @property
    def left_ops(self) -> Counter[str]:
        return Counter(x.op for x in self.left)

    def reasons(self) -> dict[str, Counter[str]]:
        """For each operation left to torch, its reasons and how often each was given."""
        out: dict[str, Counter[str]] = {}
        for x in self.left:
            out.setdefault(x.op, Counter())[x.reason] += 1
        return out

    def __str__(self) -> str:
        lines = [f"polytile compiled {len(self.taken)} group(s) in {self.graphs} graph(s) "
                 f"({self.compile_s:.1f} s); left {len(self.left)} operation(s) to torch"]
        if self.taken:
            lines.append("taken:")
            for g in self.taken:
                t = ""
                if g.polytile_us is not None and g.torch_us is not None:
                    t = f"  {g.polytile_us:.1f} µs vs torch {g.torch_us:.1f} µs"
                n = f" ({g.kernels} kernels)" if g.kernels > 1 else ""
                n += " (weights packed once)" if g.packed else ""
                lines.append(f"  {g.kind:<11} {' + '.join(g.ops)} [{g.schedule}]{n}{t}")
        if self.left:
            lines.append("left to torch:")
            for op, reasons in sorted(self.reasons().items()):
                for reason, n in reasons.most_common():
                    lines.append(f"  {op} ×{n}: {reason}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def explain(model: Any, *example_inputs: Any, **options: Any) -> Report:
    """Compile ``model`` with the polytile backend on ``example_inputs`` (under ``torch.no_grad``) and
    return the ``Report`` of what polytile took and what it left to torch. ``options`` are the
    backend's (``polytile.torch.backend``)."""
    import torch

    from .compiler import backend, check_model
    check_model(model, "explain")
    report = Report()
    compiled = torch.compile(model, backend=backend(report=report, **options), dynamic=False)
    torch._dynamo.reset()
    with torch.no_grad():
        compiled(*example_inputs)
    return report
