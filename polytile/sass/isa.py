"""What one Hopper SASS instruction reads, writes and touches in memory, from its disassembly.

Everything here errs on the side of more dependences: an operand whose role is unclear counts as
both read and written, a width that is unclear counts as the wider one, and an opcode outside
these tables is pinned (never moved, and nothing moves across it), and so is an instruction whose
operands or predicate do not read as nvdisasm's text prints them (a register glued to an address,
`R3[R7]`; a predicate that is not `@P<n>`/`@UP<n>`). Register units are integers:
R<n> is n, UR<n> is 1000+n, P<n> is 2000+n, UP<n> is 3000+n; RZ, URZ, PT and UPT are no units.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from polytile.sass.disasm import SassInstruction

UR_BASE, P_BASE, UP_BASE = 1000, 2000, 3000
ALL_PREDICATES = frozenset(range(P_BASE, P_BASE + 7))
ALL_UNIFORM_PREDICATES = frozenset(range(UP_BASE, UP_BASE + 7))

# Opcodes that must stay where they are, by reason (CuAsmRL section 3, and the list).
_PINNED = {
    "branch or reads the PC": {
        "BRA",
        "BRX",
        "BRXU",
        "JMP",
        "JMX",
        "JMXU",
        "CALL",
        "RET",
        "EXIT",
        "BREAK",
        "BSSY",
        "BSYNC",
        "KILL",
        "BPT",
        "RTT",
        "NANOSLEEP",
        "YIELD",
        "LEPC",
        "WARPSYNC",
        "BMOV",
        "PRET",
        "PBK",
        "PCNT",
    },
    "barrier or dependency barrier": {
        "BAR",
        "BARRIER",
        "MEMBAR",
        "FENCE",
        "ERRBAR",
        "CGAERRBAR",
        "DEPBAR",
        "LDGDEPBAR",
        "ARRIVES",
        "CCTL",
        "CCTLL",
        "CCTLT",
        "UCGABAR_ARV",
        "UCGABAR_WAIT",
        "UCGABAR_GET",
        "ACQBULK",
    },
    # ptxas compiles __syncwarp() to a NOP on sm_90 (and names it in .nv.info, which pins it too):
    # what the warp's lanes stored before it is visible to their loads after it, so nothing
    # crosses a NOP, named or not
    "warp-level memory barrier (__syncwarp() compiles to NOP)": {"NOP"},
    "warpgroup / GMMA": {"HGMMA", "QGMMA", "IGMMA", "BGMMA", "WARPGROUP", "USETMAXREG", "SETMAXREG"},
    "SYNCS / TMA": {
        "SYNCS",
        "UTMALDG",
        "UTMASTG",
        "UTMAPF",
        "UTMACCTL",
        "UTMAREDG",
        "UTMACMDFLUSH",
        "UBLKCP",
        "UBLKRED",
        "UBLKPF",
    },
}
PINNED_OPCODES = {op: reason for reason, ops in _PINNED.items() for op in ops}
# Instructions that hold the warp until other warps or pending operations catch up; memory
# accesses keep a settling distance after them (analysis.KernelAnalysis.settle).
SETTLING = frozenset(_PINNED["barrier or dependency barrier"] | {"NOP", "WARPSYNC", "WARPGROUP"})
CONTROL_FLOW = _PINNED["branch or reads the PC"] - {"BMOV", "NANOSLEEP", "YIELD", "LEPC", "WARPSYNC"}

# Results after a fixed number of cycles; the compiler relies on stall counts, not scoreboards.
FIXED_LATENCY = {
    "FADD",
    "FMUL",
    "FFMA",
    "FMNMX",
    "FSEL",
    "FSET",
    "FSETP",
    "FSWZADD",
    "FADD32I",
    "FMUL32I",
    "FFMA32I",
    "HADD2",
    "HMUL2",
    "HFMA2",
    "HMNMX2",
    "HSET2",
    "HSETP2",
    "HADD2_32I",
    "HMUL2_32I",
    "HFMA2_32I",
    "IMAD",
    "IMAD32I",
    "IADD3",
    "IADD",
    "IADD32I",
    "IABS",
    "IMNMX",
    "ISCADD",
    "ISCADD32I",
    "ISETP",
    "LEA",
    "LOP3",
    "LOP",
    "LOP32I",
    "SHF",
    "SHL",
    "SHR",
    "SEL",
    "PRMT",
    "MOV",
    "MOV32I",
    "PLOP3",
    "PSETP",
    "P2R",
    "R2P",
    "BMSK",
    "SGXT",
    "VIADD",
    "VIADDMNMX",
    "VIMNMX",
    "VIMNMX3",
    "VHMNMX",
    "IDP",
    "IDP4A",
    "CS2R",
    "F2FP",
    "I2FP",
    "F2IP",
    "FMNMX3",
    "FADD2",
    "FMUL2",
    "FFMA2",
    "UIADD3",
    "UIMAD",
    "ULOP3",
    "ULOP",
    "USHF",
    "USHL",
    "USHR",
    "UMOV",
    "USEL",
    "ULEA",
    "UISETP",
    "UPLOP3",
    "UPRMT",
    "UIMNMX",
    "USGXT",
    "UBMSK",
    "ULDC",
    "UP2UR",
    "UR2UP",
    "UPSETP",
    "UVIADD",
}
# The pipe a fixed-latency instruction issues to. A result reaches a consumer on the producer's own
# pipe sooner than one on another pipe: ptxas keeps IMAD -> IMAD.WIDE 4 cycles apart but IMAD ->
# IADD3 5, and an IMAD -> IADD3 distance of 4 reads the old register on an H100 (the sample matmul,
# docs/sass.md). So the latency table is kept per consumer pipe (`fixed_pipe`).
FMA_PIPE = {
    "FADD", "FMUL", "FFMA", "FADD32I", "FMUL32I", "FFMA32I", "FADD2", "FMUL2", "FFMA2", "FSWZADD",
    "IMAD", "IMAD32I", "IDP", "IDP4A", "HADD2", "HMUL2", "HFMA2", "HADD2_32I", "HMUL2_32I", "HFMA2_32I",
}
ALU_PIPE = {
    "IADD3", "IADD", "IADD32I", "IABS", "IMNMX", "ISCADD", "ISCADD32I", "ISETP", "LEA", "LOP3", "LOP",
    "LOP32I", "SHF", "SHL", "SHR", "SEL", "PRMT", "MOV", "MOV32I", "PLOP3", "PSETP", "P2R", "R2P", "BMSK",
    "SGXT", "FMNMX", "FSEL", "FSET", "FSETP", "CS2R",
}


def fixed_pipe(ins: SassInstruction) -> str:
    """"fma", "alu", "uniform", "fma.mma" (HFMA2.MMA) or, for a fixed-latency opcode whose pipe is not
    tabulated, the opcode itself (its latencies are then only compared with its own)."""
    base = ins.base
    if base == "HFMA2" and "MMA" in ins.modifiers:
        return "fma.mma"
    if base in FMA_PIPE:
        return "fma"
    if base in ALU_PIPE:
        return "alu"
    if base.startswith("U") and base in FIXED_LATENCY:
        return "uniform"
    return base


# Known instructions with variable latency (scoreboards) that are not memory accesses.
VARIABLE_LATENCY = {
    "S2R",
    "S2UR",
    "R2UR",
    "MUFU",
    "SHFL",
    "F2F",
    "F2I",
    "I2F",
    "I2I",
    "FRND",
    "POPC",
    "FLO",
    "BREV",
    "DADD",
    "DMUL",
    "DFMA",
    "DSETP",
    "DMNMX",
    "DSET",
    "HMMA",
    "IMMA",
    "DMMA",
    "BMMA",
    "MATCH",
    "REDUX",
    "VOTE",
    "VOTEU",
    "FCHK",
    "UFLO",
    "UPOPC",
    "UBREV",
    "CREDUX",
    "ELECT",
}
# Memory opcodes: (space read, space written). "generic" may be global, shared or local.
MEMORY = {
    "LDG": ("global", None),
    "STG": (None, "global"),
    "LDS": ("shared", None),
    "STS": (None, "shared"),
    "LDSM": ("shared", None),
    "STSM": (None, "shared"),
    "LDGSTS": ("global", "shared"),
    "LDL": ("local", None),
    "STL": (None, "local"),
    "LD": ("generic", None),
    "ST": (None, "generic"),
    "LDC": ("const", None),
    "ATOMG": ("global", "global"),
    "RED": ("global", "global"),
    "REDG": ("global", "global"),
    "ATOMS": ("shared", "shared"),
    "ATOM": ("generic", "generic"),
}
# The memory instructions the assembly game may move.
MOVABLE = {"LDG", "STG", "LDS", "STS", "LDSM", "STSM", "LDGSTS", "LDL", "STL", "LD", "ST"}
# Opcodes with no destination operand: every register they name is read.
_NO_DEST = {"STG", "STS", "STSM", "STL", "ST", "RED", "REDG", "LDGSTS"} | set(PINNED_OPCODES)
# Memory orderings that other threads may observe: such accesses keep their order with all others.
_ORDERED_MODIFIERS = {"STRONG", "SYS", "GPU", "MMIO", "VOLATILE", "ACQUIRE", "RELEASE", "SM"}
_PER_LANE_ADDRESS = {"LDG", "STG", "LDS", "STS", "LDL", "STL", "LD", "ST"}
_SIXTY_FOUR = {"64", "F64", "S64", "U64"}
_SPACES = {"global", "shared", "local"}

OPCODE_CLASSES = ("fixed", "variable", "load", "store", "atomic", "async_copy", "pinned")

_REGISTER = re.compile(r"(?<![\w.])(!?)(UR\d+|URZ|R\d+|RZ|UP\d|UPT|P\d|PT|UPR|PR)((?:\.64)?)(?![\w])")
_BARE_PREDICATE = re.compile(r"^(U?P\d|U?PT)$")
_BARE_REGISTER = re.compile(r"^(U?R\d+|U?RZ)$")
# A register written right before a bracketed address, with no comma: the destination and the
# address of a load as one operand (nvdisasm -json up to 13.4), which would read as no destination.
_GLUED_ADDRESS = re.compile(r"^-?!?(?:U?R\d+|U?RZ|U?P\d|U?PT|U?PR)\[")
_PREDICATE_FORM = re.compile(r"^@!?U?P(?:T|\d)$")
_IMMEDIATE = re.compile(r"([+-])\s*(-?0x[0-9a-fA-F]+|-?\d+)(?![\w])")


@dataclass(frozen=True)
class MemoryAccess:
    """One memory access: the spaces it reads and writes, and its per-lane address when known."""

    reads: frozenset[str]
    writes: frozenset[str]
    address: tuple[str, ...] | None  # registers of a per-lane address, None if not per-lane
    offset: int
    width: int  # bytes
    ordered: bool  # keeps its order with every other memory access
    asynchronous: bool = False  # an asynchronous copy (LDGSTS, PTX cp.async)


@dataclass(frozen=True)
class Semantics:
    """What one instruction does, as far as scheduling is concerned."""

    defs: frozenset[int]
    uses: frozenset[int]
    memory: MemoryAccess | None
    pinned: str | None  # why it never moves, or None
    fixed_latency: bool
    movable: bool
    opcode_class: str


def unit(token: str) -> int | None:
    """Register unit number of a register token, None for RZ/URZ/PT/UPT."""
    if token in ("RZ", "URZ", "PT", "UPT"):
        return None
    for prefix, base in (("UR", UR_BASE), ("UP", UP_BASE), ("R", 0), ("P", P_BASE)):
        if token.startswith(prefix) and token[len(prefix) :].isdigit():
            return base + int(token[len(prefix) :])
    raise ValueError(f"not a register: {token}")


def unit_name(u: int) -> str:
    for prefix, base in (("UP", UP_BASE), ("P", P_BASE), ("UR", UR_BASE)):
        if u >= base:
            return f"{prefix}{u - base}"
    return f"R{u}"


def _units(token: str, width: int) -> set[int]:
    if token == "PR":
        return set(ALL_PREDICATES)
    if token == "UPR":
        return set(ALL_UNIFORM_PREDICATES)
    first = unit(token)
    return set() if first is None else set(range(first, first + width))


def data_width(ins: SassInstruction) -> int:
    """Registers moved per lane by a memory instruction."""
    mods = set(ins.modifiers)
    if ins.base in ("LDSM", "STSM"):
        return 4 if "4" in mods else 2 if "2" in mods else 1
    if "128" in mods:
        return 4
    return 2 if "64" in mods else 1


def _operand_widths(ins: SassInstruction, count: int) -> list[int]:
    """Registers covered by each operand's register (over-approximated where unsure)."""
    mods = set(ins.modifiers)
    base = ins.base
    if base in MEMORY:
        return [data_width(ins)] * count
    if base in ("HMMA", "IMMA", "DMMA", "BMMA"):
        return [4] * count
    if base.startswith("D") and base in VARIABLE_LATENCY or mods & _SIXTY_FOUR:
        return [2] * count
    if base in ("IMAD", "UIMAD") and "WIDE" in mods:  # destination and addend are 64-bit; the
        return [2] * count  # operand order shifts with carries (.X)
    if base == "CS2R" and "32" not in mods:
        return [2] * count
    return [1] * count


