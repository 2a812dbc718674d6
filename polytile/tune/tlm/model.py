"""The tensor language model: a word-level tokenizer of tensor sentences (Hugging Face ``tokenizers``)
and a small GPT-2 (``transformers.GPT2LMHeadModel``), saved and loaded as one directory with
``save_pretrained``/``from_pretrained``, plus ``tlm.json``: the target kind it was trained for, the
hash of its vocabulary and its training history.

The vocabulary holds the special words, every word of the sentences it was built from, the words of
every choice of every decision of the corpus's spaces (drawn or not) and, for every size key met,
every word ``size_word`` can write (so an unseen size is a known word). As TLM's ``gen/tokenizer.py``:
``WordLevel`` with ``WhitespaceSplit``, wrapped in a ``PreTrainedTokenizerFast``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..space import ConfigSpace, TuneError
from .sentence import SEP, decision_words, prompt_words, size_grid, size_key, split_sentence

FORMAT = 1
PAD, UNK, BOS, EOS = "[PAD]", "[UNK]", "[BOS]", "[EOS]"
SPECIALS = (PAD, UNK, BOS, SEP, EOS)
META = "tlm.json"
FILES = ("config.json", "model.safetensors", "tokenizer.json", META)
PACKAGED = Path(__file__).with_name("models")  # models shipped with polytile, one folder per target kind


@dataclass(frozen=True)
class ModelShape:
    """The GPT-2's size: 4 layers of width 256 with 4 heads is 3.2M parameters plus 256 per vocabulary word."""

    layers: int = 4
    width: int = 256
    heads: int = 4
    positions: int = 128


DEFAULT_SHAPE = ModelShape()


def vocabulary(sentences: Iterable[str], extra: Iterable[str] = ()) -> list[str]:
    """The words of a vocabulary built from ``sentences``: specials, every word met, the ``extra`` words
    (every choice of the corpus's decisions) and the whole size grid of every size key met in a prompt."""
    words: set[str] = set(extra)
    keys: set[str] = set()
    for text in sentences:
        prompt, decisions = split_sentence(text)
        words.update(prompt)
        words.update(decisions)
        keys.update(k for k in map(size_key, prompt) if k is not None)
    for key in keys:
        words.update(size_grid(key))
    words.difference_update(SPECIALS)
    return [*SPECIALS, *sorted(words)]


def _vocab_hash(vocab: dict[str, int]) -> str:
    text = json.dumps(sorted(vocab.items(), key=lambda kv: kv[1]))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _tokenizer(words: Sequence[str]) -> Any:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast
    core = Tokenizer(WordLevel({w: k for k, w in enumerate(words)}, unk_token=UNK))
    core.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token=UNK, pad_token=PAD, bos_token=BOS,
                                   eos_token=EOS, sep_token=SEP)


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's CPU threads set to ``n`` (None: left as they are) for the duration."""
    import torch
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def default_device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


