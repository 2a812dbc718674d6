"""Instruction semantics, dependences, pinned instructions, legal moves and stall repair."""

from __future__ import annotations

import random

import pytest

from polytile.sass.analysis import DEFAULT_FIXED_LATENCY, SCOREBOARD_SETUP, KernelAnalysis
from polytile.sass.cubin import Control, Cubin
from polytile.sass.disasm import disassemble, instruction_from_text
from polytile.sass.isa import P_BASE, UR_BASE, memory_conflict, semantics
from polytile.sass.schedule import DOWN, UP, IllegalMove, Move, Schedule


def sem(text):
    return semantics(instruction_from_text(0, text))


def test_register_widths_and_roles():
    s = sem("@!P1 IMAD.WIDE R6, R2, 0x4, R6")
    assert s.defs == {6, 7} and s.uses >= {2, 6, 7, P_BASE + 1}
    assert sem("IMAD.WIDE.U32.X R4, P0, R3, R5, R6, P0").uses >= {3, 5, 6, 7}
    s = sem("LDG.E.128 R4, desc[UR6][R2.64+0x10]")
    assert s.defs == {4, 5, 6, 7} and s.uses == {UR_BASE + 6, UR_BASE + 7, 2, 3} and s.movable
    s = sem("STS.64 [R8+0x10], R4")
    assert s.defs == set() and s.uses == {8, 4, 5}
    s = sem("ISETP.GE.AND P1, PT, R2, UR4, PT")
    assert P_BASE + 1 in s.defs and s.uses >= {2, UR_BASE + 4} and s.fixed_latency
    s = sem("IADD3 R4, P0, PT, R2, R6, RZ")
    assert s.defs >= {4, P_BASE} and {2, 6} <= s.uses and 2 not in s.defs
    assert sem("LOP3.LUT P0, R4, R3, 0x1, RZ, 0xc0, !PT").defs >= {P_BASE, 4}
    assert sem("HMMA.16816.F32 R4, R8, R12, R4").defs == {4, 5, 6, 7}
    assert sem("DFMA R2, R4, R6, R8").uses == {4, 5, 6, 7, 8, 9}


def test_pinned_and_unknown_opcodes():
    assert "branch" in sem("@P0 BRA 0x100").pinned
    assert "barrier" in sem("BAR.SYNC.DEFER_BLOCKING 0x0").pinned
    assert "GMMA" in sem("HGMMA.64x128x16.F32 R24, gdesc[UR4], R24").pinned
    assert "TMA" in sem("UTMALDG.2D [UR8], [UR4]").pinned
    assert "not in polytile's SASS tables" in sem("FOOBAR R1, R2").pinned
    assert not sem("LDG.E.STRONG.GPU R2, desc[UR4][R4.64]").movable


def test_memory_conflicts():
    def mem(text):
        return sem(text).memory

    assert not memory_conflict(mem("LDS R1, [R8]"), mem("LDS R2, [R8]"))
    # disjoint for one lane, but lane t's R8+0x14 may be lane t+1's R8+0x10
    assert memory_conflict(mem("STS [R8+0x10], R1"), mem("LDS R2, [R8+0x14]"))
    assert memory_conflict(mem("STG.E desc[UR4][R2.64], R1"), mem("LDG.E R4, desc[UR4][R2.64+0x10]"))
    assert not memory_conflict(mem("STL [R1+0x10], R2"), mem("LDL R4, [R1+0x14]"))  # thread-private
    assert memory_conflict(mem("STL.64 [R1+0x10], R2"), mem("LDL R4, [R1+0x14]"))
    assert memory_conflict(mem("STS [R8], R1"), mem("LDS R2, [R9]"))
    assert not memory_conflict(mem("STG.E desc[UR4][R2.64], R1"), mem("LDS R2, [R9]"))
    assert memory_conflict(mem("ST.E [R2.64], R1"), mem("LDS R4, [R9]"))
    assert memory_conflict(mem("LDSM.16.M88.4 R4, [R8]"), mem("STS [R8+0x100], R1"))
    # two async copies have no order until a wait (PTX: cp.async), even to one address
    copy = "LDGSTS.E.BYPASS.128 [R9], desc[UR4][R2.64]"
    assert not memory_conflict(mem(copy), mem("LDGSTS.E.BYPASS.128 [R9+0x10], desc[UR4][R4.64]"))
    assert not memory_conflict(mem(copy), mem(copy))
    assert memory_conflict(mem(copy), mem("LDS R2, [R9+0x10]"))
    assert memory_conflict(mem(copy), mem("STS [R10], R1"))
    assert memory_conflict(mem(copy), mem("STG.E desc[UR4][R6.64], R1"))


