"""Read a cubin's kernels as 128-bit instruction words and write patched copies of it.

Reading goes through `pyelftools`; writing never re-serializes the ELF: it copies the original
bytes and overwrites the `.text.<kernel>` bytes in place, so a cubin written back unchanged is
byte-identical. Only instruction order and control bits change, never the file layout.

Control fields of a Volta-and-later instruction word (bits of the 128-bit little-endian word):
stall 105-108, yield 109, write barrier 110-112, read barrier 113-115, wait mask 116-121,
operand reuse 122-125. A barrier field of 7 means "no barrier". With the yield bit set, only
stalls 1-11 are valid encodings (nvdisasm rejects the others; checked in the tests); with it
clear, 0-15.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass, replace
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

NO_BARRIER = 7
STALL_MAX = 15
STALL_MAX_YIELD = 11
WORD_BYTES = 16

_CONTROL_SHIFT = 105
_CONTROL_MASK = (1 << 21) - 1

# .nv.info entry formats and the attributes that matter here (codes from the cuobjdump tables).
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4
_EIATTR_KPARAM_INFO = 0x17
_EIATTR_CBANK_PARAM_SIZE = 0x19
_EIATTR_INDIRECT_BRANCH_TARGETS = 0x34
# Attributes whose payload is a list of u32 instruction offsets inside the kernel's text.
_OFFSET_LIST_ATTRS = {
    0x1C: "EXIT_INSTR_OFFSETS",
    0x1D: "S2RCTAID_INSTR_OFFSETS",
    0x25: "LD_CACHEMOD_INSTR_OFFSETS",
    0x27: "ATOM_SYS_INSTR_OFFSETS",
    0x28: "COOP_GROUP_INSTR_OFFSETS",
    0x2D: "ATOMF16_EMUL_INSTR_OFFSETS",
    0x31: "INT_WARP_WIDE_INSTR_OFFSETS",
    0x39: "MBARRIER_INSTR_OFFSETS",
    0x3A: "COROUTINE_RESUME_ID_OFFSETS",
    0x46: "SYSCALL_OFFSETS",
    0x47: "SW_WAR_MEMBAR_SYS_INSTR_OFFSETS",
    0x57: "STACK_CANARY_TRAP_OFFSETS",
    0x59: "LOCAL_CTA_ASYNC_STORE_OFFSETS",
}
# Sized attributes known to carry no instruction offsets; any other sized attribute is scanned
# conservatively (every aligned u32 that names an instruction pins it).
_NON_OFFSET_ATTRS = {  # sizes, parameter tables, register ids, statistics, versions, cluster shapes
    0x04, 0x05, 0x0A, 0x10, 0x11, 0x12, 0x17, 0x1E, 0x23, 0x29, 0x2F, 0x33, 0x36, 0x37, 0x3D, 0x50,
}  # fmt: skip


class CubinError(ValueError):
    """A cubin that cannot be read, or a kernel or patch that does not fit it."""


@dataclass(frozen=True)
class Control:
    """The scheduling control fields of one instruction word."""

    stall: int
    yield_bit: int
    write_barrier: int
    read_barrier: int
    wait_mask: int
    reuse: int

    @classmethod
    def from_word(cls, word: int) -> Control:
        bits = (word >> _CONTROL_SHIFT) & _CONTROL_MASK
        return cls(
            stall=bits & 0xF,
            yield_bit=(bits >> 4) & 0x1,
            write_barrier=(bits >> 5) & 0x7,
            read_barrier=(bits >> 8) & 0x7,
            wait_mask=(bits >> 11) & 0x3F,
            reuse=(bits >> 17) & 0xF,
        )

    def to_bits(self) -> int:
        for name, value, limit in (
            ("stall", self.stall, 15),
            ("yield_bit", self.yield_bit, 1),
            ("write_barrier", self.write_barrier, 7),
            ("read_barrier", self.read_barrier, 7),
            ("wait_mask", self.wait_mask, 63),
            ("reuse", self.reuse, 15),
        ):
            if not 0 <= value <= limit:
                raise CubinError(f"control field {name}={value} is out of range 0..{limit}")
        return (
            self.stall
            | self.yield_bit << 4
            | self.write_barrier << 5
            | self.read_barrier << 8
            | self.wait_mask << 11
            | self.reuse << 17
        )

    def apply(self, word: int) -> int:
        """`word` with its control bits replaced by these fields; all other bits untouched."""
        return (word & ~(_CONTROL_MASK << _CONTROL_SHIFT)) | (self.to_bits() << _CONTROL_SHIFT)

    def with_stall(self, stall: int) -> Control:
        return replace(self, stall=stall)

    @property
    def max_stall(self) -> int:
        """The largest stall this word can encode without touching its yield bit."""
        return STALL_MAX_YIELD if self.yield_bit else STALL_MAX

    @property
    def waits(self) -> tuple[int, ...]:
        return tuple(b for b in range(6) if self.wait_mask >> b & 1)

    def __str__(self) -> str:
        """CuAssembler-like text: wait mask, read/write barriers, yield bit, stall."""
        waits = "".join(str(b) if self.wait_mask >> b & 1 else "-" for b in range(6))
        rd = "-" if self.read_barrier == NO_BARRIER else str(self.read_barrier)
        wr = "-" if self.write_barrier == NO_BARRIER else str(self.write_barrier)
        return f"[B{waits}:R{rd}:W{wr}:Y{self.yield_bit}:S{self.stall:02d}]"


@dataclass(frozen=True)
class KernelParam:
    """One kernel parameter as the cubin's EIATTR_KPARAM_INFO describes it."""

    ordinal: int
    offset: int
    size: int


