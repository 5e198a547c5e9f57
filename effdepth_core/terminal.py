"""What effdepth prints is escaped: a model name, task, level or reason read from a file can hold
control characters (ESC, BEL, newlines) that would move the cursor, ring, or forge a line of output.
``printable`` escapes them in a value; ``EscapingStream`` wraps the command line's stdout and stderr
so that nothing printed carries one, whichever message it came through. ``progress_bar``: every
progress bar, drawn once in a terminal and in Jupyter."""

from __future__ import annotations


def printable(text: object, keep: str = "") -> str:
    """``text`` with every control character (newlines too, unless in ``keep``) escaped as ``\\xNN``
    or ``\\uNNNN``: what came from a file never moves the cursor, rings or forges a line."""
    out = []
    for char in str(text):
        code = ord(char)
        if char in keep or not (code < 0x20 or 0x7F <= code < 0xA0 or code in (0x2028, 0x2029)):
            out.append(char)
        else:
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    return "".join(out)


class EscapingStream:
    """A text stream that escapes control characters (all but ``keep``) in what is written to it:
    the command line's stdout and stderr, so no message can carry a terminal escape from a file."""

    def __init__(self, stream, keep: str):
        self._stream, self._keep = stream, keep

    def write(self, text: str) -> int:
        self._stream.write(printable(text, self._keep))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _in_a_kernel() -> bool:
    """Whether this code runs in a Jupyter kernel (not merely in a process that imported one)."""
    import sys

    shell = sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None
    return shell is not None and "ipykernel" in type(shell).__module__


def progress_bar(*args, **kwargs):
    """A tqdm bar drawn once wherever it runs: a widget in a Jupyter kernel when ipywidgets is
    installed (the ``[book]`` extra) and no ``file=`` is given, else text on stderr (never
    tqdm.auto's fallback warning about IProgress); in a file rather than a terminal, its start, a
    line a minute at most and its end, the end once."""
    import sys

    if "file" not in kwargs and _in_a_kernel():
        import importlib.util

        if importlib.util.find_spec("ipywidgets") is not None:
            from tqdm.notebook import tqdm as notebook_bar

            return notebook_bar(*args, **kwargs)
    from tqdm.std import tqdm as text_bar

    stream = kwargs.get("file") or sys.stderr
    if getattr(stream, "isatty", lambda: False)():
        return text_bar(*args, **kwargs)
    # a log file keeps every redraw: one a minute at most (tqdm's monitor too), and the end once
    kwargs.setdefault("mininterval", LOG_INTERVAL)
    kwargs.setdefault("maxinterval", LOG_INTERVAL)

    class LogBar(text_bar):
        drawn_end = False

        def display(self, msg=None, pos=None):
            at_end = self.total is not None and self.n >= self.total
            if at_end and msg is None and self.drawn_end:
                return True  # its end was drawn at the last step: close() would draw it again
            self.drawn_end = at_end
            return super().display(msg, pos)

    return LogBar(*args, **kwargs)


LOG_INTERVAL = 60.0  # seconds between a bar's redraws in a file (a terminal redraws in place)
