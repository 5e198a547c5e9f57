"""One declaration per option: its type, default, bounds or choices, and whether it enters the cache
key. The command line's flags (``cli_args``), the Python API's checks (``settings.check_settings``,
``MapSettings.check``) and the property-based test (``tests/test_options_fuzz.py``) all read these
declarations, so a bound is written once. A probe declares its own options the same way (its spec).

Every number that sets how much work is done (examples, digits, positions, steps, tokens, batch
sizes, top-k) has an upper bound derived from what the work can use or the memory it would need,
so a huge value is refused in one line before any model work instead of failing deep inside it.

Import-light on purpose (no torch): ``effdepth --help`` builds its parser from these.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import OptionError

KEY_ALWAYS = "always"  # in every cache key (options of the first release: their keys must not change)
KEY_WHEN_SET = "when set"  # in the key only when not at the default (so adding an option keeps old keys)
KEY_NEVER = "never"  # never in the key (how a result is shown, not what it is)
# the settings every run has (``settings.RunSettings``): no probe option may take these names
CORE_SETTINGS = (
    "model",
    "task",
    "n",
    "seed",
    "source",
    "level",
    "digits",
    "max_tokens",
    "positions",
    "device",
    "dtype",
    "batch_size",
    "method",
    "device_map",
    "progress",
)

# --- the bounds, each derived once ------------------------------------------------------------
# A generated task (addition, multiplication) has no size of its own; a run of more examples than
# this is a typo, not a study (a data set or task file is further bounded by its own examples).
MAX_GENERATED = 100_000
# The most examples any run can hold: a task file is at most 1 GiB (task_loading.TASK_FILE_LIMIT) and each
# example is at least a few bytes, so no run has more; also the largest useful batch.
MAX_EXAMPLES = 10_000_000
# Operand length: the product of two d-digit numbers has 2d digits, and Python converts at most 4300
# digits of an int to text (sys.int_info.default_max_str_digits); 1000 also keeps a prompt of two
# operands (≥ 2000 digit tokens) within a small model's context.
MAX_DIGITS = 1000
# Tokens of one prompt: no causal LM effdepth loads has a context of a million positions.
MAX_CONTEXT = 1_000_000
# Any vocabulary: the largest in use are ~256k tokens; top-k is further bounded by the model's own.
MAX_VOCAB = 1 << 20
# Gradient evaluations per layer (integrated gradients): each is a backward pass, so 2**16 per layer
# is days of CPU time already; the quadrature's node arrays stay kilobytes.
MAX_STEPS = 1 << 16
# Tuned-lens training: Adam steps, and tokens whose residual states are held in memory
# (tokens × layers × width × 4 bytes: 2**22 tokens of a 30-layer, 576-wide model are 290 GB).
MAX_LENS_STEPS = 1_000_000
MAX_LENS_TOKENS = 1 << 22
MAX_SEED = 2**63 - 1  # seeds are stored as 64-bit integers (parquet, numpy); a negative one aliases its absolute value
MAX_TEXT = 200  # the longest number or choice a user types; longer text is refused before it is read


def spelled(name: str, value: object = None) -> str:
    """An option as both callers write it, for messages: ``igrad_steps=16 (--igrad-steps 16)``."""
    flag = "--" + name.replace("_", "-")
    if value is None:
        return f"{name}= ({flag})"
    shown = _shown(value)
    return f"{name}={shown} ({flag} {value if isinstance(value, str) and shown == repr(value) else shown})"


def _shown(value: Any) -> str:
    """A value for a message: its repr, cut to 60 characters (a 10**5000 is not printed whole)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**50:
        digits = len(str(abs(value))) if abs(value) < 10**4000 else "over 4000"  # str() stops at 4300 digits
        return f"a {'negative ' if value < 0 else ''}number of {digits} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class Option:
    """One setting: its default, command-line flag and help, valid values, and whether it enters the
    cache key. ``name`` is the attribute of ``RunSettings`` (and the params/ key). ``type`` int or
    float makes it a number (refused when not one, nan, inf or a bool); ``minimum``/``maximum``
    bound it (inclusive, unless ``open_interval``)."""

    name: str
    default: Any
    help: str
    type: Callable[[str], Any] = str  # how the command line reads it
    choices: tuple | None = None
    minimum: float | None = None  # inclusive, unless ``open_interval``
    maximum: float | None = None
    open_interval: bool = False
    key: str = KEY_WHEN_SET
    flag: str | None = None  # default: --<name with dashes>
    check_value: Callable[[Any], str | None] | None = None  # further check: a message, or None when fine
    normalize: Callable[[Any], Any] | None = None  # one spelling per value (before checks and the key)
    # (value, settings) → what a run uses on this machine ("auto" → what the hardware picks): the key
    # holds the resolved value instead of the value, left out where it equals ``key_absent`` (what runs
    # computed before the option existed, so their keys stay); each probe's record names it too
    resolve: Callable[[Any, Any], Any] | None = None
    key_absent: Any = None

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def numeric(self) -> bool:
        return self.type in (int, float)

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not valid for this option (None when it is)."""
        if value is None and self.default is None:
            return None
        if self.choices is not None:
            if isinstance(value, bool) != isinstance(self.choices[0], bool) or value not in self.choices:
                return f"must be one of {', '.join(map(str, self.choices))}, got {_shown(value)}"
            return self.check_value(value) if self.check_value is not None else None
        if self.numeric or self.minimum is not None or self.maximum is not None:
            low, high = self.minimum, self.maximum
            fraction = self.open_interval and (low, high) == (0, 1)
            whole = self.type is int
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                kind = (
                    "a fraction between 0 and 1 (exclusive)" if fraction else "a whole number" if whole else "a number"
                )
                return f"must be {kind}, got {_shown(value)}"
            if whole and not isinstance(value, numbers.Integral):
                return f"must be a whole number, got {_shown(value)}"
            if not whole and not isinstance(value, numbers.Integral) and not math.isfinite(value):
                return (
                    f"must be a fraction between 0 and 1 (exclusive), got {_shown(value)}"
                    if fraction
                    else f"must be a finite number, got {_shown(value)}"
                )
            if fraction and not 0 < value < 1:
                return f"must be a fraction between 0 and 1 (exclusive), got {_shown(value)}"
            if self.open_interval and not ((low is None or value > low) and (high is None or value < high)):
                if high is None:
                    return f"must be greater than {low:g}, got {_shown(value)}"
                if low is None:
                    return f"must be less than {high:g}, got {_shown(value)}"
                return f"must be in ({low:g}, {high:g}), got {_shown(value)}"
            small = low is not None and high is not None and high < 100  # a short range is shown whole
            if not self.open_interval and low is not None and value < low:
                return f"must be {f'in {low:g}..{high:g}' if small else f'at least {low:g}'}, got {_shown(value)}"
            if not self.open_interval and high is not None and value > high:
                return f"must be {f'in {low:g}..{high:g}' if small else f'at most {high:,}'}, got {_shown(value)}"
        if self.type is str and not (
            isinstance(value, str) or (isinstance(value, list | tuple) and all(isinstance(v, str) for v in value))
        ):
            return f"must be text (or a list of texts), got {_shown(value)}"
        if self.check_value is not None:
            return self.check_value(value)
        return None

    def keyed(self, value: Any, settings: Any, probe: bool = False) -> tuple[bool, Any]:
        """Whether ``value`` enters a cache key, and as what: a run's key (``probe=False``) holds it
        by ``key`` (KEY_WHEN_SET: only when not the default), a probe's key whenever it is not
        KEY_NEVER; an option that ``resolve``s holds its resolved value, unless that is ``key_absent``."""
        if self.resolve is not None:
            resolved = self.resolve(value, settings)
            return resolved != self.key_absent, resolved
        if probe:
            return self.key != KEY_NEVER, value
        return self.key == KEY_ALWAYS or (self.key == KEY_WHEN_SET and value != self.default), value

    def check(self, value: Any) -> None:
        """One line (``OptionError``) naming the option in both spellings when ``value`` is not valid."""
        problem = self.problem(value)
        if problem:
            raise OptionError(f"{self.name} ({self.cli_flag}) {problem}")

    def parse(self, text: str) -> Any:
        """The command line's reading of ``text`` (a ValueError says why it is not valid; an empty
        text is never a value: leaving the option out gives its default)."""
        if not text.strip():
            raise ValueError("is empty; give a value or leave the option out (its default)")
        if (self.numeric or self.choices is not None) and len(text) > MAX_TEXT:
            raise ValueError(f"is {len(text)} characters long, no value it takes; give a shorter one")
        if self.numeric and any(c in text for c in "\n\r\t"):
            raise ValueError(f"must be {'a whole number' if self.type is int else 'a number'}, got {_shown(text)}")
        try:
            value = self.type(text)
        except (TypeError, ValueError):
            kind = {int: "a whole number", float: "a number"}.get(self.type, "a value")
            raise ValueError(f"must be {kind}, got {_shown(text)}") from None
        problem = self.problem(value)
        if problem:
            raise ValueError(problem)
        return value


# --- the core settings (RunSettings) and the other commands' numbers, declared once --------------
_WHOLE = {"type": int, "minimum": 1}
CORE_OPTIONS: dict[str, Option] = {
    o.name: o
    for o in (
        Option("n", None, "number of examples", maximum=MAX_EXAMPLES, **_WHOLE),
        Option("seed", 0, "the sampling seed", type=int, minimum=0, maximum=MAX_SEED),
        Option("source", "local", "vendored data or the HF hub", choices=("local", "hub")),
        Option("level", None, "MATH difficulty level 1..5 (math only)", type=int, minimum=1, maximum=5),
        Option("digits", 6, "operand length for addition/multiplication", maximum=MAX_DIGITS, **_WHOLE),
        Option("max_tokens", None, "drop prompts longer than this", maximum=MAX_CONTEXT, **_WHOLE),
        # the exact length control: a causal model's state at a position depends on earlier tokens only
        Option("positions", None, "measure each text's first N tokens only", maximum=MAX_CONTEXT, **_WHOLE),
        Option("dtype", "auto", "the weights' dtype", choices=("auto", "float32", "bfloat16", "float16")),
        Option("batch_size", 4, "prompts per forward pass", maximum=MAX_EXAMPLES, **_WHOLE),
        Option("method", "fast", "fast, or slow: the oracles (same numbers)", choices=("fast", "slow")),
    )
}
# ``effdepth map`` (MapSettings) and ``effdepth grid``/``book``: their numbers, as the run's
MAP_OPTIONS: dict[str, Option] = {
    o.name: o
    for o in (
        Option("n", 20, "test prompts", type=int, minimum=2, maximum=MAX_EXAMPLES),
        Option("n_validation", 10, "prompts that choose each map's ridge", maximum=MAX_EXAMPLES, **_WHOLE),
        # training tokens are tokens_per_width × the width, each row a residual held in memory
        Option("tokens_per_width", 10, "training tokens per dimension", maximum=10_000, **_WHOLE),
        Option("ridge", None, "a fixed ridge penalty", type=float, minimum=0, maximum=1e30),
        CORE_OPTIONS["seed"],
        Option("digits", None, "operand length", maximum=MAX_DIGITS, **_WHOLE),
        CORE_OPTIONS["max_tokens"],
    )
}
OTHER_OPTIONS: dict[str, Option] = {
    o.name: o
    for o in (
        Option("cpus_per_cell", None, "CPUs of each Ray task", maximum=4096, **_WHOLE),  # no node has more
        # memory per Ray task in GB: positive, and no node holds a petabyte
        Option(
            "memory_per_cell",
            None,
            "memory of each Ray task (GB)",
            type=float,
            minimum=0,
            maximum=1e6,
            open_interval=True,
        ),
        Option("bootstrap_seed", None, "the seed of every bootstrap interval", type=int, minimum=0, maximum=MAX_SEED),
    )
}


def argparse_type(option: Option) -> Callable[[str], Any]:
    """``option.parse`` as argparse's ``type=``: a bad value is argparse's one-line error (exit 2)."""
    import argparse

    def read(text: str) -> Any:
        try:
            return option.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    read.__name__ = option.name  # argparse names the type in its "invalid <name> value" fallback
    return read
