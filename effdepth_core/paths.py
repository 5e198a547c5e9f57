"""The one place a path a user gives becomes a ``Path``: ``~`` expanded (a ``~user`` with no home
is one line, not Python's RuntimeError), and existence asked so that a name the file system
cannot take (longer than 255 bytes) is simply no file rather than an ``OSError``; and every file
or folder name effdepth derives from a user's text goes through ``short_name``, so none exceeds it."""

from __future__ import annotations

import hashlib
from pathlib import Path

from .errors import EffdepthError


def user_path(text: str | Path) -> Path:
    """``text`` as a path with ``~`` / ``~user`` expanded."""
    try:
        return Path(text).expanduser()
    except RuntimeError as exc:  # ~user with no such user, or no home directory at all
        raise EffdepthError(f"cannot expand {str(text)!r} ({exc}); write the path out in full") from None


def exists(path: Path, kind: str = "any") -> bool:
    """Whether ``path`` exists (``kind``: ``"file"``, ``"dir"`` or ``"any"``); False for a name the
    file system cannot take."""
    try:
        return path.is_file() if kind == "file" else path.is_dir() if kind == "dir" else path.exists()
    except OSError:
        return False


def names_path(text: str) -> Path | None:
    """The path ``text`` names when it is one that exists, else None (a model or task *name*)."""
    try:
        path = Path(text).expanduser()
    except RuntimeError:
        return None
    return path if exists(path) else None


NAME_BYTES = 200  # a derived file or folder name stays well under the 255 bytes file systems allow


def short_name(name: str, source: str | None = None) -> str:
    """``name`` as it is, or — past ``NAME_BYTES`` — cut and ended with a hash of ``source`` (the
    whole spec it came from), so that two long specs never share a name."""
    if len(name.encode()) <= NAME_BYTES:
        return name
    digest = hashlib.sha256((source or name).encode()).hexdigest()[:12]
    return f"{name.encode()[: NAME_BYTES - 13].decode(errors='ignore')}-{digest}"
