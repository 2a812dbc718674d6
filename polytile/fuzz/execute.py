"""One fuzz case in the current process: build the program from its text, draw or replay its schedule
calls, build and run the kernel on fresh inputs and classify what happened.

Kinds of outcome:

- ``ok``: built, ran, and every output matches the reference;
- ``refused-late``: a PolytileError (not a BuildError) at ``pt.build``; the schedule's primitives
  accepted something the build then refused (counted and reported, not a wrong result);
- ``miscompile``: the kernel ran and an output differs from the reference;
- ``internal``: polytile failed in a way it promises not to: an exception other than a
  PolytileError (an isl error, a KeyError …) from a primitive or the build, generated code that
  does not compile (BuildError), a kernel call that fails on valid inputs, or a refused
  primitive that changed the schedule (primitives are transactional);
- ``invalid``: the fuzzer's fault: polytile refused the generated program, or the reference
  found it undefined on its inputs;
- ``crash`` and ``hang`` are decided by the process that runs the case (``runner``);
- ``not-emulated`` (``--target cuda``): lowered, but the block emulator does not cover a construct
  of the kernel (counted, not a finding); nvcc still compiles its source.

For ``--target cuda`` the case is lowered for ``CUDA_TARGET`` (``pt.lower``), its CUDA source
printed, its kernels run on the CPU by the block emulator (``emulator``) and compared with the
reference, and, where nvcc is found, the source compiled. A PolytileError at lowering or printing is
``refused-late``, as at ``pt.build``; an emulator's assertion (a thread out of its buffer, a barrier
some threads of a block miss, two threads writing one element with different values) is a
``miscompile``; nvcc rejecting the source is ``internal``.

Primitive refusals (a PolytileError at a primitive) are legal and do not end a case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import BuildError, PolytileError
from . import gpu_schedules, inputs, reference, schedules
from .programs import generate
from .spec import CUDA_TARGET, Case, fence_at_start, inputs_source, program_source

PROGRAM, SCHEDULE, MODES = 0, 1, 2  # random streams of a case


@dataclass
class Outcome:
    kind: str
    phase: str = ""
    detail: str = ""


FINDINGS = ("miscompile", "crash", "hang", "internal")
TARGETS = ("cpu", "cuda")
NVCC = True
"""Whether CUDA cases compile their source with nvcc where it is found (``--no-nvcc``: not; the
processes of cases are forked, so setting it before a campaign reaches them)."""


def case_rng(seed: int, index: int, stream: int) -> np.random.Generator:
    """The random stream ``stream`` of case ``index`` of seed ``seed``: a function of the three alone."""
    return np.random.default_rng([seed, index, stream])


def generate_case(seed: int, index: int, target: str = "cpu") -> Case:
    """Case ``index`` of seed ``seed`` for ``target`` without its schedule (drawn while it runs: each
    primitive's arguments come from the schedule's state after the calls before it). A CUDA case's
    program is a CPU case's without the modes the emulator does not model (integer overflow in
    narrow types, NaN inputs) and never malformed (refusing those is the CPU fuzzer's)."""
    rng = case_rng(seed, index, PROGRAM)
    if target == "cuda":
        program = generate(rng)
        while program.malformed:  # drawn again from the stream: still a function of (seed, index)
            program = generate(rng)
    else:
        program = generate(rng, case_rng(seed, index, MODES))
    return Case(seed, index, program, int(rng.integers(2 ** 31)), target=target)


Report = Callable[[dict], None]


def run_case(case: Case, report: Report, draw_schedule: bool) -> Outcome:
    """Run ``case``; ``draw_schedule`` draws its calls from the case's seed (else replays
    ``case.calls``). ``report`` receives ``{"phase": …}`` and ``{"call": …}`` events as the case
    goes, so that a process watching it knows where it died."""
    import polytile as pt
    ns: dict = {"pt": pt, "np": np, "inputs": inputs}
    if case.program.malformation:
        return run_malformed(case, report, ns)
    report({"phase": "program"})
    try:
        exec(program_source(case.program), ns)  # noqa: S102 - the fuzzer's own program
        func = ns["func"]
    except PolytileError as err:
        return Outcome("invalid", "program", f"polytile refused the program: {type(err).__name__}: {err}")
    except Exception as err:  # noqa: BLE001
        return _internal("program", err)
    exec(inputs_source(case.program, case.input_seed), ns)  # noqa: S102
    args, params = ns["args"], ns["params"]
    report({"phase": "reference"})
    try:
        reference.evaluate(func, args, params)
    except reference.InvalidProgram as err:
        return Outcome("invalid", "reference", str(err)[:500])
    report({"phase": "schedule"})
    try:
        s = pt.create_schedule(func)
    except PolytileError as err:
        return Outcome("invalid", "schedule", f"create_schedule refused the program: {type(err).__name__}: {err}")
    except Exception as err:  # noqa: BLE001
        return _internal("schedule", err)
    ns["s"] = s
    failure: list[Outcome] = []

    def on_call(text: str, applied: schedules.Applied) -> bool:
        report({"call": text, "outcome": applied.outcome, "detail": applied.detail})
        if applied.outcome in ("internal", "non-transactional"):
            failure.append(Outcome("internal", "schedule", f"{text}: {applied.outcome}: {applied.detail}"))
            return False
        return True

    if draw_schedule:
        draw = gpu_schedules.generate_calls if case.target == "cuda" else schedules.generate_calls
        draw(case_rng(case.seed, case.index, SCHEDULE), s, ns, on_call)
    else:
        for call in case.calls:
            if not on_call(call.text, schedules.apply(s, call.text, ns)):
                break
    if failure:
        return failure[0]
    if case.target == "cuda":
        return run_cuda(case, func, s, args, params, report)
    report({"phase": "build"})
    try:
        kern = pt.build(s)
    except BuildError as err:
        return Outcome("internal", "build", f"generated code does not compile: {_compiler_error(str(err))}")
    except PolytileError as err:
        return Outcome("refused-late", "build", f"{type(err).__name__}: {str(err)[:400]}")
    except Exception as err:  # noqa: BLE001
        return _internal("build", err)
    report({"phase": "run"})
    at_start = fence_at_start(case)
    fenced = [inputs.fenced(a, at_start) for a in args]
    outs = inputs.output_arrays(func, params, at_start)
    try:
        kern(*fenced, *outs, **params)
    except Exception as err:  # noqa: BLE001 - the inputs are valid: any failure is polytile's
        return _internal("run", err)
    finally:
        kern.path.unlink(missing_ok=True)  # the library stays loaded; the fuzzer's cache stays small
    report({"phase": "check"})
    problems = reference.differences(func, args, outs, params)
    if problems:
        return Outcome("miscompile", "check", "; ".join(problems)[:1500])
    return Outcome("ok", "check")


def run_cuda(case: Case, func, s, args: list, params: dict, report: Report) -> Outcome:  # noqa: ANN001
    """Lower ``s`` for ``CUDA_TARGET``, print its CUDA source, run it on the block emulator and check
    it against the reference, then compile the source with nvcc where there is one."""
    import polytile as pt

    from ..codegen.cuda import cuda_source
    from ..runtime.cuda import index32_ok
    from ..target import as_target
    from ..toolchain import find_nvcc
    from . import emulator
    target = as_target(CUDA_TARGET)
    for phase in ("lower", "source"):
        report({"phase": phase})
        try:
            if phase == "lower":
                low = pt.lower(s, target)
            else:
                source, kernels = cuda_source(low, index32_ok(low))
        except BuildError as err:
            return Outcome("internal", phase, f"BuildError: {str(err)[:400]}")
        except PolytileError as err:
            return Outcome("refused-late", phase, f"{type(err).__name__}: {str(err)[:400]}")
        except Exception as err:  # noqa: BLE001
            return _internal(phase, err)
    for k in kernels:  # build_cuda_kernel's refusal, before nvcc
        if k.dynamic_shared > target.shared_per_block:
            return Outcome("refused-late", "source", f"kernel {k.name} needs {k.dynamic_shared} bytes of shared memory")
    report({"phase": "emulate"})
    at_start = fence_at_start(case)
    outs = inputs.output_arrays(func, params, at_start)
    outcome = Outcome("ok", "check")
    try:
        emulator.run(low, [*args, *outs], params)
    except NotImplementedError as err:
        outcome = Outcome("not-emulated", "emulate", str(err)[:300])
    except AssertionError as err:
        return Outcome("miscompile", "emulate", f"the emulated kernel broke a rule of CUDA: {str(err)[:1000]}")
    except Exception as err:  # noqa: BLE001 - e.g. a variable used out of its scope
        return _internal("emulate", err)
    if outcome.kind == "ok":
        report({"phase": "check"})
        problems = reference.differences(func, args, outs, params)
        if problems:
            return Outcome("miscompile", "check", "; ".join(problems)[:1500])
    if NVCC and find_nvcc() is not None:
        from ..runtime.cuda import compile_cuda
        report({"phase": "nvcc"})
        try:
            compile_cuda(source, target.arch)
        except BuildError as err:
            return Outcome("internal", "nvcc", f"generated code does not compile: {_compiler_error(str(err))}")
    return outcome


def run_malformed(case: Case, report: Report, ns: dict) -> Outcome:
    """A program polytile must refuse: a PolytileError (other than BuildError) anywhere up to the
    build is right; building it, or failing otherwise, is a finding."""
    import polytile as pt
    what = case.program.malformation
    phase = "program"
    try:
        report({"phase": phase})
        exec(program_source(case.program), ns)  # noqa: S102
        phase = "build"
        report({"phase": phase})
        kern = pt.build(ns["func"])
    except BuildError as err:
        return Outcome("internal", phase, f"{what}: generated code does not compile: {_compiler_error(str(err))}")
    except PolytileError as err:
        return Outcome("ok", phase, f"{what} refused: {type(err).__name__}: {str(err)[:200]}")
    except Exception as err:  # noqa: BLE001
        return Outcome("internal", phase, f"{what}: {schedules.describe(err)}")
    kern.path.unlink(missing_ok=True)
    if what == "out-of-bounds":
        exec(inputs_source(case.program, case.input_seed), ns)  # noqa: S102
        try:
            reference.evaluate(ns["func"], ns["args"], ns["params"])
            return Outcome("ok", phase, "out-of-bounds: the read is never reached (an empty domain)")
        except reference.InvalidProgram:
            pass
    return Outcome("internal", phase, f"a malformed program ({what}) was accepted and built")


def _internal(phase: str, err: BaseException) -> Outcome:
    return Outcome("internal", phase, schedules.describe(err))


def _compiler_error(text: str) -> str:
    """The first error line of a compiler's output."""
    for line in text.splitlines():
        if "error:" in line.lower():
            return line.strip().split("/")[-1][:400]  # without the temporary directory
    return text[-400:]

