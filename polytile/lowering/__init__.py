"""Lowering: the polyhedral AST to loop IR, then an ordered list of passes."""