class TLM:
    """A tokenizer, a GPT-2 and what they were trained for (``meta``)."""

    def __init__(self, tokenizer: Any, model: Any, meta: dict[str, Any], path: Path | None = None):
        self.tokenizer = tokenizer
        self.model = model
        self.meta = meta
        self.path = path
        self.ids = tokenizer.get_vocab()
        self.pad, self.unk, self.bos, self.sep, self.eos = (self.ids[w] for w in SPECIALS)

    # --- making, saving, loading -----------------------------------------------------------------------
    @staticmethod
    def create(sentences: Iterable[str], kind: str, shape: ModelShape = DEFAULT_SHAPE, seed: int = 0,
               device: str | None = None, words: Iterable[str] = ()) -> TLM:
        """An untrained model whose vocabulary covers ``sentences`` and ``words`` (for targets of ``kind``)."""
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
        tokenizer = _tokenizer(vocabulary(sentences, words))
        vocab = tokenizer.get_vocab()
        torch.manual_seed(seed)
        # no dropout, exact GELU: the model is small and the corpus large; both also train ~3x faster
        config = GPT2Config(vocab_size=len(vocab), n_positions=shape.positions, n_embd=shape.width,
                            n_layer=shape.layers, n_head=shape.heads, resid_pdrop=0.0, embd_pdrop=0.0,
                            attn_pdrop=0.0, activation_function="gelu", bos_token_id=vocab[BOS],
                            eos_token_id=vocab[EOS], pad_token_id=vocab[PAD])
        model = GPT2LMHeadModel(config).to(device or default_device())
        model.loss_type = "ForCausalLM"  # what GPT2LMHeadModel computes anyway, without a warning about it
        meta = {"format": FORMAT, "target_kind": kind, "vocab_hash": _vocab_hash(vocab), "shape": asdict(shape),
                "training": []}
        return TLM(tokenizer, model, meta)

    def save(self, path: str | os.PathLike[str], half: bool = False) -> None:
        """Write the model, its tokenizer and ``tlm.json`` to the directory ``path`` (``half``: float16
        weights, half the size on disk; loading gives float32 back)."""
        import torch
        out = Path(path)
        if out.exists() and not out.is_dir():
            raise TuneError(f"cannot save the model to {out}: it is a file; give a directory")
        out.mkdir(parents=True, exist_ok=True)
        model = self.model
        if half:
            model = type(model)(model.config)
            model.load_state_dict({k: v.detach().cpu() for k, v in self.model.state_dict().items()})
            model = model.to(torch.float16)
        with _quiet():
            model.save_pretrained(out)
            self.tokenizer.save_pretrained(out)
        (out / META).write_text(json.dumps(self.meta, indent=1) + "\n")
        self.path = out

    @staticmethod
    def load(path: str | os.PathLike[str], device: str | None = None) -> TLM:
        """The model saved in directory ``path``; TuneError when it is missing, incomplete, damaged, or
        its tokenizer is not the vocabulary its weights were trained with."""
        folder = Path(path)
        if not folder.exists():
            raise TuneError(f"TLM model {folder} does not exist; build one with `polytile tlm corpus` and "
                            "`polytile tlm pretrain` (see docs/tuning.md), or use model='default' on the CPU")
        if not folder.is_dir():
            raise TuneError(f"TLM model {folder} is not a directory; give the directory `polytile tlm "
                            "pretrain` wrote")
        missing = [f for f in FILES if not (folder / f).is_file()]
        if missing:
            raise TuneError(f"TLM model {folder} lacks {', '.join(missing)}: it is not a model directory "
                            "written by `polytile tlm pretrain`/`finetune`, or it is incomplete")
        meta = _read_meta(folder)
        import torch
        from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast
        with _quiet():
            try:
                tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
            except Exception as err:  # noqa: BLE001 - any failure means the file is damaged
                raise TuneError(f"TLM model {folder}: tokenizer.json cannot be read ({_first_line(err)}); the "
                                "directory is damaged, build the model again") from None
            try:
                model = GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32)
            except Exception as err:  # noqa: BLE001
                raise TuneError(f"TLM model {folder}: its weights cannot be read ({_first_line(err)}); the "
                                "directory is damaged, build the model again") from None
        model.loss_type = "ForCausalLM"
        vocab = tokenizer.get_vocab()
        if _vocab_hash(vocab) != meta["vocab_hash"] or model.config.vocab_size != len(vocab):
            raise TuneError(f"TLM model {folder}: tokenizer.json holds another vocabulary ({len(vocab)} words) "
                            f"than the one its weights were trained with ({model.config.vocab_size} words, "
                            "tlm.json's vocab_hash); keep a model's files together")
        if any(w not in vocab for w in SPECIALS):
            raise TuneError(f"TLM model {folder}: its vocabulary lacks the words {', '.join(SPECIALS)}")
        return TLM(tokenizer, model.to(device or default_device()).eval(), meta, folder)

    # --- what it was trained for ---------------------------------------------------------------------
    @property
    def kind(self) -> str:
        return str(self.meta["target_kind"])

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    def check_task(self, task: Any) -> None:
        """TuneError when the model was trained for another kind of target than ``task``'s."""
        if task.target.kind != self.kind:
            where = f" ({self.path})" if self.path else ""
            raise TuneError(f"the TLM model{where} was trained for {self.kind} targets, not {task.target.kind} "
                            f"({task.target.key}); build a model for this target with `polytile tlm corpus "
                            f"--target {task.target.kind}` and `polytile tlm pretrain`")

    # --- words to ids --------------------------------------------------------------------------------
    def word_ids(self, words: Sequence[str]) -> list[int]:
        return [self.ids.get(w, self.unk) for w in words]

    def prompt_ids(self, task: Any) -> list[int]:
        """``[BOS] <prompt> [SEP]``: what decoding starts from."""
        ids = [self.bos, *self.word_ids(prompt_words(task)), self.sep]
        limit = self.model.config.n_positions
        if len(ids) + len(task.space.decisions) >= limit:
            raise TuneError(f"the sentences of {task.workload.key} ({len(ids)} prompt words, "
                            f"{len(task.space.decisions)} decisions) exceed the model's {limit} positions")
        return ids

    def choice_ids(self, space: ConfigSpace) -> list[np.ndarray]:
        """Per decision, the word id of each choice ([UNK] for a word outside the vocabulary)."""
        return [np.array(self.word_ids(dw.words), dtype=np.int64) for dw in decision_words(space)]

    def unknown_decisions(self, space: ConfigSpace) -> list[str]:
        """The decisions of ``space`` none of whose choices is a word of the vocabulary: the model was
        built before its template declared them, and decoding can only draw them uniformly."""
        return [dw.name for dw in decision_words(space) if all(w not in self.ids for w in dw.words)]

    def encode(self, texts: Sequence[str]) -> list[tuple[list[int], int]]:
        """Sentences as ``[BOS] prompt [SEP] decisions [EOS]`` ids, each with its prompt length (the
        ids up to and including [SEP], which training does not score)."""
        out = []
        for text in texts:
            prompt, decisions = split_sentence(text)
            ids = [self.bos, *self.word_ids(prompt), self.sep, *self.word_ids(decisions), self.eos]
            out.append((ids, len(prompt) + 2))
        return out


