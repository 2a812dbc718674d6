"""Implicit-GEMM convolution tiles x splits on the GPU (issue 15; ResNet-50 l4 3x3 n32 at 0.46x): wgmma
tiles bm 64/128 x bn 64/128/256 with channel and filter-row splits, each checked against float64 and
timed beside cuDNN. Usage: python benchmarks/conv_tile_variants.py OUT.json (CP_TARGET=cuda:sm_90a
builds only, CP_LIST=1 counts)."""

import itertools
import json
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, ".")
CONVS = {
    "l4.3x3.n32": (32, 7, 7, 512, 512, 3, 3, 1, 1),
    "l4.3x3.n1": (1, 7, 7, 512, 512, 3, 3, 1, 1),
    "l2.3x3.n32": (32, 28, 28, 128, 128, 3, 3, 1, 1),
    "l3.reduce.n32": (32, 14, 14, 1024, 256, 1, 1, 1, 0),
    "odd.3x3.n24": (24, 9, 9, 384, 320, 3, 3, 1, 1),
}
TARGET = os.environ.get("CP_TARGET", "cuda")


def jobs():
    out = []
    for name, d in CONVS.items():
        N, H, W, C, K, R, S, st, pad = d
        out.append((name, "default", None))
        for bm, bn, stages in itertools.product((128, 64), (64, 128, 256), (4,)):
            if K % bn and bn > 64:
                continue
            for rows, chunks in [(False, 1), (True, 1), (False, 2), (True, 2), (False, 4)]:
                if rows and R == 1:
                    continue
                if C % (chunks * 64):
                    continue
                out.append((name, dict(bm=bm, bn=bn, bk=64, stages=stages, inflight=1), (rows, chunks)))
    return out


def build(job):
    name, params, split = job
    import polytile as pt
    from polytile import ops
    from polytile.ops.conv_choice import channel_chunk
    from polytile.ops.gpu_schedules import igemm_split_schedule, igemm_wgmma
    from polytile.ops.igemm import conv2d_igemm_split_func

    d = CONVS[name]
    try:
        if params == "default":
            return ops.conv2d_igemm(*d).build(TARGET), ""
        if split == (False, 1):
            op = ops.conv2d_igemm(*d)
            s = pt.Schedule(op.func)
            igemm_wgmma(s, "O", "col", "Wt", ["r", "s"], **params)
            return pt.build(s, TARGET), ""
        func = conv2d_igemm_split_func(*d, rows=split[0], channel_chunks=split[1],
                                       channel_chunk=channel_chunk(d[3], split[1], params["bk"]))
        return pt.build(igemm_split_schedule(func, "wgmma", params, split[0]), TARGET), ""
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"[:200]


def main():
    if not os.environ.get("CP_LIST") and (len(sys.argv) != 2 or sys.argv[1].startswith("-")):
        sys.exit("usage: python benchmarks/conv_tile_variants.py OUT.json (the JSON record of the rows)")
    js = jobs()
    if os.environ.get("CP_LIST"):
        print(len(js))
        return
    with ProcessPoolExecutor(int(os.environ.get("CP_WORKERS", "14"))) as pool:
        built = list(pool.map(build, js, chunksize=1))
    if TARGET != "cuda":
        for j, (k, e) in zip(js, built):
            print(j, "ok" if k else e)
        return
    import torch

    from polytile.runtime.timing import rel_error, time_gpu

    rows = []
    for name, d in CONVS.items():
        N, H, W, C, K, R, S, stride, pad = d
        g = torch.Generator(device="cuda").manual_seed(7)
        x = torch.rand((N, H, W, C), device="cuda", generator=g).half() - 0.5
        w = torch.rand((R, S, C, K), device="cuda", generator=g).half() - 0.5
        ref = (
            torch.nn.functional.conv2d(
                x.double().permute(0, 3, 1, 2), w.double().permute(3, 2, 0, 1), stride=stride, padding=pad
            )
            .permute(0, 2, 3, 1)
            .reshape(-1, K)
        )
        xn = x.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
        wn = w.permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)
        def cudnn(xn=xn, wn=wn, stride=stride, pad=pad):  # noqa: ANN001, ANN202
            return torch.nn.functional.conv2d(xn, wn, stride=stride, padding=pad)

        t_torch = statistics.median(time_gpu(cudnn) for _ in range(3)) * 1e6
        res = []
        for (jn, params, split), (kern, err) in zip(js, built):
            if jn != name:
                continue
            row = dict(name=name, params=params, split=split, err=err, torch_us=t_torch)
            if kern is not None:
                out = kern(x, w)
                e = rel_error(out.reshape(-1, K) if hasattr(out, "reshape") else out, ref)
                row["rel"] = float(e)
                if e > 1e-2:
                    row["err"] = f"wrong {e}"
                else:
                    row["us"] = statistics.median(kern.benchmark(x, w, repeat=20) for _ in range(3)) * 1e6
            rows.append(row)
            res.append(row)
        ok = sorted([r for r in res if "us" in r], key=lambda r: r["us"])
        dflt = next((r for r in res if r["params"] == "default"), {})
        print(f"== {name}: torch {t_torch:.1f} us, default {dflt.get('us', float('nan')):.1f} {dflt.get('err', '')}")
        for r in ok[:6]:
            print(f"   {r['us']:7.1f} {r['params']} {r['split']}")
        bad = [r for r in res if r.get("err", "").startswith("wrong")]
        failed = sum(1 for r in res if r.get("err") and not r["err"].startswith("wrong"))
        print(f"   {len(ok)} timed, {len(bad)} wrong, {failed} failed")
    json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
