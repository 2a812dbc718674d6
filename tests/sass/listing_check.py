"""An independent check of a rescheduled kernel, from nvdisasm's text alone (a test utility).

This module deliberately shares no code with `polytile.sass.isa` / `analysis` / `schedule`: it
reads the original and the patched listing (`nvdisasm -hex` text of the ELF or of raw words),
matches their instructions by encoding (control bits masked), re-derives what every instruction
reads and writes (R, UR, P, UP, with widths), its memory space and its control fields, and then
checks on the patched order what the hardware needs:

- every instruction stays in its basic block, and keeps its order with every instruction it has
  a register or memory dependence on, and with every instruction that is not a plain ALU or
  memory operation (branches, barriers, fences, ...);
- its control fields are the original ones, but for a stall that may only grow and reuse flags
  that are only kept before the original successor;
- scoreboards: no instruction touches a register whose variable-latency write is still pending,
  or overwrites a source a pending read barrier still protects (a dataflow over the control-flow
  graph, in the order of the listing);
- timing: every wait on a scoreboard comes at least `SCOREBOARD_SETUP` cycles after the last
  instruction that set it; every memory access comes at least min(original distance, the
  compiler's fewest cycles for that barrier opcode) after the barrier before it; every consumer
  of a fixed-latency result comes at least min(original distance, latency) cycles after its
  producer, the latency being the compiler's
  smallest distance for that opcode in the original; an overwrite of a source that a
  variable-latency instruction read without a read barrier keeps min(original, ASYNC_WINDOW).

The timing rules are differential: a consumer is flagged only where the patched distance is
below both the rule and the original distance (the compiler's own schedule is the reference).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field

SCOREBOARD_SETUP = 2  # cycles from setting a scoreboard to an instruction that may wait on it
ASYNC_WINDOW = 32
LATENCY_CAP = 15  # assumed: no fixed-latency result needs more cycles (one stall field's maximum)
CAP = 64  # distances are tracked up to this many cycles

_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;\s*/\*\s*0x([0-9a-f]{16})\s*\*/", re.I)
_HIGH = re.compile(r"^\s*/\*\s*0x([0-9a-f]{16})\s*\*/\s*$", re.I)
_LABEL = re.compile(r"^\s*([.$\w]+):\s*$")
_SECTION = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")
_TARGET = re.compile(r"`\(([.$\w]+)\)")
_REG = re.compile(r"(?<![\w.])(UR\d+|UP\d|R\d+|P\d|UPR|PR)(\.64)?(?!\w)")

# Plain operations: reordering memory instructions around them is fine if registers allow. Not
# NOP: __syncwarp() compiles to one on sm_90, and it orders the memory accesses of the warp's lanes.
ALU = set(
    """FADD FMUL FFMA FMNMX FSEL FSET FSETP FSWZADD FADD32I FMUL32I FFMA32I HADD2 HMUL2 HFMA2 HMNMX2
    HSET2 HSETP2 HADD2_32I HMUL2_32I HFMA2_32I IMAD IMAD32I IADD3 IADD IADD32I IABS IMNMX ISCADD
    ISCADD32I ISETP LEA LOP3 LOP LOP32I SHF SHL SHR SEL PRMT MOV MOV32I PLOP3 PSETP P2R R2P BMSK SGXT
    VIADD VIADDMNMX VIMNMX VIMNMX3 VHMNMX IDP IDP4A CS2R F2FP I2FP F2IP FMNMX3 FADD2 FMUL2 FFMA2
    UIADD3 UIMAD ULOP3 ULOP USHF USHL USHR UMOV USEL ULEA UISETP UPLOP3 UPRMT UIMNMX USGXT UBMSK ULDC
    UP2UR UR2UP UPSETP UVIADD""".split()
)
# A barrier does not hold the warp at once (BAR.SYNC.DEFER_BLOCKING): memory accesses keep the
# compiler's fewest cycles after one (an LDSM 4 cycles after a BAR read stale shared memory on an H100)
SETTLING = set("BAR BARRIER MEMBAR FENCE ERRBAR CGAERRBAR DEPBAR LDGDEPBAR ARRIVES CCTL CCTLL CCTLT NOP WARPSYNC "
               "WARPGROUP UCGABAR_ARV UCGABAR_WAIT UCGABAR_GET ACQBULK".split())
VARIABLE = set(
    """S2R S2UR R2UR MUFU SHFL F2F F2I I2F I2I FRND POPC FLO BREV DADD DMUL DFMA DSETP DMNMX DSET HMMA
    IMMA DMMA BMMA MATCH REDUX VOTE VOTEU FCHK UFLO UPOPC UBREV CREDUX ELECT""".split()
)
SPACES = {
    "LDG": ("global", False), "STG": ("global", True), "ATOMG": ("global", True), "RED": ("global", True),
    "REDG": ("global", True), "LDS": ("shared", False), "STS": ("shared", True), "LDSM": ("shared", False),
    "STSM": ("shared", True), "ATOMS": ("shared", True), "LDL": ("local", False), "STL": ("local", True),
    "LD": ("generic", False), "ST": ("generic", True), "ATOM": ("generic", True),
    "LDGSTS": ("global+shared", True),
}  # fmt: skip
NO_DESTINATION = {"STG", "STS", "STSM", "STL", "ST", "RED", "REDG", "LDGSTS"}
ORDERED = {"STRONG", "SYS", "GPU", "MMIO", "VOLATILE", "ACQUIRE", "RELEASE", "SM"}
ENDS_BLOCK = {"BRA", "BRX", "BRXU", "JMP", "JMX", "JMXU", "CALL", "RET", "EXIT", "BREAK", "BSYNC", "BSSY"}
ENDS_BLOCK |= {"KILL", "BPT", "RTT"}
NO_FALLTHROUGH = {"BRA", "BRX", "BRXU", "JMP", "JMX", "JMXU", "RET", "EXIT", "KILL", "RTT"}
INDIRECT = {"BRX", "BRXU", "JMX", "JMXU", "JMP"}


@dataclass
class Row:
    """One instruction of a listing."""

    offset: int
    predicate: str
    opcode: str
    operands: list[str]
    word: int
    targets: list[int] = field(default_factory=list)  # branch targets, as instruction indices

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]

    @property
    def mods(self) -> set[str]:
        return set(self.opcode.split(".")[1:])

    @property
    def stall(self) -> int:
        return (self.word >> 105) & 0xF

    @property
    def yield_bit(self) -> int:
        return (self.word >> 109) & 1

    @property
    def write_barrier(self) -> int | None:
        b = (self.word >> 110) & 7
        return None if b == 7 else b

    @property
    def read_barrier(self) -> int | None:
        b = (self.word >> 113) & 7
        return None if b == 7 else b

    @property
    def waits(self) -> set[int]:
        mask = (self.word >> 116) & 0x3F
        waits = {b for b in range(6) if mask >> b & 1}
        if self.base == "DEPBAR":  # DEPBAR.LE SB0, n waits on a scoreboard named as an operand
            waits |= {int(m) for op in self.operands for m in re.findall(r"\bSB(\d)\b", op)}
        return waits

    @property
    def reuse(self) -> int:
        return (self.word >> 122) & 0xF

    @property
    def key(self) -> int:
        """The encoding without its control bits (bits 105 and up)."""
        return self.word & ((1 << 105) - 1)

    @property
    def text(self) -> str:
        return f"{self.predicate} {self.opcode} {', '.join(self.operands)}".strip()

    def at(self, offset: int) -> Row:
        return Row(offset, self.predicate, self.opcode, self.operands, self.word, self.targets)


def _parse(text: str) -> dict[str, list[tuple[Row, list[str]]]]:
    """Rows of an `nvdisasm -hex` listing per section (one section 'raw' for a raw binary), each
    with the labels just before it."""
    sections: dict[str, list[tuple[Row, list[str]]]] = {}
    current = sections.setdefault("raw", [])
    labels: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        section = _SECTION.match(line)
        if section:
            current = sections.setdefault(section.group(1), [])
            labels = []
            continue
        label = _LABEL.match(line)
        if label:
            labels.append(label.group(1))
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        high = _HIGH.match(lines[i + 1])
        word = int(m.group(3), 16) | int(high.group(1), 16) << 64
        body = m.group(2)
        predicate = ""
        pm = re.match(r"^(@!?U?P(?:T|\d))\s+", body)
        if pm:
            predicate, body = pm.group(1), body[pm.end() :]
        opcode, _, rest = body.partition(" ")
        operands, depth, cur = [], 0, ""
        for ch in rest:
            depth += ch in "[({"
            depth -= ch in "])}"
            if ch == "," and depth == 0:
                operands.append(cur.strip())
                cur = ""
            else:
                cur += ch
        if cur.strip():
            operands.append(cur.strip())
        current.append((Row(int(m.group(1), 16), predicate, opcode, operands, word), labels))
        labels = []
    return sections


def _nvdisasm(nvdisasm: str, options: list[str], data: bytes) -> str:
    with tempfile.NamedTemporaryFile() as handle:
        handle.write(data)
        handle.flush()
        return subprocess.run(
            [nvdisasm, *options, handle.name], capture_output=True, text=True, check=True
        ).stdout


def listing(cubin: bytes, nvdisasm: str) -> dict[str, list[Row]]:
    """The kernels of a cubin as nvdisasm prints its ELF, with branch targets from the labels."""
    out = {}
    for name, entries in _parse(_nvdisasm(nvdisasm, ["-c", "-hex"], cubin)).items():
        if name == "raw":
            continue
        at = {label: k for k, (_, labels) in enumerate(entries) for label in labels}
        rows = []
        for row, _ in entries:
            if row.base != "RET":
                row.targets = [at[n] for op in row.operands for n in _TARGET.findall(op) if n in at]
            rows.append(row)
        out[name] = rows
    return out


def kernels(sequences: list[list[int]], nvdisasm: str, arch: str = "SM90a") -> list[list[Row]]:
    """Kernels given as 128-bit words, disassembled in one raw-binary run of nvdisasm (it takes
    most of a second to start); branch targets are resolved within each kernel."""
    data = b"".join(w.to_bytes(16, "little") for words in sequences for w in words)
    rows = [row for row, _ in _parse(_nvdisasm(nvdisasm, ["-b", arch, "-hex"], data))["raw"]]
    if len(rows) != len(data) // 16:
        raise AssertionError(f"nvdisasm printed {len(rows)} instructions for {len(data) // 16} words")
    out, start = [], 0
    for words in sequences:
        kernel = [row.at(16 * k) for k, row in enumerate(rows[start : start + len(words)])]
        for row in kernel:
            if row.base in ENDS_BLOCK and row.base != "RET":
                values = [int(op, 16) - 16 * start for op in row.operands if re.fullmatch(r"0x[0-9a-f]+", op)]
                row.targets = [v // 16 for v in values if 0 <= v < 16 * len(words)]
        out.append(kernel)
        start += len(words)
    return out


def decode(words, nvdisasm: str, arch: str = "SM90a") -> dict[int, Row]:
    """Distinct instruction words, each as nvdisasm prints it (one raw-binary run)."""
    unique = sorted(set(words))
    rows = kernels([unique], nvdisasm, arch)[0] if unique else []
    return {w: row for w, row in zip(unique, rows, strict=True)}


def variant(words: list[int], decoded: dict[int, Row]) -> list[Row]:
    """A reordered kernel's listing, from `decode`d words (branches are never read from it)."""
    return [decoded[w].at(16 * k) for k, w in enumerate(words)]


