"""Lowering passes, one per module, each a function from loop IR to loop IR."""
