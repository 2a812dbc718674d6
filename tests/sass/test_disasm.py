"""nvdisasm location and parsing."""

from __future__ import annotations

import pytest

from polytile.sass import disasm
from polytile.sass.cubin import Cubin
from polytile.sass.disasm import (
    DisassemblyError,
    disassemble,
    find_nvdisasm,
    instruction_from_text,
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