# ---- what one instruction touches ---------------------------------------------------------------


def _width(row: Row, operand_index: int, suffix: str, inside_brackets: bool, token: str) -> int:
    base, mods = row.base, row.mods
    if suffix:
        return 2
    if inside_brackets:
        return 2 if token.startswith("UR") and row.operands[operand_index].startswith("desc[") else 1
    if base in SPACES:
        if base in ("LDSM", "STSM"):
            return 4 if "4" in mods else 2 if "2" in mods else 1
        return 4 if "128" in mods else 2 if "64" in mods else 1
    if base in ("HMMA", "IMMA", "DMMA", "BMMA"):
        return 4
    if base[0] == "D" and base in VARIABLE or mods & {"64", "F64", "S64", "U64"}:
        return 2
    if base in ("IMAD", "UIMAD") and "WIDE" in mods:
        return 2
    if base == "CS2R" and "32" not in mods:
        return 2
    return 1


def _units(token: str, width: int) -> set[str]:
    if token == "PR":
        return {f"P{k}" for k in range(7)}
    if token == "UPR":
        return {f"UP{k}" for k in range(7)}
    prefix = re.match(r"[A-Z]+", token).group(0)
    n = int(token[len(prefix) :])
    return {f"{prefix}{n + k}" for k in range(width)}


