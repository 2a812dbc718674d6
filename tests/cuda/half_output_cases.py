"""The cases of the float16 / bfloat16 output tests (``test_out_dtype_gpu.py`` runs them on a GPU,
``test_out_dtype_codegen.py`` compiles them with nvcc): one per template, sizes that cut the block
tiles, the K tiles and (odd K, N) the 16-byte rows. ``build(op, target)`` takes the target of the
Hopper-or-default kernels ("cuda" on a GPU, sm_90a without one); the mma.sync cases build for sm_90
(tensor cores without warpgroup MMA)."""

import polytile as pt
from polytile import ops
from polytile.ops.gpu_schedules import gemm_cuda, gemm_tensorcore, gemm_wgmma, gemv_cuda
from polytile.target import CUDATarget

SM90 = CUDATarget(arch="sm_90")


def _scheduled(template, **cfg):
    def build(op, target):
        s = pt.Schedule(op.func)
        template(s, "C", "A", "B", **cfg)
        return pt.build(s, target)
    return build


def _default(op, target):
    return op.build(target)


def _mma(op, target):
    return op.build(SM90)


CASES = [
    # (id, operator of a dtype, build)
    ("mma", lambda d: ops.matmul(300, 264, 200, d, out_dtype=d), _mma),
    ("mma-odd-k-n", lambda d: ops.matmul(345, 567, 789, d, out_dtype=d), _mma),
    ("mma-template", lambda d: ops.matmul(200, 136, 328, d, out_dtype=d),
     _scheduled(gemm_tensorcore, bm=64, bn=64, wm=32, wn=32, stages=3)),
    ("wgmma", lambda d: ops.matmul(300, 264, 200, d, out_dtype=d),
     _scheduled(gemm_wgmma, bm=128, bn=128, bk=64, stages=3)),
    ("default-odd-k-n", lambda d: ops.matmul(4095, 4097, 1023, d, out_dtype=d), _default),
    ("cuda-cores", lambda d: ops.matmul(300, 264, 200, d, out_dtype=d), _scheduled(gemm_cuda)),
    ("gemv", lambda d: ops.matmul(3, 1000, 512, d, out_dtype=d), _scheduled(gemv_cuda)),
    ("gemv-default-odd", lambda d: ops.matmul(1, 4097, 4093, d, out_dtype=d), _default),
    ("split-k-gemv", lambda d: ops.matmul(8, 768, 3072, d, out_dtype=d), _default),  # decoding: split by default
    ("split-k-wgmma", lambda d: ops.matmul(127, 255, 4096, d, out_dtype=d), _default),
    ("split-k-mma", lambda d: ops.matmul(96, 136, 4096, d, split_k=2, out_dtype=d), _mma),
    ("batch-default", lambda d: ops.batch_matmul(5, 200, 136, 72, d, out_dtype=d), _default),
    ("batch-mma", lambda d: ops.batch_matmul(5, 200, 136, 72, d, out_dtype=d), _mma),
    ("batch-decode", lambda d: ops.batch_matmul(12, 1, 300, 64, d, out_dtype=d), _default),
    ("igemm-3x3", lambda d: ops.conv2d_igemm(2, 13, 11, 64, 72, 3, 3, 1, 1, d, out_dtype=d), _default),
    ("igemm-3x3-mma", lambda d: ops.conv2d_igemm(4, 29, 27, 64, 72, 3, 3, 1, 1, d, out_dtype=d), _mma),  # unsplit
    ("igemm-split", lambda d: ops.conv2d_igemm(2, 13, 11, 64, 72, 3, 3, 1, 1, d, out_dtype=d), _mma),  # split-K
    ("igemm-1x1", lambda d: ops.conv2d_igemm(3, 14, 14, 96, 136, 1, 1, 1, 0, d, out_dtype=d), _default),
    ("igemm-c3", lambda d: ops.conv2d_igemm(2, 23, 23, 3, 24, 7, 7, 2, 3, d, out_dtype=d), _default),
    ("igemm-3d", lambda d: ops.conv3d_igemm(1, 5, 9, 7, 32, 40, 3, 3, 3, 1, 1, d, out_dtype=d), _default),
    ("conv2d-nchw", lambda d: ops.conv2d(2, 5, 9, 7, 11, 3, 3, 1, 1, dtype=d, out_dtype=d), _default),
    # the quads' exchanged stores (lowering/passes/exchange_stores.py): 16 or 17 rows (fewer take the
    # GEMV kernel), partial column chunks, rows aligned to 16 bytes (16-byte stores) or to 8 only
    # (N = 100: 8-byte stores)
    ("mma-m16", lambda d: ops.matmul(16, 40, 24, d, out_dtype=d),
     _scheduled(gemm_tensorcore, bm=64, bn=64, wm=32, wn=32, stages=2)),
    ("mma-m17-n100", lambda d: ops.matmul(17, 100, 40, d, out_dtype=d),
     _scheduled(gemm_tensorcore, bm=64, bn=64, wm=32, wn=32, stages=2)),
    ("wgmma-m17", lambda d: ops.matmul(17, 264, 72, d, out_dtype=d),
     _scheduled(gemm_wgmma, bm=64, bn=128, bk=64, stages=2)),
    ("wgmma-m17-n100", lambda d: ops.matmul(17, 100, 72, d, out_dtype=d),
     _scheduled(gemm_wgmma, bm=64, bn=128, bk=64, stages=2)),
    ("batch-default-m17", lambda d: ops.batch_matmul(3, 17, 200, 64, d, out_dtype=d), _default),
    ("igemm-1x1-k100", lambda d: ops.conv2d_igemm(1, 5, 7, 32, 100, 1, 1, 1, 0, d, out_dtype=d), _default),
]