# A fixed-latency producer (IMAD, 4 cycles to its FADD consumer), a movable load, a filler.
CHAIN = [
    ("IMAD R2, R3, R4, RZ", {"stall": 1}),
    ("LDG.E R8, desc[UR4][R6.64]", {"stall": 1, "write_barrier": 0}),
    ("IADD3 R9, R10, 0x1, RZ", {"stall": 2}),
    ("FADD R5, R2, R2", {"stall": 1}),
    ("STG.E desc[UR4][R6.64], R5", {"stall": 1}),
    ("EXIT", {"stall": 5}),
]


@pytest.fixture
def analysis_of(synthetic):
    def build(rows, **kwargs):
        kernel, instructions = synthetic(rows)
        return KernelAnalysis(kernel, instructions, **kwargs)

    return build


def test_latency_is_the_compilers_minimum_distance(analysis_of):
    a = analysis_of(CHAIN)
    # IADD3's R9 is only live-out: not observed; FADD's R5 goes to a store
    assert a.latency == {("IMAD", "fixed:fma", "R", "read"): 4, ("FADD", "memory", "R", "read"): 1}
    assert a.required_latency(2, 3, 9) == DEFAULT_FIXED_LATENCY  # as if FADD read it
    assert a.movable == (1, 4)


def test_latency_depends_on_the_consumer_and_the_register_kind(analysis_of):
    """A predicate that an ALU instruction reads 2 cycles after the ISETP still needs the
    compiler's distance before the load it guards (ptxas keeps 13 there)."""
    rows = [
        ("ISETP.GE.AND P0, PT, R0, UR6, PT", {"stall": 2}),
        ("@P0 IADD3 R5, R5, 0x1, RZ", {"stall": 1}),
        ("IADD3 R9, R10, 0x1, RZ", {"stall": 9}),
        ("LDG.E R12, desc[UR4][R2.64]", {"write_barrier": 0}),
        ("@!P0 LDG.E R8, desc[UR4][R6.64]", {"write_barrier": 1}),
        ("EXIT", {"wait_mask": 0b11}),
    ]
    a = analysis_of(rows)
    assert a.latency[("ISETP.GE.AND", "fixed:alu", "P", "read")] == 2
    assert a.latency[("ISETP.GE.AND", "memory", "P", "read")] == 13
    s = Schedule(a).apply(Move(4, UP)).apply(Move(4, UP))  # above the LDG and the IADD3
    assert s.order[:5] == (0, 1, 4, 2, 3)
    assert s.stall(0) + s.stall(1) == 13  # the guard's 13 cycles kept, not the ALU reader's 2


def test_latency_depends_on_the_consumers_pipe(analysis_of):
    """ptxas keeps IMAD -> IMAD.WIDE 4 cycles apart and IMAD -> IADD3 5; a repair that gave the IADD3
    only the IMAD.WIDE's 4 read a stale register on an H100 (the sample matmul, docs/sass.md)."""
    rows = [
        ("IMAD R17, R10, UR8, R11", {"stall": 4}),
        ("IMAD.WIDE R18, R17, 0x4, R18", {"stall": 1}),
        ("IMAD R28, R20, R9, R9", {"stall": 1}),
        ("ISETP.GE.OR P0, PT, R10, R9, P0", {"stall": 1}),
        ("LDG.E R27, desc[UR6][R16.64]", {"stall": 3, "write_barrier": 5}),
        ("IADD3 R28, R28, R9, RZ", {"stall": 4}),
        ("STG.E desc[UR6][R18.64], R28", {"stall": 1}),
        ("EXIT", {"stall": 5, "wait_mask": 0b100000}),
    ]
    a = analysis_of(rows)
    assert a.latency[("IMAD", "fixed:fma", "R", "read")] == 4
    assert a.latency[("IMAD", "fixed:alu", "R", "read")] == 5
    s = Schedule(a).apply(Move(4, DOWN))  # the load below the IADD3: IMAD -> IADD3 keeps 5 cycles
    assert s.order[2:6] == (2, 3, 5, 4)
    assert s.stall(2) + s.stall(3) == 5