def _bare_predicate(operand: str) -> bool:
    return re.fullmatch(r"U?P(\d|T)", operand) is not None


@dataclass
class Effects:
    reads: set[str]
    writes: set[str]
    space: str | None  # memory space touched, None if none
    stores: bool
    address: tuple[str, int, int] | None  # (address text without offset, offset, bytes)
    ordered: bool
    kind: str  # "alu" (fixed latency), "variable", "memory", "other"
    pipe: str = ""  # for "alu": the pipe it issues to (`_pipe`)


def effects(row: Row) -> Effects:
    base = row.base
    reads: set[str] = set()
    writes: set[str] = set()
    known = base in ALU or base in VARIABLE or base in SPACES or base == "LDC"
    has_destination = base not in NO_DESTINATION
    for operand in row.operands:  # `R3[R7]` (nvdisasm -json up to 13.4) would read as no destination
        if re.match(r"-?!?U?(R\d+|RZ|P\d|PT)\[", operand):
            raise AssertionError(f"operand {operand!r} of {row.text} glues a register to an address")
    for i, operand in enumerate(row.operands):
        bracketed = "[" in operand
        destination = (
            has_destination
            and not bracketed
            and (
                i == 0
                or known
                and all(_bare_predicate(row.operands[k]) for k in range(1, i + 1))
                or known
                and i == 1
                and _bare_predicate(row.operands[0])
                and re.fullmatch(r"U?R\d+", operand)
            )
        )
        for m in _REG.finditer(operand):
            token = m.group(1)
            start = m.start()
            inside = operand.rfind("[", 0, start) > operand.rfind("]", 0, start)
            units = _units(token, _width(row, i, m.group(2) or "", inside, token))
            if destination:
                writes |= units
                if i > 0 or not known:
                    reads |= units  # unsure whether it is a source too
            else:
                reads |= units
    if row.predicate:
        reads |= _units(row.predicate.lstrip("@!"), 1) if row.predicate[-1] != "T" else set()
    space, stores, address = None, False, None
    if base in SPACES:
        space, stores = SPACES[base]
        bracket = next((op for op in row.operands if "[" in op and not op.startswith("c[")), None)
        if bracket is not None:
            inner = bracket[bracket.rfind("[") + 1 : bracket.rfind("]")].replace(" ", "")
            terms = [t for t in re.split(r"(?=[+-])", inner) if t not in ("", "+", "-")]
            numbers = [t for t in terms if re.fullmatch(r"[+-]?(0x[0-9a-f]+|\d+)", t)]
            offset = sum(int(t, 0) for t in numbers)
            regs = tuple(t.lstrip("+") for t in terms if t not in numbers)
            nbytes = 16 if "128" in row.mods else 8 if "64" in row.mods else 4
            if base in ("LDSM", "STSM"):
                nbytes = 1 << 30  # warp-collective: lanes address other rows
            address = (bracket[: bracket.rfind("[")] + "|" + "|".join(regs), offset, nbytes)
    kind = (
        "memory"
        if base in SPACES or base == "LDC"
        else "alu"
        if base in ALU
        else "variable"
        if known
        else "other"
    )
    return Effects(reads, writes, space, stores, address, bool(row.mods & ORDERED), kind, _pipe(row))


