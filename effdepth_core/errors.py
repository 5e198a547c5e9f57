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


class OptionError(EffdepthError, ValueError):
    """An argument outside its range or choices: one line on the command line, and still the
    ValueError Python code expects."""


def nearest_name(given: str, names: list[str], separator: str = "_") -> str | None:
    """The name a misspelt or short ``given`` most likely means: one whose part after its prefix
    (``igrad_`` of ``igrad_max_steps``) ``given`` ends or starts with, the longest such part first
    (``max_steps`` → ``igrad_max_steps``, ``tolerance`` → ``igrad_tol``), else the closest spelling."""
    import difflib

    def tail(name: str) -> str:
        return name.lstrip(separator).split(separator, 1)[-1] if separator in name.lstrip(separator) else ""

    key = given.lstrip(separator)
    tails = [n for n in names if len(tail(n)) >= 3 and (key.endswith(tail(n)) or key.startswith(tail(n)))]
    if tails:
        return max(tails, key=lambda n: len(tail(n)))
    close = difflib.get_close_matches(given, names, n=1, cutoff=0.6)
    return close[0] if close else None


def require_whole(name: str, value, minimum: int = 1) -> int:
    """``value`` when it is a whole number of at least ``minimum`` (not a bool), else one line naming ``name``."""
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise OptionError(f"{name} must be a whole number of at least {minimum}, got {value!r}")
    return int(value)


def require_layers(name: str, layers, n_layers: int, model: str) -> list[int]:
    """``layers`` as a list when each is a layer index 0..n_layers-1 of ``model``, else one line."""
    import numbers

    chosen = [layers] if isinstance(layers, numbers.Integral) else list(layers)
    wrong = [v for v in chosen if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 0 <= v < n_layers]
    if wrong or not chosen:
        raise OptionError(
            f"{name} must be layer indices 0..{n_layers - 1} of {model} ({n_layers} layers), got {layers!r}"
        )
    return [int(v) for v in chosen]