def _memory_access(ins: SassInstruction) -> MemoryAccess | None:
    spaces = MEMORY.get(ins.base)
    if spaces is None:
        return None
    read, written = spaces

    def expand(space):
        return frozenset() if space is None else frozenset(_SPACES if space == "generic" else {space})

    address_operand = next((op for op in ins.operands if "[" in op and not op.startswith("c[")), "")
    address = None
    offset = 0
    if ins.base in _PER_LANE_ADDRESS and address_operand:
        body = address_operand[address_operand.rfind("[") + 1 : address_operand.rfind("]")]
        prefix = address_operand[: address_operand.rfind("[")]
        registers = sorted(m.group(2) for m in _REGISTER.finditer(body) if m.group(2) not in ("RZ", "URZ"))
        address = tuple(registers) + ((prefix,) if prefix else ())
        offset = sum(int(v, 0) * (-1 if sign == "-" else 1) for sign, v in _IMMEDIATE.findall("+" + body))
    width = 4 * data_width(ins)
    if ins.base == "LDGSTS":
        width = 16 if "128" in ins.modifiers else 8 if "64" in ins.modifiers else 4
    ordered = bool(set(ins.modifiers) & _ORDERED_MODIFIERS)
    return MemoryAccess(expand(read), expand(written), address, offset, width, ordered, ins.base == "LDGSTS")