# Multiply-add pipe: a result crosses to another pipe a cycle later (ptxas: IMAD -> IMAD.WIDE 4
# cycles, IMAD -> IADD3 5; the H100 reads a stale register at IMAD -> IADD3 4).
FMA_LIKE = set("FADD FMUL FFMA FADD32I FMUL32I FFMA32I FADD2 FMUL2 FFMA2 IMAD IMAD32I IDP IDP4A HADD2 HMUL2 "
               "HFMA2 HADD2_32I HMUL2_32I HFMA2_32I".split())
INTEGER_LIKE = set("IADD3 IADD IADD32I IABS IMNMX ISCADD ISCADD32I ISETP LEA LOP3 LOP LOP32I SHF SHL SHR SEL "
                   "PRMT MOV MOV32I PLOP3 PSETP P2R R2P BMSK SGXT FMNMX FSEL FSET FSETP CS2R".split())


def _pipe(row: Row) -> str:
    if row.base == "HFMA2" and "MMA" in row.mods:
        return "fma.mma"
    if row.base in FMA_LIKE:
        return "fma"
    if row.base in INTEGER_LIKE:
        return "alu"
    return "uniform" if row.base.startswith("U") else row.base


def _memory_conflict(a: Effects, b: Effects) -> bool:
    if a.space is None or b.space is None:
        return False
    if a.ordered or b.ordered:
        return True
    if a.space == b.space == "global+shared":  # two LDGSTS: cp.async has no order until a wait (PTX ISA)
        return False
    if not (a.stores or b.stores):
        return False
    spaces_a = {"global", "shared", "local"} if a.space == "generic" else set(a.space.split("+"))
    spaces_b = {"global", "shared", "local"} if b.space == "generic" else set(b.space.split("+"))
    if not spaces_a & spaces_b:
        return False
    # the same registers with disjoint offsets keep one lane's accesses apart, not another lane's:
    # only local memory is private to a lane
    if a.address and b.address and a.address[0] == b.address[0] and a.space == b.space == "local":
        (_, oa, na), (_, ob, nb) = a.address, b.address
        return not (oa + na <= ob or ob + nb <= oa)
    return True