def test_move_that_shortens_a_latency_gets_a_stall_repair_and_undoing_it_removes_it(analysis_of):
    a = analysis_of(CHAIN)
    s = Schedule(a).apply(Move(1, UP))
    assert s.order[:4] == (1, 0, 2, 3)
    assert s.stall(2) == 3 and s.extra == {2: 1}  # IMAD -> FADD distance kept at 4
    words = s.words()
    assert Control.from_word(words[2]).stall == 3
    back = s.apply(Move(1, DOWN))
    assert back.is_original() and back.words() == list(a.kernel.words)


def test_repair_spills_to_earlier_slots_and_is_refused_when_nothing_fits(analysis_of):
    rows = [list(r) for r in CHAIN]
    rows[2] = ("IADD3 R9, R10, 0x1, RZ", {"stall": 11})  # at the yield-bit maximum already
    rows[0] = ("IMAD R2, R3, R4, RZ", {"stall": 3})
    a = analysis_of([tuple(r) for r in rows], latency_overrides={"IMAD": 15})
    s = Schedule(a).apply(Move(1, UP))  # window IMAD,IADD3 = 14 < 15: IMAD takes +1
    assert s.extra == {0: 1}
    rows[0] = ("IMAD R2, R3, R4, RZ", {"stall": 11})
    a = analysis_of([tuple(r) for r in rows], latency_overrides={"IMAD": 23})
    result, reason = Schedule(a).check(Move(1, UP))
    assert result is None and "stall" in reason


def test_dependences_and_pins_forbid_moves(analysis_of):
    a = analysis_of(CHAIN)
    s = Schedule(a)
    _, reason = s.check(Move(4, UP))  # STG reads R5 written by FADD
    assert "register dependence on R5" in reason
    _, reason = s.check(Move(4, DOWN))  # EXIT is pinned
    assert "pinned" in reason
    _, reason = s.check(Move(1, DOWN))  # LDG and IADD3 are independent
    assert reason == ""
    with pytest.raises(IllegalMove, match="register dependence"):
        s.apply(Move(4, UP))
    assert list(s.legal_mask()) == [True, True, False, False]


def test_lanes_that_talk_through_memory_keep_their_order(analysis_of):
    """`s[t] = v; __syncwarp(); v += s[t + 4];` as nvcc compiles it for sm_90: the __syncwarp()
    is a NOP, and the load reads what another lane stored, though not at this lane's address."""
    rows = [
        ("STS [R5+UR4], R8", {}),
        ("NOP", {}),
        ("LDS R3, [R5+UR4+0x10]", {"write_barrier": 0}),
        ("LDS R4, [R7+UR4]", {"write_barrier": 1}),
        ("FADD R0, R3, R4", {"wait_mask": 0b11}),
        ("EXIT", {}),
    ]
    a = analysis_of(rows)
    assert "pinned" in Schedule(a).check(Move(2, UP))[1]
    rows[1] = ("IADD3 R9, R10, 0x1, RZ", {})  # without the NOP (volatile warp-synchronous code)
    a = analysis_of(rows)
    s = Schedule(a).apply(Move(2, UP))
    assert "memory accesses that may overlap" in s.check(Move(2, UP))[1]


def test_scoreboard_guard_keeps_readers_after_the_wait(analysis_of):
    rows = [
        ("LDS R2, [R8]", {"write_barrier": 0}),
        ("FADD R3, R9, R9", {"wait_mask": 1}),  # waits SB0, so R2 is ready after it
        ("LDS R4, [R2+0x10]", {"write_barrier": 1}),  # reads R2 without waiting itself
        ("EXIT", {}),
    ]
    assert "guards registers" in Schedule(analysis_of(rows)).check(Move(2, UP))[1]
    rows[2] = ("LDS R4, [R7+0x10]", {"write_barrier": 1})  # reads nothing the wait guards
    assert Schedule(analysis_of(rows)).check(Move(2, UP))[1] == ""


def test_unguarded_shared_load_keeps_its_place_among_scoreboard_users(analysis_of):
    rows = [
        ("LDS R2, [R8]", {}),  # no write barrier: a later wait covers it
        ("LDS R4, [R8+0x10]", {"write_barrier": 0}),
        ("FADD R3, R2, R4", {"wait_mask": 1}),
        ("EXIT", {}),
    ]
    a = analysis_of(rows)
    assert "unguarded" in Schedule(a).check(Move(0, DOWN))[1]


