"""Built-in schedule templates (importing this package registers them)."""

from . import cpu, cuda, cuda_rows, generic  # noqa: F401