def semantics(ins: SassInstruction) -> Semantics:
    """Defs, uses, memory access and scheduling class of `ins` (see the module docstring)."""
    base = ins.base
    pinned = PINNED_OPCODES.get(base)
    known = base in FIXED_LATENCY or base in VARIABLE_LATENCY or base in MEMORY or pinned
    if not known:
        pinned = f"opcode {base} is not in polytile's SASS tables"
    operands = list(ins.operands)
    if not pinned and (
        any(_GLUED_ADDRESS.match(op) for op in operands)
        or ins.predicate
        and not _PREDICATE_FORM.match(ins.predicate)
    ):
        pinned = f"operands not understood: {ins.text}"
    widths = _operand_widths(ins, len(operands))
    defs: set[int] = set()
    uses: set[int] = set()
    has_dest = base not in _NO_DEST and bool(operands) and "[" not in operands[0]
    first_is_predicate = bool(operands) and bool(_BARE_PREDICATE.match(operands[0]))
    for i, operand in enumerate(operands):
        tokens = [(m.group(2), m.group(3)) for m in _REGISTER.finditer(operand)]
        for token, suffix in tokens:
            width = 2 if suffix or operand.startswith("desc[") and token.startswith("UR") else widths[i]
            if "[" in operand and not suffix and not operand.startswith("desc["):
                width = 1
            units = _units(token, width)
            if has_dest and i == 0:
                defs |= units
            elif has_dest and _leading_destination(operands, i, first_is_predicate):
                defs |= units
                uses |= units
            else:
                uses |= units
    if ins.predicate:
        uses |= _units(ins.predicate.lstrip("@!"), 1)
    memory = _memory_access(ins)
    if base in MEMORY:
        opcode_class = (
            "async_copy"
            if base == "LDGSTS"
            else "atomic"
            if memory.reads and memory.writes
            else "store"
            if memory.writes
            else "load"
        )
    elif pinned:
        opcode_class = "pinned"
    else:
        opcode_class = "fixed" if base in FIXED_LATENCY else "variable"
    movable = base in MOVABLE and not pinned and not memory.ordered
    return Semantics(
        defs=frozenset(defs),
        uses=frozenset(uses),
        memory=memory,
        pinned=pinned,
        fixed_latency=base in FIXED_LATENCY,
        movable=movable,
        opcode_class=opcode_class,
    )