def test_a_wait_stays_two_cycles_after_the_set_of_its_scoreboard(analysis_of):
    """The H100 failure in miniature (Triton's fma3): a load that reads R2 under read barrier 5
    moved down to just before the LDC that waits on 5 to overwrite R2. One cycle after the set
    the wait sees nothing pending, and the LDC can win the race for R2; the repair keeps 2."""
    rows = [
        ("@!P1 LDG.E.128 R20, desc[UR4][R2.64+0x800]", {"read_barrier": 5, "write_barrier": 4}),
        ("CS2R R26, SRZ", {}),
        ("LDC.64 R2, c[0x0][0x228]", {"wait_mask": 1 << 5, "write_barrier": 1}),
        ("EXIT", {"wait_mask": 1 << 1 | 1 << 4}),
    ]
    a = analysis_of(rows)
    s = Schedule(a).apply(Move(0, DOWN))
    assert s.order[:3] == (1, 0, 2) and s.extra == {0: 1} and s.stall(0) == SCOREBOARD_SETUP
    assert Control.from_word(s.words()[1]).stall == 2


# Two async copies under one read barrier (Triton's matmul loop), the commit and the wait.
COPIES = [
    ("LDGSTS.E.BYPASS.128 [R9], desc[UR4][R2.64]", {"read_barrier": 2}),
    ("LDGSTS.E.BYPASS.128 [R9+0x1000], desc[UR4][R4.64]", {"read_barrier": 2, "stall": 1}),
    ("LDGDEPBAR", {"write_barrier": 0}),
    ("IADD3 R2, R2, 0x80, RZ", {"wait_mask": 1 << 2}),
    ("DEPBAR.LE SB0, 0x0", {}),
    ("EXIT", {}),
]


def test_setters_of_one_scoreboard_commute_and_every_setter_keeps_the_setup_distance(analysis_of):
    a = analysis_of(COPIES)
    assert 2 not in a.counted_scoreboards and a.order_conflict(0, 1) is None
    assert Schedule(a).apply(Move(1, UP)).order[:2] == (1, 0)
    # the first copy, once last, is one cycle from the wait on SB2: it gets the second cycle
    rows = [
        (COPIES[0][0], {"read_barrier": 2, "stall": 1}),
        (COPIES[1][0], {"read_barrier": 2, "stall": 2}),
        ("IADD3 R2, R2, 0x80, RZ", {"wait_mask": 1 << 2}),
        ("EXIT", {}),
    ]
    s = Schedule(analysis_of(rows)).apply(Move(1, UP))
    assert s.order[:3] == (1, 0, 2) and s.stall(0) == SCOREBOARD_SETUP


def test_a_wait_or_a_counted_depbar_keeps_setters_of_a_scoreboard_in_order(analysis_of):
    waits = [COPIES[0], (COPIES[1][0], {"read_barrier": 2, "wait_mask": 1 << 2}), *COPIES[2:]]
    a = analysis_of(waits)
    assert "scoreboard SB2" in a.order_conflict(0, 1)
    # DEPBAR.LE SB2, 0x1 lets the last copy stay pending: that assumes completion in issue order
    counted = [*COPIES[:4], ("DEPBAR.LE SB2, 0x1", {}), COPIES[5]]
    a = analysis_of(counted)
    assert a.counted_scoreboards == {2} and "scoreboard SB2" in a.order_conflict(0, 1)


def test_memory_access_keeps_the_compilers_settling_distance_after_a_barrier(analysis_of):
    """On an H100 an LDSM moved to 4 cycles after a BAR.SYNC.DEFER_BLOCKING read shared memory
    before the other warps' stores (Triton's matmul epilogue); ptxas keeps 6 (its own BAR S06
    before an LDS), so a shared load gets min(original distance, the compiler's fewest)."""
    tail = [
        ("BAR.SYNC.DEFER_BLOCKING 0x0", {"stall": 1}),
        ("IADD3 R9, R10, 0x1, RZ", {"stall": 2}),
        ("IADD3 R11, R10, 0x2, RZ", {"stall": 2}),
        ("IADD3 R12, R10, 0x3, RZ", {"stall": 2}),
        ("LDS R3, [R8+0x4]", {"write_barrier": 1}),
        ("EXIT", {"wait_mask": 3}),
    ]
    observed = [("BAR.SYNC.DEFER_BLOCKING 0x0", {"stall": 6}), ("LDS R2, [R8]", {"write_barrier": 0})]
    a = analysis_of(observed + tail)
    assert a.settle == {"BAR": 6}
    s = Schedule(a)
    for _ in range(3):
        s = s.apply(Move(6, UP))
    assert s.order[2:4] == (2, 6) and s.stall(2) == 6  # the barrier's stall carries the 6 cycles
    # the compiler put its nearest access 7 cycles after the barrier: the access keeps 7
    a = analysis_of(tail)
    assert a.settle == {"BAR": 7}
    s = Schedule(a)
    for _ in range(3):
        s = s.apply(Move(4, UP))
    assert s.order[:2] == (0, 4) and s.stall(0) == 7


