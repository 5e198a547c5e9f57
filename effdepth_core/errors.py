"""Errors that the command line reports as one clear line (no traceback)."""


class EffdepthWarning(UserWarning):
    """Something the user should know about a run that still went ahead (the CLI prints one line)."""


class EffdepthError(Exception):
    """A problem with the user's input or environment; the message says what to do."""


class UnsupportedModelError(EffdepthError):
    """The model's architecture is not one the probes understand."""


class ModelNotFoundError(EffdepthError):
    """A model spec names no alias, directory, file, or reachable hub id."""


class TaskError(EffdepthError):
    """A task name, file or parameter is invalid."""


class NonFiniteActivationError(EffdepthError):
    """An activation contains NaN or inf."""
