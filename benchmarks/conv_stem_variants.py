"""3-channel convolution stems on the GPU (issue 15): the default (``igemm_cuda``, CUDA cores) beside an
experiment, the taps and channels flattened into one padded reduction of R·S·C (rounded up to the K
tile) so that Hopper's warpgroup MMA computes it (``gemm_wgmma`` on ``col[m, t]`` × ``Wf[t, k]``, both
gathered in the shared tiles' copies), and torch (cuDNN), in the same process.

Each variant is checked against a float64 torch reference on fresh random inputs and timed with CUDA
events after an L2 flush. Not a default yet: the experiment's copies gather element by element
(synchronously), and ptxas spills 100–300 bytes at 255 registers.

    python benchmarks/conv_stem_variants.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import polytile as pt  # noqa: E402
from polytile import lang, ops  # noqa: E402
from polytile.lang.expr import select  # noqa: E402
from polytile.lang.func import Func  # noqa: E402
from polytile.lang.tensor import compute, placeholder, reduce_axis  # noqa: E402
from polytile.ops.conv import conv_out  # noqa: E402
from polytile.ops.gpu_schedules import gemm_wgmma  # noqa: E402
from polytile.ops.matmul import product  # noqa: E402

STEMS = [("resnet50.conv1.n32", (32, 224, 224, 3, 64, 7, 7, 2, 3)),
         ("resnet50.conv1.n1", (1, 224, 224, 3, 64, 7, 7, 2, 3)),
         ("mobilenetv2.stem.n32", (32, 224, 224, 3, 32, 3, 3, 2, 1)),
         ("off.5x5s1.n8", (8, 96, 96, 3, 32, 5, 5, 1, 2))]
VARIANTS = [dict(bm=128, bn=64, bk=64, stages=3, inflight=1), dict(bm=64, bn=64, bk=64, stages=3, inflight=1)]


def flat_func(N: int, H: int, W: int, C: int, K: int, R: int, S: int, stride: int, padding: int,
              dtype: str = "float16", tile: int = 64) -> Func:
    """conv2d_igemm's function with the taps and channels one reduction of R·S·C rounded up to ``tile``."""
    P, Q = conv_out(H, R, stride, padding, 1), conv_out(W, S, stride, padding, 1)
    T = R * S * C
    I = placeholder((N, H, W, C), dtype, "I")
    Wt = placeholder((R, S, C, K), dtype, "Wt")

    def gather(m, t):  # noqa: ANN001, ANN202
        n, p, q = m // (P * Q), (m // Q) % P, m % Q
        r, s, c = t // (S * C), (t // C) % S, t % C
        h, w = p * stride + r - padding, q * stride + s - padding
        return select((t < T) & (h >= 0) & (h < H) & (w >= 0) & (w < W), I[n, h, w, c], 0)

    Tp = -(-T // tile) * tile
    col = compute((N * P * Q, Tp), gather, "col")
    Wf = compute((Tp, K), lambda t, k: select(t < T, Wt[t // (S * C), (t // C) % S, t % C, k], 0), "Wf")
    kk = reduce_axis(Tp, "k")
    O = compute((N * P * Q, K), lambda i, j: lang.tensor.sum(product(col[i, kk], Wf[kk, j], dtype), axis=kk), "O")
    return Func([I, Wt], [O], name="conv2d_igemm")


def wgmma_variant(dims: tuple[int, ...], cfg: dict[str, int]):  # noqa: ANN201
    s = pt.Schedule(flat_func(*dims, tile=cfg["bk"]))
    gemm_wgmma(s, "O", "col", "Wf", **cfg)
    s["col"].compute_inline()
    s["Wf"].compute_inline()
    return pt.build(s, "cuda")


def main() -> int:
    import torch

    from polytile.runtime.timing import rel_error, time_gpu
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    for name, dims in STEMS:
        N, H, W, C, K, R, S, stride, pad = dims
        op = ops.conv2d_igemm(*dims)
        g = torch.Generator(device="cuda").manual_seed(len(rows) + 1)
        x = torch.rand((N, H, W, C), device="cuda", generator=g).half() - 0.5
        w = torch.rand((R, S, C, K), device="cuda", generator=g).half() - 0.5
        ref = torch.nn.functional.conv2d(x.double().permute(0, 3, 1, 2), w.double().permute(3, 2, 0, 1),
                                         stride=stride, padding=pad).permute(0, 2, 3, 1).reshape(-1, K)
        xn, wn = x.permute(0, 3, 1, 2).contiguous(), w.permute(3, 2, 0, 1).contiguous()
        def cudnn(xn=xn, wn=wn, stride=stride, pad=pad):  # noqa: ANN001, ANN202
            return torch.nn.functional.conv2d(xn, wn, stride=stride, padding=pad)
        t_torch = statistics.median(time_gpu(cudnn) for _ in range(3))
        kerns = [("default", op.build("cuda"))] + [(f"wgmma {c['bm']}x{c['bn']}x{c['bk']} s{c['stages']}",
                                                    wgmma_variant(dims, c)) for c in VARIANTS]
        for label, kern in kerns:
            out = kern(x, w)
            err = rel_error(out, ref)
            t = statistics.median(kern.benchmark(x, w, repeat=20) for _ in range(3))
            rows.append((name, label, t, t_torch, err, err <= op.tolerance))
            print(f"{name:22s} {label:22s} {t * 1e6:9.1f} us  torch {t_torch * 1e6:8.1f} us  "
                  f"ratio {t_torch / t:5.2f}  rel_err {err:.1e} {'ok' if err <= op.tolerance else 'WRONG'}",
                  flush=True)
    return 0 if all(r[-1] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
