"""What produced a result: library versions, effdepth's commit, and the model's identity."""

from __future__ import annotations

import platform
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path

from .models import LoadedModel
from .paths import exists, names_path
from .zoo import ZOO


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


@cache
def git_commit() -> str | None:
    """The commit of the effdepth checkout (None for an installed wheel or without git)."""
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return None
    try:
        result = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        )
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() + ("+modified" if dirty else "")


def environment() -> dict:
    """Versions of Python, torch, transformers and effdepth, and effdepth's commit."""
    from . import __version__

    return {
        "effdepth": __version__,
        "effdepth_commit": git_commit(),
        "python": platform.python_version(),
        **{name: _version(name) for name in ("torch", "transformers", "gguf", "polars")},
    }


def model_provenance(spec: str, loaded: LoadedModel) -> dict:
    """How to find the exact weights again: the offline alias's sha256, a local file's size and
    name, or the hub revision (commit hash) transformers resolved."""
    info: dict = {"spec": spec}
    if spec in ZOO:
        entry = ZOO[spec]
        info.update(sha256=entry.sha256, upstream=entry.upstream, quantization=entry.quantization)
        return info
    path = names_path(spec)  # None: a name no file or folder holds (a hub id, a label)
    if path is not None and exists(path, "file"):
        info.update(path=str(path.resolve()), size=path.stat().st_size)
    elif path is not None:
        info.update(path=str(path.resolve()))
    revision = getattr(loaded.model.config, "_commit_hash", None)
    if revision:
        info["revision"] = revision
    return info
