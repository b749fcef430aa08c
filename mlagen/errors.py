"""Errors a user can act on.  The CLI prints ``str(error)`` and exits non-zero."""

from __future__ import annotations


def clip(text: str, limit: int = 80) -> str:
    """``text`` as a one-line message echoes it: at most about ``limit`` characters (a
    500 kB value pasted by mistake is named by its length, not printed whole)."""
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit - 20]}... ({len(text)} characters)"


class MlagenError(Exception):
    """Base of every error mlagen raises on purpose."""


class ScheduleError(MlagenError, ValueError):
    """A schedule breaks a rule; the message names the file and line when known."""

    def __init__(self, message: str, file: str | None = None, line: int | None = None):
        self.message, self.file, self.line = message, file, line
        where = file or "<schedule>"
        if line is not None:
            where += f":{line}"
        super().__init__(f"{where}: {message}")


class ResourceError(ScheduleError):
    """A legal-looking schedule needs more of the target than it has (can_implement)."""


class TargetError(MlagenError):
    """A target description is missing or malformed."""


class BuildError(MlagenError):
    """The compiler failed.  Carries what a user needs to act on it."""

    def __init__(self, variant: str, command: str, first_error: str, log_path: str,
                 hint: str | None = None):
        self.variant, self.command, self.first_error, self.log_path = \
            variant, command, first_error, log_path
        self.hint = hint
        msg = (f"build of {variant} failed\n  command: {command}\n"
               f"  first error: {first_error}\n  full log: {log_path}")
        if hint:
            msg += f"\n  hint: {hint}"
        super().__init__(msg)


class InputError(MlagenError, ValueError):
    """A tensor handed to a kernel is wrong (dtype, shape, device, stride, index range)."""


class EmulatorError(MlagenError, RuntimeError):
    """An emulated target caught a protocol violation (a read before its DMA, a capacity
    overflow, a DMA into a buffer in use)."""
