"""nvdisasm location and parsing."""

from __future__ import annotations

import json

import pytest

from polytile.sass import disasm
from polytile.sass.cubin import Cubin
from polytile.sass.disasm import (
    DisassemblyError,
    disassemble,
    find_nvdisasm,
    instruction_from_text,
    parse_json,
    parse_text,
    split_operands,
)

TEXT = """
        .section        .text.k,"ax",@progbits
.text.k:
        /*0000*/                   ISETP.GE.AND P0, PT, R2, UR4, PT ;   /* 0x0000000402007c0c */
                                                                        /* 0x000fda000bf06270 */
.L_x_0:
        /*0010*/              @!P0 BRA `(.L_x_0) ;                      /* 0xfffffffc00f88947 */
                                                                        /* 0x000fea000383ffff */
        /*0020*/                   EXIT ;                               /* 0x000000000000794d */
                                                                        /* 0x000fea0003800000 */
"""


def test_text_parser_resolves_labels_and_predicates():
    ((name, instructions),) = parse_text(TEXT).items()
    assert name == "k"
    assert [i.offset for i in instructions] == [0, 16, 32]
    assert instructions[0].operands == ("P0", "PT", "R2", "UR4", "PT")
    assert instructions[1].predicate == "@!P0" and instructions[1].operands == ("0x10",)
    assert instructions[2].opcode == "EXIT" and instructions[2].operands == ()


def test_operands_split_outside_brackets():
    assert split_operands("R5, desc[UR6][R6.64+0x10], c[0x0][0x210]") == (
        "R5",
        "desc[UR6][R6.64+0x10]",
        "c[0x0][0x210]",
    )
    ins = instruction_from_text(0, "@!P1 LDG.E.128 R4, desc[UR6][R2.64] ;")
    assert (ins.predicate, ins.base, ins.modifiers) == ("@!P1", "LDG", ("E", "128"))


def test_json_and_text_agree(sample_cubins):
    cubin = Cubin.from_file(sample_cubins["sm_90a"])
    if not disasm._supports_json(find_nvdisasm()):
        pytest.skip("this nvdisasm has no -json")
    assert disassemble(cubin, use_json=True) == disassemble(cubin, use_json=False)


# What nvdisasm 13.2 and 13.4 print with -json for warp_sums' first shared loads (13.5 prints
# "R4,[R7]"), and the P2R of softmax (every version so far): the text form has `P2R R4, PR, RZ, 0x1`.
OLD_JSON = [
    {"SchemaVersion": {"major": 13, "minor": 4}},
    [
        {
            "function-name": "k",
            "start": 0,
            "sass-instructions": [
                {"opcode": "STS", "operands": "[R7],R2"},
                {"opcode": "LDS", "operands": "R4[R7]"},
                {"opcode": "LDS.64", "operands": "R4[R7+0x40]"},
                {"opcode": "LDG.E", "operands": "R8,desc[UR6][R2.64+0x8]", "predicate": "@!P0"},
            ],
        }
    ],
]


def test_json_loads_keep_their_destination():
    """nvdisasm -json up to 13.4 glues a shared load's destination to its address: read as one
    operand, the LDS wrote nothing, and random schedules of warp_sums broke on an H100."""
    ((name, instructions),) = parse_json(json.dumps(OLD_JSON)).items()
    assert [i.operands for i in instructions] == [
        ("[R7]", "R2"),
        ("R4", "[R7]"),
        ("R4", "[R7+0x40]"),
        ("R8", "desc[UR6][R2.64+0x8]"),
    ]
    assert split_operands("R4[R7], c[0x0][0x28], desc[UR4][R2.64]") == (
        "R4",
        "[R7]",
        "c[0x0][0x28]",
        "desc[UR4][R2.64]",
    )
    p2r = [
        {},
        [
            {
                "function-name": "k",
                "sass-instructions": [{"predicate": "PR", "opcode": "P2R", "operands": "R4,RZ,0x1"}],
            }
        ],
    ]
    with pytest.raises(DisassemblyError, match="predicate field of P2R"):
        parse_json(json.dumps(p2r))


def test_text_is_the_default(sample_cubins, monkeypatch):
    cubin = Cubin.from_file(sample_cubins["sm_90a"])
    monkeypatch.setattr(disasm, "parse_json", lambda text: pytest.fail("-json read by default"))
    assert disassemble(cubin)["warp_sums"][16].operands == ("R4", "[R7]")


def test_missing_nvdisasm_says_how_to_get_it(monkeypatch):
    monkeypatch.delenv("POLYTILE_NVDISASM", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(disasm.shutil, "which", lambda name: None)
    monkeypatch.setattr(disasm.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(disasm.os.path, "isfile", lambda path: False)
    with pytest.raises(DisassemblyError, match="pip install nvidia-cuda-nvdisasm"):
        find_nvdisasm()


def test_env_variable_wins(monkeypatch):
    real = find_nvdisasm()
    monkeypatch.setenv("POLYTILE_NVDISASM", real)
    monkeypatch.setattr(disasm.shutil, "which", lambda name: "/nonexistent/nvdisasm")
    assert find_nvdisasm() == real
