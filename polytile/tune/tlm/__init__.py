"""The tensor language model (TLM, Zhai et al., OSDI'24) as a tuner: schedules written as tensor
sentences (``sentence``), a word-level tokenizer and a small GPT-2 (``model``) pretrained on random
valid sentences of real networks' layers (``corpus``, ``train``), fine-tuned on the best measured
ones (``finetune``), and decoding constrained to valid, unmeasured configurations (``decode``) that
proposes the batches of ``pt.tune(..., tuner="tlm")`` (``tuner``); ``polytile tlm`` (``cli``) and
``evaluate`` drive it. torch and transformers are imported only when a model is made or loaded.
"""

from .sentence import prompt_words, read_sentence, sentence
from .tuner import TLMTuner

__all__ = ["TLMTuner", "prompt_words", "read_sentence", "sentence"]
