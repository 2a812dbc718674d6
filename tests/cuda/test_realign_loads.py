"""Realigned loads of rows that are not 16-byte aligned, without a GPU: the pass on the loop IR
(before and after), the device helpers compiled for the host and checked at every offset, count and
tensor size (each chunk read inside the tensor's 16-byte granules), and the default GEMV's machine
code for odd row lengths (vector loads and funnel shifts instead of 2-byte loads, no local memory)."""

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from polytile import ops
from polytile.codegen.cuda import HELPERS
from polytile.dtypes import as_dtype
from polytile.lowering import loopir as ir
from polytile.lowering.passes.realign_loads import realign_loads
from polytile.target import CUDATarget

SM90A = CUDATarget(arch="sm_90a")
BF16 = as_dtype("bfloat16")


def _copies(n=8, src_scope="arg", cols=4097, col_step=1, offset=0, lanes_bound="<"):
    """Zero-filling copies L[offset + k] = (r < 4093 && 8·tx + k < cols) ? B[4097·r + 8·tx + k] : 0."""
    src = ir.Buffer("B", BF16, (ir.const(4093 * 4097),), src_scope)
    local = ir.Buffer("L", BF16, (ir.const(16),), "local")
    t, r = ir.Var("tx"), ir.Var("r")
    stmts = []
    for k in range(n):
        col = ir.BinOp("+", ir.BinOp("*", ir.const(8), t), ir.const(k * col_step))
        cond = ir.Logic("&&", (ir.Cmp("<", r, ir.const(4093)), ir.Cmp(lanes_bound, col, ir.const(cols))))
        idx = ir.BinOp("+", ir.BinOp("*", ir.const(4097), r), col)
        value = ir.Select(cond, ir.Load(src, (idx,)), ir.Const(0.0, BF16))
        stmts.append(ir.Store(local, (ir.const(offset + k),), value))
    return ir.Block(tuple(stmts))


def test_a_run_of_unaligned_copies_becomes_one_realigned_load():
    after = ir.stmt_text(realign_loads(_copies()))
    assert after == ("L[ramp(0, 1, 8)] = pt_ldg_realign16(B[ramp(((4097 * r) + ((8 * tx) + 0)), 1, 8)], 16769021, "
                     "select((r < 4093), ((-8 * tx) + 4097), 0))")
    # four 16-bit elements: an 8-byte realigned load each
    four = ir.stmt_text(realign_loads(_copies(n=4)))
    assert four.startswith("L[ramp(0, 1, 4)] = pt_ldg_realign8(")


@pytest.mark.parametrize("case", [dict(src_scope="shared"), dict(col_step=2), dict(offset=1, n=4),
                                  dict(lanes_bound="<="), dict(n=3)])
def test_what_is_not_a_realignable_run_is_left_as_it_was(case):
    before = _copies(**case)
    assert ir.stmt_text(realign_loads(before)) == ir.stmt_text(before)


def test_a_tensor_the_kernel_writes_is_not_read_in_chunks():
    # the chunks' extra bytes would be other threads' elements, being written
    copies = _copies()
    src = copies.body[0].value.a.buffer
    written = ir.Block((*copies.body, ir.Store(src, (ir.const(0),), ir.Const(1.0, BF16))))
    assert "pt_ldg_realign" not in ir.stmt_text(realign_loads(written))


