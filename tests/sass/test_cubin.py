"""Cubin reading and writing, and the control-field layout checked against nvdisasm."""

from __future__ import annotations

import random
import re
import subprocess
from dataclasses import replace

import pytest

from polytile.sass.cubin import NO_BARRIER, Control, Cubin, CubinError
from polytile.sass.disasm import disassemble, find_nvdisasm, text_encodings


@pytest.fixture(scope="module", params=["sm_90a", "sm_90"])
def cubin(request, sample_cubins) -> Cubin:
    return Cubin.from_file(sample_cubins[request.param])


def test_unchanged_write_is_byte_identical(cubin):
    for name, kernel in cubin.kernels.items():
        assert cubin.with_words(name, kernel.words) == cubin.data


def test_patched_words_land_in_the_kernel_text_only(cubin):
    kernel = cubin.kernel("saxpy")
    words = list(kernel.words)
    words[0], words[1] = words[1], words[0]
    patched = cubin.with_words("saxpy", words)
    diff = [i for i, (x, y) in enumerate(zip(cubin.data, patched, strict=True)) if x != y]
    assert diff and kernel.file_offset <= min(diff) and max(diff) < kernel.file_offset + kernel.size
    assert Cubin(patched).kernel("saxpy").words == tuple(words)


def test_kernels_parameters_and_pins(cubin):
    assert cubin.sm == 90
    assert set(cubin.kernels) == {"saxpy", "stencil", "matmul", "warp_sums"}
    saxpy = cubin.kernel("saxpy")
    assert [p.size for p in saxpy.params] == [4, 4, 8, 8]
    assert saxpy.param_bytes == 24
    instructions = disassemble(cubin)["saxpy"]
    exits = {ins.offset for ins in instructions if ins.base == "EXIT"}
    assert exits and exits <= {o for o, why in saxpy.pinned.items() if "EXIT" in why}


def test_errors_name_the_kernel_and_the_file():
    with pytest.raises(CubinError, match="not an ELF"):
        Cubin(b"not a cubin", source="k.ptx")


def test_unknown_kernel_lists_the_available_ones(cubin):
    with pytest.raises(CubinError, match="saxpy"):
        cubin.kernel("nope")


def test_control_fields_round_trip(cubin):
    for kernel in cubin.kernels.values():
        for word in kernel.words:
            assert Control.from_word(word).apply(word) == word


def test_words_match_nvdisasm_encodings(cubin):
    encodings = text_encodings(cubin)
    for name, kernel in cubin.kernels.items():
        assert tuple(encodings[name]) == kernel.words


def test_reuse_bits_match_nvdisasm_reuse_marks(cubin):
    instructions = disassemble(cubin)
    marked = 0
    for name, kernel in cubin.kernels.items():
        for ins, word in zip(instructions[name], kernel.words, strict=True):
            marks = [i for i, op in enumerate(ins.operands) if ".reuse" in op]
            assert bin(Control.from_word(word).reuse).count("1") == len(marks), ins.text
            marked += len(marks)
    assert marked > 0


def _rewrite(cubin: Cubin, edit) -> Cubin:
    data = cubin.data
    for name, kernel in cubin.kernels.items():
        data = Cubin(data).with_words(name, [edit(Control.from_word(w)).apply(w) for w in kernel.words])
    return Cubin(data)


def test_wait_mask_and_reuse_bits_are_outside_the_instruction_text(cubin):
    """Any wait mask leaves nvdisasm's text unchanged; clearing reuse bits drops just the `.reuse` marks."""
    rng = random.Random(0)
    before = disassemble(cubin)
    after = disassemble(_rewrite(cubin, lambda c: replace(c, wait_mask=rng.randrange(64), reuse=0)))
    for name in cubin.kernels:
        for x, y in zip(before[name], after[name], strict=True):
            assert re.sub(r"\.reuse", "", x.text) == y.text


@pytest.mark.parametrize("stall", [0, 1, 11, 12, 15])
def test_encodable_stalls_match_what_nvdisasm_accepts(cubin, stall, tmp_path):
    """With the yield bit set only stalls 1-11 encode; with it clear, 0-15 (Control.max_stall)."""
    kernel = cubin.kernel("matmul")
    words = [Control.from_word(w).with_stall(stall).apply(w) for w in kernel.words]
    path = tmp_path / "trial.cubin"
    path.write_bytes(cubin.with_words("matmul", words))
    result = subprocess.run([find_nvdisasm(), "-c", str(path)], capture_output=True, text=True, check=False)
    rejected = {
        int(a, 16) // 16 for a in re.findall(r"error\s*:.*at address 0x([0-9a-fA-F]+)", result.stderr)
    }
    expected = {
        i
        for i, w in enumerate(kernel.words)
        if not (Control.from_word(w).yield_bit <= stall <= Control.from_word(w).max_stall)
    }
    assert rejected == expected


def test_wait_masks_and_write_barriers_agree_with_the_code(cubin):
    """An S2R result is a scoreboard write; its first reader (or an instruction before it) waits on it."""
    instructions = disassemble(cubin)
    checked = 0
    for name, kernel in cubin.kernels.items():
        controls = [Control.from_word(w) for w in kernel.words]
        for i, ins in enumerate(instructions[name]):
            if ins.base != "S2R":
                continue
            barrier = controls[i].write_barrier
            assert barrier != NO_BARRIER, ins.text
            register = ins.operands[0]
            for j in range(i + 1, len(controls)):
                if barrier in controls[j].waits:
                    checked += 1
                    break
                assert not any(re.search(rf"\b{register}\b", op) for op in instructions[name][j].operands[1:])
    assert checked > 0


def test_out_of_range_field_is_refused():
    with pytest.raises(CubinError, match="stall"):
        Control(16, 0, 7, 7, 0, 0).to_bits()