# ---- blocks and control flow --------------------------------------------------------------------


def blocks(rows: list[Row]) -> tuple[list[tuple[int, int]], list[list[int]]]:
    """Basic blocks as (start, end) and each block's successors, from branches and their targets.

    A call falls through to its return site, and a return may go to every return site; with a
    computed branch (BRX, JMX) every block may follow every block.
    """
    leaders = {0} | {t for row in rows for t in row.targets}
    for i, row in enumerate(rows):
        if row.base in ENDS_BLOCK and i + 1 < len(rows):
            leaders.add(i + 1)
    starts = sorted(leaders)
    spans = [(s, starts[k + 1] if k + 1 < len(starts) else len(rows)) for k, s in enumerate(starts)]
    block_at = {s: k for k, (s, _) in enumerate(spans)}
    if any(row.base in INDIRECT for row in rows):
        return spans, [list(range(len(spans))) for _ in spans]
    return_sites = [block_at[i + 1] for i, row in enumerate(rows) if row.base == "CALL" and i + 1 < len(rows)]
    successors = []
    for k, (_, end) in enumerate(spans):
        last = rows[end - 1]
        succ = [block_at[t] for t in last.targets]
        if last.base == "RET":
            succ += return_sites
        unconditional = last.predicate in ("", "@PT")
        if end < len(rows) and not (last.base in NO_FALLTHROUGH and unconditional):
            succ.append(k + 1)
        successors.append(sorted(set(succ)))
    return spans, successors


# ---- the check ----------------------------------------------------------------------------------


def match(original: list[Row], patched: list[Row], claimed: list[int] | None = None) -> list[int]:
    """For each patched row, the index of the original row with the same encoding.

    Identical instructions (a kernel may repeat `@!PT LDS RZ, [RZ]`, or an HMMA in an unrolled
    copy of a loop) differ only in their control bits, so the listing alone cannot say which is
    which. `claimed` (the reorderer's own permutation) names them; it is taken only if every
    claimed original has the patched row's encoding. Either labeling of identical instructions
    executes the same code, so a listing that passes under the claimed one is correct.
    Without a claim, identical instructions are matched in order.
    """
    if claimed is not None:
        if sorted(claimed) != list(range(len(original))):
            raise AssertionError("the claimed order is not a permutation of the original")
        for p, i in enumerate(claimed):
            if original[i].key != patched[p].key:
                raise AssertionError(
                    f"patched instruction {patched[p].text!r} at {patched[p].offset:#x} is not "
                    f"original {original[i].text!r} at {original[i].offset:#x}"
                )
        return list(claimed)
    by_key: dict[int, list[int]] = defaultdict(list)
    for i, row in enumerate(original):
        by_key[row.key].append(i)
    out = []
    for row in patched:
        candidates = by_key.get(row.key)
        if not candidates:
            raise AssertionError(
                f"patched instruction {row.text!r} at {row.offset:#x} is not in the original"
            )
        out.append(candidates.pop(0))
    return out


