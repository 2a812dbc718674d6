"""The registry of GPU intrinsics: the hardware instructions the compiler maps loop nests and copies onto.

Each intrinsic is registered once, with what it computes (shape, data types), the target feature it
needs, and the device functions the generated code calls for it (``Instruction``: how the code
generator passes their arguments, whether a whole warp executes them, how they read shared memory).
``schedule.tensorize`` looks a tensor intrinsic up by name and tags the nest's loop with that name;
the lowering finds tensorized nests by that tag (``tensor_intrinsic``), the target check refuses an
intrinsic the target lacks, and the later passes and the CUDA code generator look a call up by its
exact name (``instruction``) — nothing recognizes an intrinsic by the spelling of a name.

Registered: ``mma_m16n8k16`` (mma.sync, sm_80+), ``wgmma_m64nNk16`` (Hopper's warpgroup MMA, sm_90a),
``ldmatrix`` (the operand loads of mma.sync), ``cp.async`` (asynchronous global-to-shared copies),
``realigned_load`` (16- or 8-byte register loads at addresses aligned only to their elements) and
``tma`` (bulk tensor copies and the mbarriers they complete on, sm_90), ``setmaxnreg`` (warpgroups
trading registers, sm_90a) and ``packed_stores`` (16-bit results exchanged within a quad of lanes and
stored as whole sectors).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .errors import PolytileError

WGMMA_N = tuple(range(8, 257, 8))  # wgmma.m64nNk16: N = 8, 16, ..., 256


@dataclass(frozen=True)
class Instruction:
    """A device function that generated code calls: its name in the loop IR and in the source."""

    name: str
    intrinsic: str  # the registered intrinsic it belongs to
    addresses: bool = False  # buffer-element arguments are passed as addresses (&buf[i]), not values
    constant_arg: bool = False  # its one argument is a compile-time constant (a template parameter)
    warp: bool = False  # all 32 lanes of a warp execute it together (the lane is threadIdx.x)
    async_proxy: bool = False  # reads shared memory through the async proxy (fence.proxy.async first)
    descriptors: bool = False  # reads its shared operands through descriptors of unswizzled addresses
    hardware_swizzle: bool = False  # takes unswizzled shared addresses: the hardware applies the buffer's swizzle
    loads_fragment: bool = False  # fills registers (its first argument) from shared memory
    stores: bool = False  # writes its first argument (a buffer element, passed by address)
    shape: tuple[int, int, int] | None = None  # (m, n, k) of a matrix product
    dtype: str | None = None  # operand type of a matrix product


@dataclass(frozen=True)
class Intrinsic:
    """An intrinsic: a hardware instruction (family) with the feature it needs and its device functions."""

    name: str
    ptx: str
    features: tuple[str, ...]  # target features it needs (``Target.has``)
    description: str
    instructions: tuple[Instruction, ...] = ()

    def instruction(self, name: str) -> Instruction:
        for ins in self.instructions:
            if ins.name == name:
                return ins
        raise PolytileError(f"intrinsic {self.name} has no device function {name!r}")


@dataclass(frozen=True)
class TensorIntrinsic(Intrinsic):
    """A matrix-multiply-accumulate instruction that ``tensorize`` maps an (m, n, k) loop nest onto.

    ``nest``: the extents of the nest ``tensorize`` takes (one warp's share). ``warpgroup``: four
    warps issue it together (64 rows; N is the loop around the nest over the warp's 8-column tiles,
    the shared operands read through descriptors in layouts ``tensorize`` sets). Otherwise each warp
    loads its operands into registers (``fragments``, the register level of the pipeline) and issues
    the instruction on them."""

    shape: tuple[int, int | None, int] = (16, 8, 16)  # (m, n, k) of one instruction; None: chosen per use
    nest: tuple[int, int, int] = (16, 8, 16)
    operand_dtypes: tuple[str, ...] = ("float16", "bfloat16")
    accumulator: str = "float32"
    warpgroup: bool = False
    asynchronous: bool = False  # issued in groups that complete later (pipeline(..., inflight=n))
    fragment_loads: Intrinsic | None = None  # how operand fragments are loaded (ldmatrix)
    products: Mapping[tuple[str, int], str] = field(default_factory=dict)  # (dtype, n) -> instruction

    def product(self, dtype: str, n: int | None = None) -> Instruction:
        """The instruction computing one product with ``dtype`` operands (``n`` columns, wgmma)."""
        key = (dtype, n if self.shape[1] is None else self.shape[1])
        if key not in self.products:
            raise PolytileError(f"{self.name} has no instruction for {dtype} operands"
                                + (f" and N = {n}" if self.shape[1] is None else ""))
        return self.instruction(self.products[key])


_SUFFIX = {"float16": "f16", "bfloat16": "bf16"}

LDMATRIX = Intrinsic(
    "ldmatrix", "ldmatrix.sync.aligned.m8n8.x2 / .x4 / .x2.trans / .x4.trans .shared.b16", ("ldmatrix",),
    "a warp loads 16-bit 8x8 matrices from shared memory into the register fragments mma.sync takes",
    tuple(Instruction(n, "ldmatrix", addresses=True, warp=True, loads_fragment=True)
          for n in ("pt_ldmatrix_a", "pt_ldmatrix_a_trans", "pt_ldmatrix_b", "pt_ldmatrix_b_x4", "pt_ldmatrix_b_trans",
                    "pt_ldmatrix_b_trans_x4")))

CP_ASYNC = Intrinsic(
    "cp.async", "cp.async.ca/cg.shared.global (4, 8, 16 bytes), commit_group, wait_group", ("cp.async",),
    "asynchronous copies from global to shared memory (zero-filling past a tensor's end), issued in "
    "commit groups and waited for by count", (
        Instruction("pt_cp_async", "cp.async", addresses=True),
        Instruction("pt_cp_async_zfill", "cp.async", addresses=True),
        Instruction("pt_cp_async_commit", "cp.async"),
        Instruction("pt_cp_async_wait", "cp.async", constant_arg=True)))

REALIGNED_LOAD = Intrinsic(
    "realigned_load", "ld.global.v4.u32 / .v2.u32 (two aligned chunks), shf.r (funnel shifts)", ("gpu",),
    "a thread reads 16 or 8 bytes of a tensor at an address aligned only to its elements as the aligned "
    "chunks holding them, realigned in registers by the address's offset in its chunk (known at run time); "
    "lanes past a count are zeros (lowering/passes/realign_loads.py)", (
        Instruction("pt_ldg_realign16", "realigned_load"),
        Instruction("pt_ldg_realign8", "realigned_load")))

TMA = Intrinsic(
    "tma", "cp.async.bulk.tensor.{2,3}d.shared::cluster.global.mbarrier::complete_tx::bytes; mbarrier.init, "
    "arrive(.expect_tx), try_wait.parity", ("tma",),
    "the tensor memory accelerator copies a box of a tensor (2-D, or 3-D with one index of the outer dimension: "
    "a batch; described by a tensor map made on the host) "
    "into shared memory, 128-byte swizzled, zeros past the tensor's end, and completes on an mbarrier that "
    "counts the bytes; mbarriers also count the warps' arrivals; the reverse copy (a TMA store, "
    "cp.async.bulk.tensor.global.shared::cta.bulk_group) writes a box of shared memory to the tensor, clipped at "
    "its end, in bulk groups committed and waited for until read", (
        Instruction("pt_tma_load_2d", "tma", addresses=True, async_proxy=True, hardware_swizzle=True),
        Instruction("pt_tma_load_3d", "tma", addresses=True, async_proxy=True, hardware_swizzle=True),
        Instruction("pt_mbar_init", "tma", addresses=True),
        Instruction("pt_fence_mbar_init", "tma"),
        Instruction("pt_mbar_expect_tx", "tma", addresses=True),
        Instruction("pt_mbar_arrive", "tma", addresses=True),
        Instruction("pt_mbar_wait", "tma", addresses=True),
        Instruction("pt_tma_store_2d", "tma", addresses=True, async_proxy=True, stores=True),
        Instruction("pt_tma_store_3d", "tma", addresses=True, async_proxy=True, stores=True),
        Instruction("pt_bulk_commit", "tma"),
        Instruction("pt_bulk_wait_read", "tma")))

SETMAXNREG = Intrinsic(
    "setmaxnreg", "setmaxnreg.inc/dec.sync.aligned.u32", ("setmaxnreg",),
    "a warpgroup sets its registers per thread (warp specialization: the producer gives registers up, the "
    "consumers take them); the kernel needs a register cap at entry (__launch_bounds__(threads, 1))", (
        Instruction("pt_setmaxnreg_inc", "setmaxnreg", constant_arg=True),
        Instruction("pt_setmaxnreg_dec", "setmaxnreg", constant_arg=True)))

PACKED_STORES = Intrinsic(
    "packed_stores", "cvt.rn.{f16x2,bf16x2}.f32, shfl.sync.bfly.b32, st.global.{v4,v2,}.b32 / .b16", ("gpu",),
    "16-bit results packed in pairs into 32-bit words, exchanged between the lanes of a quad (butterfly "
    "shuffles) and stored 16, 8, 4 or 2 bytes at once (lowering/passes/exchange_stores.py)", (
        Instruction("pt_pack_f16x2", "packed_stores"),
        Instruction("pt_pack_bf16x2", "packed_stores"),
        Instruction("pt_shfl_xor", "packed_stores", warp=True),
        Instruction("pt_store_packed", "packed_stores", addresses=True, stores=True),
        Instruction("pt_store_packed_half", "packed_stores", addresses=True, stores=True)))

MMA_M16N8K16 = TensorIntrinsic(
    "mma_m16n8k16", "mma.sync.aligned.m16n8k16.row.col.f32", ("mma.sync", "ldmatrix"),
    "a warp multiplies a 16x16 by a 16x8 tile of fp16/bf16 from registers (loaded with ldmatrix), "
    "accumulating in float32",
    tuple(Instruction(f"pt_mma_m16n8k16_{s}", "mma_m16n8k16", addresses=True, warp=True, shape=(16, 8, 16),
                      dtype=d) for d, s in _SUFFIX.items()),
    fragment_loads=LDMATRIX,
    products={(d, 8): f"pt_mma_m16n8k16_{s}" for d, s in _SUFFIX.items()})

WGMMA_M64NNK16 = TensorIntrinsic(
    "wgmma_m64nNk16", "wgmma.mma_async.sync.aligned.m64nNk16.f32", ("wgmma",),
    "four warps (a warpgroup) multiply a 64x16 by a 16xN tile of fp16/bf16 read from shared memory "
    "through matrix descriptors, accumulating in float32; asynchronous, in commit groups",
    (*(Instruction(f"pt_wgmma_m64n{n}k16_{s}", "wgmma_m64nNk16", addresses=True, warp=True, async_proxy=True,
                   descriptors=True, hardware_swizzle=True, shape=(64, n, 16), dtype=d)
       for d, s in _SUFFIX.items() for n in WGMMA_N),
     Instruction("pt_wgmma_fence", "wgmma_m64nNk16"), Instruction("pt_wgmma_commit", "wgmma_m64nNk16"),
     Instruction("pt_wgmma_wait", "wgmma_m64nNk16", constant_arg=True),
     Instruction("pt_fence_proxy_async", "wgmma_m64nNk16")),
    shape=(64, None, 16), warpgroup=True, asynchronous=True,
    products={(d, n): f"pt_wgmma_m64n{n}k16_{s}" for d, s in _SUFFIX.items() for n in WGMMA_N})

INTRINSICS: Mapping[str, Intrinsic] = MappingProxyType(
    {i.name: i for i in (MMA_M16N8K16, WGMMA_M64NNK16, LDMATRIX, CP_ASYNC, REALIGNED_LOAD, TMA, SETMAXNREG,
                         PACKED_STORES)})
"""Every registered intrinsic, by name."""

_INSTRUCTIONS: Mapping[str, Instruction] = MappingProxyType(
    {ins.name: ins for i in INTRINSICS.values() for ins in i.instructions})


def intrinsic(name: str) -> Intrinsic:
    """The intrinsic registered as ``name``."""
    if name not in INTRINSICS:
        raise PolytileError(f"unknown intrinsic {name!r}; registered: {', '.join(INTRINSICS)}")
    return INTRINSICS[name]


def tensor_intrinsics() -> list[TensorIntrinsic]:
    """The registered tensor intrinsics (what ``tensorize`` takes)."""
    return [i for i in INTRINSICS.values() if isinstance(i, TensorIntrinsic)]


def tensor_intrinsic(loop_kind: str) -> TensorIntrinsic | None:
    """The tensor intrinsic a loop tagged ``loop_kind`` is tensorized with (None: not tensorized)."""
    found = INTRINSICS.get(loop_kind)
    return found if isinstance(found, TensorIntrinsic) else None


def instruction(name: str) -> Instruction | None:
    """The registered device function called ``name`` (None: not an intrinsic's)."""
    return _INSTRUCTIONS.get(name)