HOST_HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#define __device__
#define __forceinline__ inline
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
static uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
static uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
static const unsigned char* lo_ok; static const unsigned char* hi_ok; static int outside;
template <typename T> static T checked(const T* p) {  // the device's ld.global.nc, checked against the granules
  if ((const unsigned char*)p < lo_ok || (const unsigned char*)(p + 1) > hi_ok) { ++outside; return T{}; }
  return *p;
}
static uint4 pt_ld_nc16(const uint4* p) { return checked(p); }
static uint2 pt_ld_nc8(const uint2* p) { return checked(p); }
HELPERS_HERE
template <int E, int V> static int check(int size) {
  const int bytes = (size * E + 15) / 16 * 16;  // the tensor's whole 16-byte granules
  unsigned char* mem = (unsigned char*)aligned_alloc(16, bytes);
  for (int i = 0; i < bytes; ++i) mem[i] = (unsigned char)(i * 7 + 3);
  lo_ok = mem; hi_ok = mem + bytes;
  int bad = 0;
  constexpr int P = V / E;
  for (int off = -P; off < size + P; ++off)
    for (int count = -2; count <= P + 2; ++count) {
      unsigned char out[16];
      if (V == 16) { uint4 r = pt_ldg_realign16<E, int>(mem, off, size, count); memcpy(out, &r, 16); }
      else { uint2 r = pt_ldg_realign8<E, int>(mem, off, size, count); memcpy(out, &r, 8); }
      for (int k = 0; k < P; ++k) {
        if (k < count && (off + k < 0 || off + k >= size)) continue;  // a guard keeps no lane outside the tensor
        for (int b = 0; b < E; ++b) {
          const int want = k < count ? mem[(off + k) * E + b] : 0;
          if (out[k * E + b] != want && bad++ < 5)
            printf("E=%d V=%d size=%d off=%d count=%d lane %d\n", E, V, size, off, count, k);
        }
      }
    }
  free(mem);
  return bad;
}
int main() {
  int bad = 0;
  for (int size = 1; size < 70; ++size)
    bad += check<2, 16>(size) + check<4, 16>(size) + check<2, 8>(size) + check<4, 8>(size);
  printf("wrong %d outside %d\n", bad, outside);
  return bad || outside;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler for the host")
def test_realigned_load_helpers_at_every_offset_count_and_size():
    # the generated helpers themselves (the device's vector load replaced by a checked host read):
    # every lane right, lanes from `count` on zero, and no chunk outside the tensor's 16-byte granules
    names = ("pt_funnel", "pt_keep", "pt_chunk", "pt_ldg_realign16", "pt_ldg_realign8")
    source = HOST_HARNESS.replace("HELPERS_HERE", "".join(HELPERS.definition(n) for n in names))
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "t.cpp").write_text(source)
        subprocess.run(["g++", "-std=c++17", "-O1", "-o", f"{d}/t", f"{d}/t.cpp"], check=True, capture_output=True)
        run = subprocess.run([f"{d}/t"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout
    assert run.stdout.strip() == "wrong 0 outside 0"


def _sass(kern) -> str:
    from polytile.sass.disasm import find_nvdisasm
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kern.cubin)
        f.flush()
        return subprocess.run([find_nvdisasm(), f.name], capture_output=True, text=True, check=True).stdout


@pytest.mark.needs_nvcc
@pytest.mark.parametrize("dims,dtype", [((1, 50257, 768), "float16"), ((1, 4097, 4093), "bfloat16"),
                                        ((8, 50257, 768), "float16"), ((13, 1001, 999), "float16")])
def test_gemv_reads_2_byte_aligned_rows_in_aligned_chunks(dims, dtype):
    # rows of an odd number of 16-bit columns: B was read 2 bytes at a time (8 LDG.E.U16 per 16 bytes;
    # 1×4097×4093 at 0.14× torch); now as aligned 16- or 8-byte chunks shifted into place
    kern = ops.matmul(*dims, dtype).build(SM90A)
    assert "B_aligned" not in kern.source
    bodies = {k.name: kern.source.split(f" {k.name}(")[1].split("__global__")[0] for k in kern.kernels}
    (gemv,) = [n for n, body in bodies.items() if "B_local" in body]
    assert "pt_ldg_realign" in bodies[gemv]
    sass = _sass(kern).split(f".text.{gemv}:")[1].split(".section")[0]
    assert not re.search(r"\bLDL\b|\bSTL\b", sass)  # the register tile stays in registers
    assert re.search(r"\bLDG\.E\.(128|64)", sass) and re.search(r"\bSHF\.R\.U64\b|\bSHF\.R\.W\b", sass)
    if dims[0] == 1:  # A arrives by asynchronous copies: every 2-byte global load was one of B's
        assert not re.search(r"\bLDG\.E\.U16\b", sass)


@pytest.mark.needs_nvcc
@pytest.mark.parametrize("dims,dtype", [((128, 50257, 768), "float16"), ((4095, 4097, 1023), "float16")])
def test_aligned_copies_of_operands_move_16_bytes_per_thread(dims, dtype):
    # the copy of B's 2-byte aligned rows into rows of whole 16-byte chunks (tensor-core operands):
    # one element per thread before (GPT-2's vocabulary at 128 tokens: the copy of its 77 MB weight
    # in one LDG.E.U16 and one STG.E.U16 per element); now a realigned load and one 16-byte store
    kern = ops.matmul(*dims, dtype).build(SM90A)
    copies = [k for k in kern.kernels if "_aligned" in kern.source.split(f" {k.name}(")[1].split(")")[0]
              and "__shared__" not in kern.source.split(f" {k.name}(")[1].split("__global__")[0]]
    assert copies
    for k in copies:
        body = kern.source.split(f" {k.name}(")[1].split("__global__")[0]
        assert re.search(r"\*\(uint4\*\)&\w+_aligned\[.*\] = pt_ldg_realign16<2, int>", body), body
        sass = _sass(kern).split(f".text.{k.name}:")[1].split(".section")[0]
        assert re.search(r"\bSTG\.E\.128\b", sass) and not re.search(r"\b(LDG|STG)\.E\.U16\b", sass)


def test_gemv_of_unaligned_rows_is_split_into_enough_steps():
    # measured on an H100 (gemv_variants, b2-results/align-gemv.json): the direct GEMV's time follows
    # its K steps per warp until DRAM-bound: 1×50257×768 took 93 µs split in 3 (the default then),
    # 44-45 µs split in 8 or more (torch 45); 1×4097×4096 split in 16 took 67 µs in steps of 16 rows,
    # 77 in steps of 8; the staged kernel on an aligned copy of B was slower in both (162, 95 µs)
    from polytile.ops.gpu_schedules import gemm_choice
    vocab = gemm_choice(SM90A, 1, 50257, 768, as_dtype("float16"))
    assert vocab.kernel == "gemv" and vocab.params.get("direct") and vocab.split >= 8, vocab
    for K in (4096, 4093):  # a prime K: chunks of unequal length
        odd = gemm_choice(SM90A, 1, 4097, K, as_dtype("bfloat16"))
        # (16 chunks then; 64 since GEMV_MAX_SPLIT: 1×4097×4093 77 µs in 16, 30 µs in 64)
        assert odd.params.get("direct") and odd.params["bk"] == 16 and odd.split >= 16, odd