def test_scoreboard_set_and_wait_in_different_blocks_keep_their_distance(analysis_of):
    """The set at the end of one block, the wait in the next: the distance across the edge holds."""
    rows = [
        ("LDG.E R20, desc[UR4][R2.64]", {"read_barrier": 5, "write_barrier": 4}),
        ("@P0 BRA 0x40", {"stall": 0}),
        ("STS [R8], R9", {}),  # one cycle between the set and the wait: moving it below is illegal
        ("LDC.64 R2, c[0x0][0x228]", {"wait_mask": 1 << 5}),
        ("EXIT", {"wait_mask": 1 << 4}),
    ]
    a = analysis_of(rows)
    result, reason = Schedule(a).check(Move(2, DOWN))
    assert result is None and "stall repair" in reason


def test_unguarded_source_read_keeps_its_distance_to_an_overwrite_in_the_next_block(analysis_of):
    """STS reads R3 with no read barrier; the overwrite of R3 in the next block keeps its distance."""
    rows = [
        ("STS [R3], R4", {}),
        ("@P0 BRA 0x40", {}),
        ("LDS R6, [R8]", {"write_barrier": 0, "stall": 4}),
        ("IADD3 R3, R5, 0x1, RZ", {}),
        ("EXIT", {"wait_mask": 1}),
    ]
    a = analysis_of(rows)
    result, reason = Schedule(a).check(Move(2, DOWN))
    assert result is None and "stall repair" in reason


def _conflicting_pairs(a: KernelAnalysis, block) -> list[tuple[int, int]]:
    return [
        (i, j)
        for i in range(block.start, block.end)
        for j in range(i + 1, block.end)
        if a.order_conflict(i, j)
    ]


@pytest.fixture(scope="module")
def matmul(sample_cubins):
    cubin = Cubin.from_file(sample_cubins["sm_90a"])
    return cubin, KernelAnalysis(cubin.kernel("matmul"), disassemble(cubin)["matmul"])


def test_random_legal_walk_keeps_every_dependence_and_distance(matmul):
    _, a = matmul
    rng = random.Random(1)
    s = Schedule(a)
    pairs = {b.index: _conflicting_pairs(a, b) for b in a.blocks}
    repaired = 0
    for _ in range(150):
        mask = s.legal_mask()
        assert mask.any()
        k = rng.choice(list(mask.nonzero()[0]))
        s = s.apply(Move(a.movable[k // 2], UP if k % 2 == 0 else DOWN))
        repaired += bool(s.extra)
        stalls = [Control.from_word(w).stall for w in s.words()]
        for block in a.blocks:
            for i, j in pairs[block.index]:
                assert s.position[i] < s.position[j], (a.instructions[i].text, a.instructions[j].text)
            for rule in a.rules[block.index]:
                lo = block.start if rule.producer < 0 else s.position[rule.producer]
                hi = block.end if rule.consumer == -2 else s.position[rule.consumer]
                assert sum(stalls[lo:hi]) >= rule.required, rule
    assert repaired, "the walk never needed a stall repair; the test lost its teeth"


def test_legal_swap_reads_back_exchanged_in_nvdisasm(matmul):
    cubin, a = matmul
    s = Schedule(a)
    k = int(s.legal_mask().nonzero()[0][0])
    move = Move(a.movable[k // 2], UP if k % 2 == 0 else DOWN)
    moved = s.apply(move)
    p = int(s.position[move.instruction])
    q = p + move.direction
    patched = Cubin(cubin.with_words("matmul", moved.words()))
    before = disassemble(cubin)["matmul"]
    after = disassemble(patched)["matmul"]
    assert after[p].text.replace(".reuse", "") == before[q].text.replace(".reuse", "")
    assert after[q].text.replace(".reuse", "") == before[p].text.replace(".reuse", "")
    untouched = [i for i in range(len(before)) if i not in (p, q)]
    assert all(before[i].opcode == after[i].opcode for i in untouched)


def test_pinned_instructions_never_move(matmul):
    _, a = matmul
    assert a.pinned and not set(a.pinned) & set(a.movable)
    s = Schedule(a)
    for i in a.pinned:
        for j in (i - 1, i + 1):
            if j in a.movable:
                direction = DOWN if j < i else UP
                assert s.check(Move(j, direction))[0] is None
