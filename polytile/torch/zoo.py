"""Models to compile and tune, built from their libraries' configurations with random weights
(nothing is downloaded): BERT-base, GPT-2 small (prefill, and one decoding step with a KV cache), a
LLaMA-style decoder stack (RMSnorm, SiLU-gated MLP, rotary attention) and ResNet-50 (torchvision's
where it imports, else the same network defined here).

``model(name, batch=..., size="full"|"tiny", device=..., dtype=...)`` returns the model (in eval
mode) and its example inputs. ``size="tiny"`` keeps each architecture at a few small layers (for
tests); "full" is the published size. The transformers come from the ``transformers`` package.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from ..errors import PolytileError


def _seeded(seed: int) -> None:
    torch.manual_seed(seed)


def bert(batch: int = 1, seq: int = 128, size: str = "full") -> tuple[torch.nn.Module, list[Any]]:
    """BERT-base (12 layers, hidden 768, 12 heads) on ``seq`` tokens; tiny: 2 layers, hidden 64."""
    import transformers
    dims = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072) \
        if size == "full" else dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                    vocab_size=500, max_position_embeddings=128)
    cfg = transformers.BertConfig(**dims)
    m = transformers.BertModel(cfg, add_pooling_layer=False)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    return _Hidden(m), [ids]


class _Hidden(torch.nn.Module):
    """A transformers model returning its last hidden state (one tensor)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).last_hidden_state


def _gpt2_config(size: str) -> Any:
    import transformers
    if size == "full":
        return transformers.GPT2Config()
    return transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=500, n_positions=128)


def gpt2_prefill(batch: int = 1, seq: int = 512, size: str = "full") -> tuple[torch.nn.Module, list[Any]]:
    """GPT-2 small (12 layers, hidden 768) on a ``seq``-token prompt."""
    import transformers
    cfg = _gpt2_config(size)
    seq = min(seq, cfg.n_positions)
    m = transformers.GPT2Model(cfg)
    return _Hidden(m), [torch.randint(0, cfg.vocab_size, (batch, seq))]