@dataclass(frozen=True)
class KernelText:
    """One kernel's code: where its words live in the file, and what the cubin says about them."""

    name: str
    section_name: str
    file_offset: int
    words: tuple[int, ...]
    pinned: dict[int, str]  # byte offset in the text -> why the loader needs it in place
    params: tuple[KernelParam, ...]
    param_bytes: int
    notes: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return len(self.words) * WORD_BYTES


def split_words(text: bytes) -> tuple[int, ...]:
    if len(text) % WORD_BYTES:
        raise CubinError(f"text of {len(text)} bytes is not a whole number of 128-bit instructions")
    return tuple(int.from_bytes(text[i : i + WORD_BYTES], "little") for i in range(0, len(text), WORD_BYTES))


def join_words(words: tuple[int, ...] | list[int]) -> bytes:
    return b"".join(w.to_bytes(WORD_BYTES, "little") for w in words)


class Cubin:
    """A parsed cubin: its bytes, target architecture and kernels."""

    def __init__(self, data: bytes, source: str = "<cubin bytes>") -> None:
        self.data = bytes(data)
        self.source = source
        try:
            elf = ELFFile(io.BytesIO(self.data))
        except ELFError as exc:
            raise CubinError(
                f"{source} is not an ELF file ({exc}); pass a cubin, not PTX or a fatbin"
            ) from exc
        if elf.header.e_machine not in ("EM_CUDA", 190):
            raise CubinError(f"{source} is an ELF file for {elf.header.e_machine}, not a CUDA cubin")
        flags = elf.header.e_flags
        self.sm = (flags >> 8) & 0xFF if (flags >> 8) & 0xFF >= 50 else (flags >> 16) & 0xFF
        if self.sm < 70:
            raise CubinError(
                f"{source} targets sm_{self.sm}; only sm_70 and newer (128-bit words) are supported"
            )
        self.kernels: dict[str, KernelText] = self._read_kernels(elf)

    @classmethod
    def from_file(cls, path: str | Path) -> Cubin:
        return cls(Path(path).read_bytes(), source=str(path))

    def kernel(self, name: str) -> KernelText:
        try:
            return self.kernels[name]
        except KeyError:
            raise CubinError(
                f"{self.source} has no kernel {name!r}; its kernels are: {', '.join(sorted(self.kernels))}"
            ) from None

    def with_words(self, name: str, words: tuple[int, ...] | list[int]) -> bytes:
        """A copy of the cubin bytes with kernel `name`'s text replaced by `words` (same count)."""
        kernel = self.kernel(name)
        if len(words) != len(kernel.words):
            raise CubinError(f"kernel {name!r} has {len(kernel.words)} instructions, got {len(words)} words")
        out = bytearray(self.data)
        out[kernel.file_offset : kernel.file_offset + kernel.size] = join_words(words)
        return bytes(out)

    def _read_kernels(self, elf: ELFFile) -> dict[str, KernelText]:
        sections = list(elf.iter_sections())
        symtab = elf.get_section_by_name(".symtab")
        functions = {}
        if symtab is not None:
            for sym in symtab.iter_symbols():
                if sym["st_info"]["type"] == "STT_FUNC" and isinstance(sym["st_shndx"], int):
                    functions[sym["st_shndx"]] = sym.name
        kernels = {}
        for index, section in enumerate(sections):
            if not section.name.startswith(".text."):
                continue
            name = functions.get(index, section.name[len(".text.") :])
            data = self.data[section["sh_offset"] : section["sh_offset"] + section["sh_size"]]
            words = split_words(data)
            pinned: dict[int, str] = {}
            notes: list[str] = []
            params: tuple[KernelParam, ...] = ()
            param_bytes = 0
            info = elf.get_section_by_name(f".nv.info.{name}")
            if info is not None:
                params, param_bytes = _read_info(info.data(), len(words), pinned, notes)
            for rel_name in (
                f".rel.text.{name}",
                f".rela.text.{name}",
                f".rel{section.name}",
                f".rela{section.name}",
            ):
                rel = elf.get_section_by_name(rel_name)
                if rel is not None and rel["sh_size"]:
                    for reloc in rel.iter_relocations():
                        offset = reloc["r_offset"] - reloc["r_offset"] % WORD_BYTES
                        pinned[offset] = f"relocation in {rel_name}"
            kernels[name] = KernelText(
                name=name,
                section_name=section.name,
                file_offset=section["sh_offset"],
                words=words,
                pinned=pinned,
                params=params,
                param_bytes=param_bytes,
                notes=tuple(notes),
            )
        if not kernels:
            raise CubinError(f"{self.source} has no .text.<kernel> sections")
        return kernels