def _leading_destination(operands: list[str], i: int, first_is_predicate: bool) -> bool:
    """Operands right after the destination that may be further destinations (carry-outs, Pu)."""
    if i == 1 and first_is_predicate and _BARE_REGISTER.match(operands[1]):
        return True
    return all(_BARE_PREDICATE.match(operands[k]) for k in range(1, i + 1))


def memory_conflict(a: MemoryAccess, b: MemoryAccess) -> bool:
    """True unless two accesses provably commute, for every lane of the warp.

    Two reads commute, and so do accesses to different spaces. The same address registers with
    disjoint offsets keep one lane's accesses apart, but in shared and global memory another lane,
    running the same instructions with other register values, may reach the other address, and
    lanes do communicate that way: after __syncwarp() (a NOP on sm_90) or in volatile
    warp-synchronous code (plain LDS/STS on sm_90). Only local memory is private to a thread.

    Two asynchronous copies (LDGSTS) commute: the PTX ISA gives no ordering between two cp.async
    operations not separated by cp.async.wait_group / wait_all or an mbarrier, and those waits
    (DEPBAR, and the commit LDGDEPBAR) are pinned, so no move crosses them.
    """
    if a.ordered or b.ordered:
        return True
    if a.asynchronous and b.asynchronous:
        return False
    if not (a.writes & (b.reads | b.writes) or b.writes & a.reads):
        return False
    private = a.reads | a.writes == b.reads | b.writes == {"local"}
    if private and a.address is not None and a.address == b.address:
        return not (a.offset + a.width <= b.offset or b.offset + b.width <= a.offset)
    return True