def _dataflow(spans, successors, transfer, join) -> dict:
    """Forward dataflow to a fixed point, then one recording pass: the facts `transfer` records.

    `transfer(block, state, facts)` updates the state through one block (and records facts when
    `facts` is a dict). A block no path reaches starts from the empty state.
    """
    n = len(spans)
    preds: list[list[int]] = [[] for _ in range(n)]
    for k, succ in enumerate(successors):
        for s in succ:
            preds[s].append(k)
    entry: list[dict | None] = [None] * n
    exits: list[dict | None] = [None] * n
    everywhere = all(len(succ) == n for succ in successors)  # indirect flow: one join for all
    changed = True
    while changed:
        changed = False
        universal = None
        if everywhere:
            for state in exits:
                if state is not None:
                    universal = state if universal is None else join(universal, state)
        for k in range(n):
            if everywhere:
                states = [x for x in (universal, {} if k == 0 else None) if x is not None]
            else:
                states = [exits[q] for q in preds[k] if exits[q] is not None] + ([{}] if k == 0 else [])
            if not states:
                continue
            state = states[0]
            for other in states[1:]:
                state = join(state, other)
            if entry[k] is not None:  # entries only grow: a transfer that is not monotone (a
                state = join(entry[k], state)  # wait clears what a set added) cannot oscillate
            if state == entry[k]:
                continue
            entry[k] = state
            state = _copy(state)
            transfer(k, state, None)
            exits[k] = state
            changed = True
    facts: dict = {}
    for k in range(n):
        transfer(k, _copy(entry[k] or {}), facts)
    return facts


def _copy(state):
    return {k: dict(v) if isinstance(v, dict) else set(v) for k, v in state.items()}


def _join_sets(a, b):
    out = _copy(a)
    for k, v in b.items():
        out[k] = out.get(k, set()) | v
    return out


def _join_min(a, b):
    out = _copy(a)
    for k, v in b.items():
        mine = out.setdefault(k, {})
        for op, d in v.items():
            mine[op] = min(mine.get(op, CAP), d)
    return out


def timing_facts(rows: list[Row], ids: list[int], spans, successors, fx: list[Effects]) -> dict:
    """Per consumer (original id), the distances and scoreboard hazards the hardware cares about."""

    def pending_writes(k, state, facts):
        """state: unit -> barriers (or ('inorder', id)) of variable-latency writes not waited for.

        A result without a write barrier (a shared load completing in order) counts as covered by
        the next scoreboard set after it: '#cover<b>' holds the results a wait on b also covers.
        """
        for p in range(*spans[k]):
            row, e = rows[p], fx[p]
            for b in row.waits:
                covered = state.pop(f"#cover{b}", set()) | {b}
                for unit in [u for u in state if not u.startswith("#")]:
                    state[unit] = state[unit] - covered
                    if not state[unit]:
                        del state[unit]
            if facts is not None:
                for unit in sorted(e.reads | e.writes):
                    if state.get(unit):
                        facts[("write pending", ids[p], unit)] = True
            for unit in e.writes:
                state.pop(unit, None)
            if e.kind in ("variable", "memory") and e.writes:
                token = row.write_barrier if row.write_barrier is not None else ("inorder", ids[p])
                for unit in e.writes:
                    state[unit] = {token}
            if row.write_barrier is not None:
                pending = set().union(*(v for u, v in state.items() if not u.startswith("#")))
                inorder = {t for t in pending if isinstance(t, tuple)}
                if inorder:
                    key = f"#cover{row.write_barrier}"
                    state[key] = state.get(key, set()) | inorder

    def pending_reads(k, state, facts):
        """state: unit -> read barriers of variable-latency reads not yet waited for."""
        for p in range(*spans[k]):
            row, e = rows[p], fx[p]
            for b in row.waits:
                for unit in list(state):
                    state[unit] = state[unit] - {b}
                    if not state[unit]:
                        del state[unit]
            if facts is not None:
                for unit in sorted(e.writes):
                    if state.get(unit):
                        facts[("read pending", ids[p], unit)] = True
            if row.read_barrier is not None:
                for unit in e.reads:
                    state.setdefault(unit, set()).add(row.read_barrier)

    def since(k, state, facts):
        """Cycles since things happened: unit -> {producer id: cycles} for fixed-latency results,
        '#async R<n>' -> {reader id: cycles} for reads without a read barrier, '#SB<b>' -> {setter
        id: cycles} for scoreboard sets. Inside the block the values are clock stamps."""
        clock = 0
        stamps = {key: {q: -d for q, d in v.items()} for key, v in state.items()}
        for p in range(*spans[k]):
            row, e = rows[p], fx[p]
            if facts is not None:
                for b in row.waits:
                    for q, t in stamps.get(f"#SB{b}", {}).items():
                        facts[("scoreboard setup", ids[p], b, q)] = clock - t
                for unit in e.reads | e.writes:
                    for q, t in stamps.get(unit, {}).items():
                        facts[("latency", ids[p], unit, q)] = clock - t
                for unit in e.writes:
                    for q, t in stamps.get("#async " + unit, {}).items():
                        facts[("async read", ids[p], unit, q)] = clock - t
                if row.base in SPACES:
                    for q, t in stamps.get("#BAR", {}).items():
                        facts[("barrier settle", ids[p], "memory", q)] = clock - t
            if row.base in SETTLING:
                stamps["#BAR"] = {ids[p]: clock}  # the last barrier is the one that counts
            for b in row.waits:
                stamps.pop(f"#SB{b}", None)  # once waited for, a set is history
            for b in {row.write_barrier, row.read_barrier} - {None}:
                stamps.setdefault(f"#SB{b}", {})[ids[p]] = clock
            for unit in e.writes:
                stamps.pop(unit, None)
                stamps.pop("#async " + unit, None)
                if e.kind == "alu":
                    stamps[unit] = {ids[p]: clock}
            if e.kind in ("variable", "memory") and row.read_barrier is None:
                for unit in e.reads:
                    stamps.setdefault("#async " + unit, {})[ids[p]] = clock
            clock += row.stall
        state.clear()
        for key, v in stamps.items():
            distances = {q: clock - t for q, t in v.items() if clock - t < CAP}
            if distances:
                state[key] = distances

    return {
        **_dataflow(spans, successors, pending_writes, _join_sets),
        **_dataflow(spans, successors, pending_reads, _join_sets),
        **_dataflow(spans, successors, since, _join_min),
    }


