"""Disassemble a cubin's kernels with NVIDIA's `nvdisasm` into instructions matched to their words.

`nvdisasm` comes from a CUDA toolkit or from the `nvidia-cuda-nvdisasm` wheel. Its `-c -hex` text
is what is read by default: it has printed the same operands in every version looked at (13.2,
13.4, 13.5). The `-json` form (`use_json=True`) is not: up to 13.4 it glues a shared load's
destination to its address (`LDS` with operands `R3[R7+0x8]`, so the load seemed to write
nothing, and the analysis let a schedule that broke `warp_sums` on an H100 through), and every
version puts P2R's `PR` operand into the predicate field. `parse_json` splits the glued operands
and refuses a predicate that is not one. Both forms give, per instruction, the predicate, opcode
with modifiers and operands, in address order; branch targets come out as hexadecimal byte
offsets.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from polytile.sass.cubin import WORD_BYTES, Cubin


class DisassemblyError(RuntimeError):
    """nvdisasm is missing, failed, or printed something that does not match the cubin."""


@dataclass(frozen=True)
class SassInstruction:
    """One disassembled instruction: `@!P0 LDG.E.128 R4, desc[UR6][R2.64+0x10]`."""

    offset: int
    predicate: str
    opcode: str
    operands: tuple[str, ...]

    @property
    def base(self) -> str:
        return self.opcode.split(".", 1)[0]

    @property
    def modifiers(self) -> tuple[str, ...]:
        return tuple(self.opcode.split(".")[1:])

    @property
    def text(self) -> str:
        head = f"{self.predicate} {self.opcode}" if self.predicate else self.opcode
        return f"{head} {', '.join(self.operands)}" if self.operands else head


def find_nvdisasm() -> str:
    """Path of an nvdisasm binary: $POLYTILE_NVDISASM, the pip wheel (the project's dependency, so
    that every machine reads listings printed by one version: their text differs between releases),
    then PATH, $CUDA_HOME/bin and /usr/local/cuda/bin."""
    candidates = [os.environ.get("POLYTILE_NVDISASM")]
    roots = []
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        roots += list(spec.submodule_search_locations)
    roots += [str(Path(entry) / "nvidia") for entry in sys.path if entry]  # also beside a regular `nvidia`
    for root in roots:
        candidates.extend(str(p) for p in sorted(Path(root).glob("*/bin/nvdisasm")))
    candidates.append(shutil.which("nvdisasm"))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(str(Path(os.environ[var]) / "bin" / "nvdisasm"))
    candidates.append("/usr/local/cuda/bin/nvdisasm")
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise DisassemblyError(
        "nvdisasm was not found: install the CUDA toolkit or `pip install nvidia-cuda-nvdisasm`, "
        "or set POLYTILE_NVDISASM to the binary"
    )


@functools.lru_cache(maxsize=8)
def _supports_json(nvdisasm: str) -> bool:
    result = subprocess.run([nvdisasm, "--help"], capture_output=True, text=True, check=False)
    return "--emit-json" in result.stdout


def disassemble(
    cubin: Cubin, nvdisasm: str | None = None, use_json: bool | None = None
) -> dict[str, list[SassInstruction]]:
    """Instructions of every kernel in `cubin`, checked against its words (count and offsets)."""
    tool = nvdisasm or find_nvdisasm()
    if use_json is None:
        use_json = False  # the text form is the reliable one (module docstring)
    output = _run(tool, ["-json"] if use_json else ["-c", "-hex"], cubin)
    parsed = parse_json(output) if use_json else parse_text(output)
    for name, kernel in cubin.kernels.items():
        instructions = parsed.get(name)
        if instructions is None:
            raise DisassemblyError(f"nvdisasm printed no code for kernel {name!r} of {cubin.source}")
        offsets = [ins.offset for ins in instructions]
        if offsets != [i * WORD_BYTES for i in range(len(kernel.words))]:
            raise DisassemblyError(
                f"nvdisasm printed {len(offsets)} instructions for kernel {name!r}, the cubin has "
                f"{len(kernel.words)} words; the offsets do not line up"
            )
    return parsed


def split_operands(text: str) -> tuple[str, ...]:
    """Split an operand list on commas outside brackets and braces."""
    out, depth, current = [], 0, []
    for ch in text:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    tail = "".join(current).strip()
    if tail:
        out.append(tail)
    return tuple(part for operand in out for part in _unglue(operand))


# A register directly followed by a bracketed address: nvdisasm -json (up to 13.4) prints
# `LDS R3, [R7+0x8]` with the operands "R3[R7+0x8]". desc[UR6][R2.64] and c[0x0][0x28] are
# single operands and stay whole.
_GLUED = re.compile(r"^(-?!?(?:U?R\d+|U?RZ|U?P\d|U?PT))(\[.*)$")


def _unglue(operand: str) -> tuple[str, ...]:
    m = _GLUED.match(operand)
    return (m.group(1), m.group(2)) if m else (operand,)


def parse_json(text: str) -> dict[str, list[SassInstruction]]:
    try:
        document = json.loads(text)
        functions = document[1]
    except (ValueError, IndexError, KeyError) as exc:
        raise DisassemblyError(f"nvdisasm -json printed something unexpected: {exc}") from exc
    parsed = {}
    for function in functions:
        start = int(function.get("start", 0))
        instructions = []
        for i, ins in enumerate(function["sass-instructions"]):
            predicate = ins.get("predicate", "")
            if predicate and not _PREDICATE.match(predicate + " "):
                raise DisassemblyError(
                    f"nvdisasm -json put {predicate!r} in the predicate field of {ins['opcode']} at "
                    f"{start + i * WORD_BYTES:#x} (read the -c -hex text instead)"
                )
            instructions.append(
                SassInstruction(
                    offset=start + i * WORD_BYTES,
                    predicate=predicate,
                    opcode=ins["opcode"],
                    operands=split_operands(ins.get("operands", "")),
                )
            )
        parsed[function["function-name"]] = instructions
    return parsed


_SECTION = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")
_LABEL = re.compile(r"^\s*(\.L\w+):")
_INSTR = re.compile(r"^\s*/\*([0-9a-fA-F]{4,})\*/\s*(.*?)\s*;\s*/\*\s*0x([0-9a-fA-F]+)\s*\*/")
_SECOND_HALF = re.compile(r"^\s*/\*\s*0x([0-9a-fA-F]+)\s*\*/\s*$")
_LABEL_REF = re.compile(r"`\((\.L\w+)\)")
_PREDICATE = re.compile(r"^(@!?U?P(?:T|\d+))\s+")


def instruction_from_text(offset: int, text: str) -> SassInstruction:
    """Parse one instruction as nvdisasm prints it, e.g. `@!P1 IMAD.WIDE R6, R2, 0x4, R6`."""
    body = text.strip().rstrip(";").strip()
    predicate = ""
    pred = _PREDICATE.match(body)
    if pred:
        predicate, body = pred.group(1), body[pred.end() :]
    opcode, _, rest = body.partition(" ")
    return SassInstruction(offset, predicate, opcode, split_operands(rest))


def parse_text(text: str) -> dict[str, list[SassInstruction]]:
    """Parse `nvdisasm -c -hex` output; label references become hexadecimal offsets."""
    return _parse_text(text)[0]


def _parse_text(text: str) -> tuple[dict[str, list[SassInstruction]], dict[str, list[int]]]:
    rows: dict[str, list[tuple[int, str]]] = {}
    labels: dict[str, dict[str, int]] = {}
    encodings: dict[str, list[int]] = {}
    current = None
    pending_labels: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        section = _SECTION.match(line)
        if section:
            current = section.group(1)
            rows[current], labels[current], encodings[current] = [], {}, []
            continue
        if current is None:
            continue
        label = _LABEL.match(line)
        if label:
            pending_labels.append(label.group(1))
            continue
        match = _INSTR.match(line)
        if not match:
            continue
        offset = int(match.group(1), 16)
        for name in pending_labels:
            labels[current][name] = offset
        pending_labels = []
        low = int(match.group(3), 16)
        high_match = _SECOND_HALF.match(lines[i + 1]) if i + 1 < len(lines) else None
        if high_match is None:
            raise DisassemblyError(f"nvdisasm text at offset {offset:#x} has no second encoding half")
        encodings[current].append(low | int(high_match.group(1), 16) << 64)
        rows[current].append((offset, match.group(2)))
    parsed = {}
    for name, entries in rows.items():
        instructions = []
        for offset, body in entries:
            body = _LABEL_REF.sub(lambda m, n=name: hex(labels[n].get(m.group(1), -1)), body)
            instructions.append(instruction_from_text(offset, body))
        parsed[name] = instructions
    return parsed, encodings


def text_encodings(cubin: Cubin, nvdisasm: str | None = None) -> dict[str, list[int]]:
    """The 128-bit encodings `nvdisasm -hex` prints for each kernel, in address order."""
    return _parse_text(_run(nvdisasm or find_nvdisasm(), ["-c", "-hex"], cubin))[1]


def _run(tool: str, options: list[str], cubin: Cubin) -> str:
    """nvdisasm's standard output for `cubin` (written to a temporary file)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin.data)
        handle.flush()
        result = subprocess.run([tool, *options, handle.name], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise DisassemblyError(
            f"nvdisasm {' '.join(options)} failed on {cubin.source}: {result.stderr.strip()}"
        )
    return result.stdout