def _read_info(data: bytes, n_words: int, pinned: dict[int, str], notes: list[str]):
    """Parse a .nv.info.<kernel> section: parameters, and the instruction offsets it names."""
    params = []
    param_bytes = 0
    pos = 0
    while pos + 4 <= len(data):
        fmt, attr = data[pos], data[pos + 1]
        if fmt == _EIFMT_SVAL:
            (size,) = struct.unpack_from("<H", data, pos + 2)
            payload = data[pos + 4 : pos + 4 + size]
            pos += 4 + size
        elif fmt in (_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL):
            payload = data[pos + 2 : pos + 4]
            pos += 4
        else:
            raise CubinError(f"unknown .nv.info entry format {fmt:#x} at byte {pos}")
        if attr == _EIATTR_KPARAM_INFO and fmt == _EIFMT_SVAL and len(payload) >= 12:
            _, ordinal, offset, flags = struct.unpack_from("<IHHI", payload)
            params.append(KernelParam(ordinal=ordinal, offset=offset, size=(flags >> 18) & 0x3FFF))
        elif attr == _EIATTR_CBANK_PARAM_SIZE and fmt == _EIFMT_HVAL:
            (param_bytes,) = struct.unpack_from("<H", payload)
        elif fmt == _EIFMT_SVAL and attr in _OFFSET_LIST_ATTRS:
            for (value,) in struct.iter_unpack("<I", payload[: len(payload) // 4 * 4]):
                pinned[value - value % WORD_BYTES] = f"EIATTR_{_OFFSET_LIST_ATTRS[attr]}"
        elif fmt == _EIFMT_SVAL and attr not in _NON_OFFSET_ATTRS:
            label = (
                "EIATTR_INDIRECT_BRANCH_TARGETS"
                if attr == _EIATTR_INDIRECT_BRANCH_TARGETS
                else f"EIATTR {attr:#x}"
            )
            if attr != _EIATTR_INDIRECT_BRANCH_TARGETS:
                notes.append(
                    f".nv.info attribute {attr:#x} is unknown; its values were read as offsets to pin"
                )
            for (value,) in struct.iter_unpack("<I", payload[: len(payload) // 4 * 4]):
                if value % WORD_BYTES == 0 and value < n_words * WORD_BYTES:
                    pinned[value] = label
    params.sort(key=lambda p: p.ordinal)
    return tuple(params), param_bytes