def latency_key(producer: Row, consumer: Effects, unit: str) -> tuple[str, str, str, str]:
    """What a fixed-latency distance depends on: the producer's opcode, the kind of consumer
    (ALU by pipe, memory, other), the kind of register (R, UR, P, UP) and whether the consumer reads it or
    only overwrites it. ptxas keeps 13 cycles from an ISETP to the memory instruction it guards,
    but 2 to an ALU instruction that reads the predicate; uniform results and memory consumers
    show the same pattern."""
    consumer_kind = consumer.kind if consumer.kind in ("alu", "memory") else "other"
    if consumer_kind == "alu":
        consumer_kind = "alu:" + consumer.pipe
    access = "read" if unit in consumer.reads else "write"
    return producer.opcode, consumer_kind, re.match(r"[A-Z]+", unit).group(0), access


def latency_table(rows: list[Row], fx: list[Effects]) -> dict[tuple[str, str, str, str], int]:
    """The compiler's smallest distance from a fixed-latency result to its next user, per
    `latency_key`, over the pairs inside basic blocks."""
    spans, _ = blocks(rows)
    table: dict[tuple[str, str, str, str], int] = {}
    for start, end in spans:
        last: dict[str, int] = {}
        for c in range(start, end):
            for unit in fx[c].reads | fx[c].writes:
                p = last.get(unit)
                if p is not None and fx[p].kind == "alu":
                    key = latency_key(rows[p], fx[c], unit)
                    table[key] = min(table.get(key, CAP), sum(rows[k].stall for k in range(p, c)))
            for unit in fx[c].writes:
                last[unit] = c
    return table


