"""The block emulator of the tests without a GPU: ``polytile.fuzz.emulator`` (the CUDA fuzzer runs it too)."""

from polytile.fuzz.emulator import run

__all__ = ["run"]
