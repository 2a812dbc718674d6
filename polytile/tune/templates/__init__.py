"""Built-in schedule templates (importing this package registers them)."""

from . import cpu, generic  # noqa: F401
