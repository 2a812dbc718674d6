"""The tensor language model (TLM, Zhai et al., OSDI'24) as a tuner: schedules written as tensor
sentences (``sentence``) and a corpus of random valid sentences of real networks' layers (``corpus``,
``networks``)."""

from .sentence import prompt_words, read_sentence, sentence

__all__ = ["prompt_words", "read_sentence", "sentence"]
