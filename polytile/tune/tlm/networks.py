"""The layer shapes of real networks, as workloads of the operator library.

Transformers give their projections (``matmul``, M = tokens), the first feed-forward layer with its
activation (``dense``), attention scores and values (``batch_matmul``, one batch per head), the
attention softmax and the layer norm; convolutional networks give their convolutions (``conv2d``
NCHW on the CPU and in float32 on the GPU, ``conv2d_igemm`` NHWC in float16 for tensor cores) and
their classifier (``dense``). Each network's distinct layers, at inference sizes (batch 1, the
stated sequence length).

``TRAIN`` networks build the pretraining corpus of the models polytile ships; ``HELD_OUT`` networks
are kept out of it, for evaluation (``benchmarks/tlm.py``): their workloads are never seen in
pretraining or fine-tuning (checked by workload, since networks share some shapes).
"""

from __future__ import annotations

from collections.abc import Iterable

Layer = tuple[str, dict[str, object]]  # operator name, its arguments (sizes; dtype added per target)


def transformer(tokens: int, width: int, ffn: int, heads: int, qkv_fused: bool = True,
                gated: bool = False) -> list[Layer]:
    """One encoder/decoder block at ``tokens`` tokens (its distinct layers)."""
    head = width // heads
    qkv = [("matmul", dict(M=tokens, N=3 * width, K=width))] if qkv_fused else []
    up = [("matmul", dict(M=tokens, N=ffn, K=width))] if gated else [("dense", dict(M=tokens, N=ffn, K=width))]
    return [*qkv, ("matmul", dict(M=tokens, N=width, K=width)), *up, ("matmul", dict(M=tokens, N=width, K=ffn)),
            ("batch_matmul", dict(batch=heads, M=tokens, N=tokens, K=head)),
            ("batch_matmul", dict(batch=heads, M=tokens, N=head, K=tokens)),
            ("softmax", dict(M=heads * tokens, N=tokens)), ("layernorm", dict(M=tokens, N=width))]


def conv(C: int, K: int, size: int, R: int = 3, stride: int = 1) -> Layer:
    """A square convolution of a C-channel size×size input to K channels, 'same' padding."""
    return ("conv2d", dict(N=1, C=C, H=size, W=size, K=K, R=R, S=R, stride=stride, padding=R // 2))


def _resnet50() -> list[Layer]:
    """The bottleneck blocks of each stage: the first block (strided 3×3 from stage 3 on) and the rest."""
    layers = [conv(3, 64, 224, 7, 2), ("dense", dict(M=1, N=1000, K=2048, activation="none"))]
    for size, width, cin in ((56, 64, 64), (28, 128, 256), (14, 256, 512), (7, 512, 1024)):
        stride = 1 if size == 56 else 2
        layers += [conv(cin, width, size * stride, 1), conv(width, width, size * stride, 3, stride),
                   conv(width, 4 * width, size, 1), conv(4 * width, width, size, 1), conv(width, width, size, 3)]
    return layers


def _mobilenet_v2() -> list[Layer]:
    """Its pointwise (1×1) convolutions and stem; depthwise convolutions have no library operator."""
    layers = [conv(3, 32, 224, 3, 2), ("dense", dict(M=1, N=1000, K=1280, activation="none"))]
    blocks = ((32, 16, 112, 1), (16, 24, 112, 6), (24, 32, 56, 6), (32, 64, 28, 6), (64, 96, 14, 6),
              (96, 160, 14, 6), (160, 320, 7, 6))
    for cin, cout, size, expand in blocks:
        hidden = cin * expand
        if expand > 1:
            layers.append(conv(cin, hidden, size, 1))
        out_size = size // 2 if cout in (24, 32, 64, 160) else size
        layers.append(conv(hidden, cout, out_size, 1))
    layers.append(conv(320, 1280, 7, 1))
    return layers


def _densenet121() -> list[Layer]:
    layers = [conv(3, 64, 224, 7, 2), ("dense", dict(M=1, N=1000, K=1024, activation="none"))]
    for size, first in ((56, 64), (28, 128), (14, 256), (7, 512)):
        layers += [conv(first, 128, size, 1), conv(first + 96, 128, size, 1), conv(128, 32, size, 3)]
    return layers


def _squeezenet() -> list[Layer]:
    layers = [conv(3, 64, 224, 3, 2)]
    for size, cin, squeeze, expand in ((55, 64, 16, 64), (27, 128, 32, 128), (13, 256, 48, 192),
                                       (13, 384, 64, 256)):
        layers += [conv(cin, squeeze, size, 1), conv(squeeze, expand, size, 1), conv(squeeze, expand, size, 3)]
    layers.append(conv(512, 1000, 13, 1))
    return layers


NETWORKS: dict[str, list[Layer]] = {
    "bert-base": transformer(128, 768, 3072, 12),
    "bert-base-512": transformer(512, 768, 3072, 12),
    "gpt2": transformer(256, 768, 3072, 12),
    "llama-7b": transformer(32, 4096, 11008, 32, qkv_fused=False, gated=True),
    "resnet-50": _resnet50(),
    "mobilenet-v2": _mobilenet_v2(),
    "vit-b16": transformer(197, 768, 3072, 12),
    "whisper-tiny": transformer(1500, 384, 1536, 6),
    "densenet-121": _densenet121(),
    "squeezenet-1.1": _squeezenet(),
}
TRAIN = ("bert-base", "bert-base-512", "gpt2", "llama-7b", "resnet-50", "mobilenet-v2")
HELD_OUT = ("vit-b16", "whisper-tiny", "densenet-121", "squeezenet-1.1")


def layers(names: Iterable[str]) -> list[tuple[str, str, dict[str, object]]]:
    """(network, operator, arguments) of every distinct layer of the named networks (a layer shared by
    two networks is listed once, under the first)."""
    out, seen = [], set()
    for name in names:
        if name not in NETWORKS:
            from ..space import TuneError
            raise TuneError(f"unknown network {name!r}; known: {', '.join(NETWORKS)}")
        for op, args in NETWORKS[name]:
            key = (op, tuple(sorted(args.items())))
            if key not in seen:
                seen.add(key)
                out.append((name, op, args))
    return out