class _Decode(torch.nn.Module):
    """One decoding step of a transformers model over a KV cache of fixed length: the cache's keys and
    values are inputs (a new DynamicCache is filled with them each call, so shapes stay static)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        # the KV cache's argument as the installed transformers names it: "cache" in 5.24 (which warns on
        # "past_key_values", to be removed in 5.40), "past_key_values" before the rename (the GPU machines
        # have 5.17)
        params = inspect.signature(model.forward).parameters
        self.cache_keyword = "cache" if "cache" in params else "past_key_values"

    def forward(self, input_ids: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
        from transformers import DynamicCache
        cache = DynamicCache(config=self.model.config)
        for layer, (k, v) in enumerate(zip(keys, values)):
            cache.update(k, v, layer)
        return self.model(input_ids=input_ids, use_cache=True, **{self.cache_keyword: cache}).last_hidden_state


def gpt2_decode(batch: int = 1, seq: int = 512, size: str = "full") -> tuple[torch.nn.Module, list[Any]]:
    """GPT-2 small decoding one token after a ``seq``-token KV cache."""
    import transformers
    cfg = _gpt2_config(size)
    seq = min(seq, cfg.n_positions - 1)
    m = transformers.GPT2Model(cfg)
    heads, dim = cfg.n_head, cfg.n_embd // cfg.n_head
    keys = [torch.randn(batch, heads, seq, dim) for _ in range(cfg.n_layer)]
    values = [torch.randn(batch, heads, seq, dim) for _ in range(cfg.n_layer)]
    return _Decode(m), [torch.randint(0, cfg.vocab_size, (batch, 1)), keys, values]


def llama(batch: int = 1, seq: int = 128, size: str = "full", layers: int = 2) -> tuple[torch.nn.Module, list[Any]]:
    """A LLaMA-style decoder stack at LLaMA-3-8B widths (hidden 4096, 32 heads, 8 KV heads, MLP 14336)
    with ``layers`` layers, on ``seq`` tokens; tiny: hidden 64, MLP 160."""
    import transformers
    dims = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                vocab_size=32000) if size == "full" else dict(
        hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2, vocab_size=500)
    cfg = transformers.LlamaConfig(num_hidden_layers=layers, max_position_embeddings=max(2048, seq), **dims)
    m = transformers.LlamaModel(cfg)
    return _Hidden(m), [torch.randint(0, cfg.vocab_size, (batch, seq))]


def resnet50(batch: int = 1, size: str = "full", image: int = 224) -> tuple[torch.nn.Module, list[Any]]:
    """ResNet-50 (torchvision's when it imports); tiny: two stages of one bottleneck, 16 base channels, 32²."""
    if size == "full":
        try:
            import torchvision
            m = torchvision.models.resnet50()
        except ImportError:
            m = ResNet((3, 4, 6, 3), 64)
    else:
        m = ResNet((1, 1), 16, classes=10)
        image = min(image, 32)
    return m, [torch.randn(batch, 3, image, image)]


class Bottleneck(torch.nn.Module):
    """ResNet's bottleneck block: 1×1 reduce, 3×3 (with the stride), 1×1 expand, batch norms, ReLU and
    the residual (projected when the shape changes) — torchvision's ResNet-50 v1.5 layout."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        nn = torch.nn
        cout = width * self.expansion
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet(torch.nn.Module):
    """ResNet with bottleneck blocks (``blocks`` per stage; (3, 4, 6, 3) and 64 base channels: ResNet-50)."""

    def __init__(self, blocks: tuple[int, ...], base: int, classes: int = 1000):
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(nn.Conv2d(3, base, 7, 2, 3, bias=False), nn.BatchNorm2d(base), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], base
        for k, n in enumerate(blocks):
            width = base * 2 ** k
            for b in range(n):
                layers.append(Bottleneck(cin, width, 2 if b == 0 and k > 0 else 1))
                cin = width * Bottleneck.expansion
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)
        for mod in self.modules():  # random statistics, so batch norms are not the identity
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.1, 0.1)
                mod.running_var.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


MODELS: dict[str, Callable[..., tuple[torch.nn.Module, list[Any]]]] = {
    "bert-base": bert, "gpt2-prefill": gpt2_prefill, "gpt2-decode": gpt2_decode, "llama": llama,
    "resnet50": resnet50,
}


def model(name: str, *, batch: int = 1, size: str = "full", device: str = "cpu", dtype: torch.dtype | None = None,
          seed: int = 0, **kwargs: Any) -> tuple[torch.nn.Module, list[Any]]:
    """The model ``name`` (one of ``MODELS``) in eval mode on ``device`` in ``dtype`` (default: float16 on a
    GPU, float32 on the CPU) with random weights, and its example inputs there."""
    if name not in MODELS:
        raise PolytileError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    if size not in ("full", "tiny"):
        raise PolytileError(f"size must be 'full' or 'tiny', got {size!r}")
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise PolytileError(f"device {device!r} is no torch device; use 'cpu' or 'cuda'") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise PolytileError(f"device {device!r}: torch finds no CUDA GPU here (torch {torch.__version__}); "
                            "build the model on the CPU (device='cpu') or run on a machine with an NVIDIA GPU")
    _seeded(seed)
    dtype = dtype or (torch.float16 if device.startswith("cuda") else torch.float32)
    m, inputs = MODELS[name](batch=batch, size=size, **kwargs)
    m = m.eval().to(device=device, dtype=dtype)
    return m, [_to(x, device, dtype) for x in inputs]


def _to(x: Any, device: str, dtype: torch.dtype) -> Any:
    if isinstance(x, list):
        return [_to(v, device, dtype) for v in x]
    if x.dtype.is_floating_point:
        return x.to(device=device, dtype=dtype)
    return x.to(device)
