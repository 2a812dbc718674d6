"""Built-in schedule templates (importing this package registers them)."""

from . import cpu, cuda, generic  # noqa: F401
