"""Exceptions raised by polytile, each naming the user's object and what to do."""


class PolytileError(Exception):
    """Base class of every error polytile raises on purpose."""


class LanguageError(PolytileError):
    """An algorithm is malformed: bad shapes, dtypes, expressions or axes."""


class ScheduleError(PolytileError):
    """A schedule primitive is illegal: it breaks a dependence or names an unknown loop."""


class LoweringError(PolytileError):
    """A schedule could not be turned into code (an unsupported combination of primitives)."""


class BuildError(PolytileError):
    """The system compiler rejected generated code; the message carries its output."""


class InputError(PolytileError):
    """A kernel was called with arguments of the wrong shape, dtype, device or value."""


class DeviceError(PolytileError):
    """A GPU driver or runtime call failed; the message names the kernel and the CUDA error."""