class Checker:
    """The facts of one original kernel, computed once, to check many reorderings of it."""

    def __init__(self, original: list[Row]) -> None:
        self.original = original
        self.fx = [effects(r) for r in original]
        self.spans, self.successors = blocks(original)
        self.block_of = [0] * len(original)
        for k, (s, e) in enumerate(self.spans):
            self.block_of[s:e] = [k] * (e - s)
        self.table = latency_table(original, self.fx)
        self.facts = timing_facts(original, list(range(len(original))), self.spans, self.successors, self.fx)
        self.settle: dict[str, int] = {}  # per barrier opcode, the compiler's fewest cycles to a memory access
        for fact, value in self.facts.items():
            if fact[0] == "barrier settle":
                base = original[fact[3]].base
                self.settle[base] = min(self.settle.get(base, CAP), value)

    def name(self, i: int) -> str:
        return f"{self.original[i].offset:#06x} {self.original[i].text}"

    def check(self, patched: list[Row], claimed: list[int] | None = None) -> list[str]:
        """Everything wrong with `patched` as a reordering of the original (empty if nothing);
        `claimed`: which original each patched row is, where identical instructions repeat."""
        original = self.original
        if len(original) != len(patched):
            return [f"{len(patched)} instructions, the original has {len(original)}"]
        for a, b in zip(original, patched, strict=True):
            if a.base in ENDS_BLOCK and a.key != b.key:
                return [f"{self.name(a.offset // 16)} moved: control flow changed"]
        ids = match(original, patched, claimed)
        return self._order(ids) + self._controls(ids, patched) + self._timing(ids, patched)

    def _order(self, ids: list[int]) -> list[str]:
        """Instructions stay in their blocks and keep their order with what they depend on."""
        problems = []
        position = {i: p for p, i in enumerate(ids)}
        for p, i in enumerate(ids):
            start, end = self.spans[self.block_of[i]]
            if not start <= p < end:
                problems.append(f"{self.name(i)} left its block")
        # i < j swapped means |pos(i) - i| + |pos(j) - j| > j - i: only pairs closer than twice the
        # largest displacement in the block can have swapped
        for start, end in self.spans:
            reach = 2 * max(abs(position[i] - i) for i in range(start, end))
            for i in range(start, end):
                for j in range(i + 1, min(end, i + reach)):
                    if position[i] < position[j]:
                        continue
                    a, b = self.fx[i], self.fx[j]
                    clash = a.writes & (b.reads | b.writes) | a.reads & b.writes
                    why = (
                        f"registers {sorted(clash)}"
                        if clash
                        else "memory"
                        if _memory_conflict(a, b)
                        else "a non-plain instruction"
                        if "other" in (a.kind, b.kind)
                        else None
                    )
                    if why:
                        problems.append(f"{self.name(j)} now before {self.name(i)} ({why})")
        return problems

    def _controls(self, ids: list[int], patched: list[Row]) -> list[str]:
        """Control fields as the compiler set them; stalls may only grow; reuse only before the
        original successor."""
        problems = []
        for p, i in enumerate(ids):
            o, n = self.original[i], patched[p]
            for attr in ("yield_bit", "write_barrier", "read_barrier", "waits"):
                if getattr(o, attr) != getattr(n, attr):
                    problems.append(f"{self.name(i)}: {attr} changed")
            if n.stall < o.stall:
                problems.append(f"{self.name(i)}: stall {o.stall} -> {n.stall}")
            if n.reuse and (p + 1 >= len(ids) or ids[p + 1] != i + 1):
                problems.append(f"{self.name(i)}: keeps reuse flags before a new successor")
        return problems

    def _timing(self, ids: list[int], patched: list[Row]) -> list[str]:
        """Scoreboard coverage and distances, against the original's (blocks stay in place)."""
        problems = []
        fx = [self.fx[i] for i in ids]
        after = timing_facts(patched, ids, self.spans, self.successors, fx)
        for fact, value in sorted(after.items(), key=str):
            kind, consumer = fact[0], fact[1]
            if kind in ("write pending", "read pending"):
                if fact not in self.facts:
                    problems.append(
                        f"{self.name(consumer)}: {kind} on {fact[2]} (no wait covers it any more)"
                    )
                continue
            old = self.facts.get(fact, CAP)
            producer = fact[3]
            if kind == "latency":
                key = latency_key(self.original[producer], self.fx[consumer], fact[2])
                need = min(self.table.get(key, LATENCY_CAP), LATENCY_CAP)
            elif kind == "barrier settle":
                need = self.settle.get(self.original[producer].base, CAP)
            else:
                need = SCOREBOARD_SETUP if kind == "scoreboard setup" else ASYNC_WINDOW
            if value < min(old, need):
                problems.append(
                    f"{self.name(consumer)}: {kind} on {fact[2]} after {self.name(producer)}: "
                    f"{value} cycles < min(original {old}, {need})"
                )
        return problems


def check(original: list[Row], patched: list[Row]) -> list[str]:
    """Everything wrong with `patched` as a reordering of `original` (empty if nothing)."""
    return Checker(original).check(patched)