@contextmanager
def _quiet() -> Iterator[None]:
    """Without transformers' progress bars and notices (a model of ours is saved and loaded often)."""
    from transformers.utils import logging
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def _read_meta(folder: Path) -> dict[str, Any]:
    try:
        meta = json.loads((folder / META).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TuneError(f"TLM model {folder}: {META} cannot be read ({_first_line(err)}); the directory "
                        "is damaged, build the model again") from None
    if not isinstance(meta, dict) or not {"format", "target_kind", "vocab_hash"} <= set(meta):
        raise TuneError(f"TLM model {folder}: {META} is not a TLM model description")
    if int(meta["format"]) > FORMAT:
        raise TuneError(f"TLM model {folder} was written by a newer polytile (format {meta['format']}); "
                        "upgrade polytile to load it")
    return meta


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def shipped() -> list[str]:
    """The target kinds a model is shipped for."""
    return sorted(p.name for p in PACKAGED.iterdir() if (p / META).is_file()) if PACKAGED.is_dir() else []


def resolve(model: object, kind: str = "cpu", device: str | None = None) -> TLM:
    """A model given as a ``TLM``, a directory, or ``"default"`` (the model shipped for targets of
    ``kind``: there is one for the CPU)."""
    if isinstance(model, TLM):
        return model
    if model is None:
        raise TuneError("tuner 'tlm' needs a trained model: pass model='default' (the CPU model shipped with "
                        "polytile) or the directory of one built with `polytile tlm pretrain` "
                        "(docs/tuning.md, \"Tensor language model\")")
    if model == "default":
        if kind not in shipped():
            raise TuneError(f"no TLM model is shipped for {kind} targets (only for: "
                            f"{', '.join(shipped()) or 'none'}); "
                            f"build one with `polytile tlm corpus --target {kind}` and `polytile tlm pretrain`")
        return TLM.load(PACKAGED / kind, device)
    if not isinstance(model, (str, os.PathLike)):
        raise TuneError(f"model must be a directory, 'default' or a TLM, not {type(model).__name__}")
    return TLM.load(model, device)
