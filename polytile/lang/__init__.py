"""The algorithm language: tensors, expressions, reductions, parameters and functions."""
