"""The one cache layer under every cache effdepth keeps (run directories, the cross-model map, tuned
lenses, model files and dequantized weights): atomic writes, verified files, and a directory lock.

- **Atomic writes.** A file is written under an unpredictable temporary name in its own folder
  (``.<name>.effdepth-tmp-<host>-<pid>-<random>``), created exclusively and never through a link
  (``O_EXCL | O_NOFOLLOW``), then renamed into place, so a reader never sees half a file and nothing
  planted at a guessable name is followed. A failed write (a full disk, say) removes its temporary
  and raises ``CacheWriteError``, one line naming the path; nothing already cached is touched. A
  folder is built the same way and renamed whole.
- **Checked reads.** Whatever effdepth reads back is first checked to be a regular file of bounded
  size (``read_regular``): a FIFO, a device or a huge file planted where a record belongs is refused
  in one line rather than blocking or exhausting memory.
- **Verified files.** ``file_record`` is what effdepth writes down when it writes a file: its sha256
  and a *fingerprint* (size, inode, mtime, ctime). ``check_file`` compares the fingerprint first: if
  it is unchanged the file is the one that was hashed (ctime cannot be set back from user space, so
  any rewrite or flipped bit since then changes it); otherwise the file is hashed again in full.
- **The lock.** ``DirectoryLock`` holds ``.effdepth.lock`` in a directory for one process at a time
  (``flock``; on Linux NFS v4 this is a POSIX lock the server arbitrates, so two machines sharing
  the folder exclude each other too). The file is created whole by ``link`` (never truncated or
  written through a link), carries effdepth's mark, and is removed on release only while it is
  still the file this process created or adopted. Anything else at that path is refused.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import EffdepthError

LOCK_NAME = ".effdepth.lock"
LOCK_MARK = "effdepth lock"  # the first words of every lock file effdepth writes
_TEMPORARY = re.compile(
    r"^\.(?P<name>.+)\.effdepth-tmp-(?:(?P<host>[A-Za-z0-9_-]*)-)?(?P<pid>\d+)(?:-(?P<token>[0-9a-f]{16}))?$"
)
RECORD_LIMIT = 64 << 20  # the largest record (JSON, YAML, a lock) effdepth reads back: 64 MiB


class CacheWriteError(EffdepthError):
    """A cache file could not be written (a full disk, no permission); nothing cached was lost."""


class NotARegularFile(EffdepthError):
    """A path effdepth reads is a FIFO, device, directory or link, or larger than it can be."""


class CacheLockError(EffdepthError):
    """A directory is locked by another effdepth process, or its lock path holds something else."""


class LockHeldError(CacheLockError):
    """Another live effdepth process holds the directory's lock (wait, or let it finish)."""


# --- atomic writes ---------------------------------------------------------------------------


_HOST = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:64] or "host"


def temporary_path(path: Path) -> Path:
    """A fresh, unpredictable temporary name for an atomic write of ``path`` (same folder, so the
    rename is atomic; host and pid say whose it is on a shared disk). A target whose name leaves
    no room for the suffix within 255 bytes lends a cut of its name ended with a hash of it."""
    suffix = f".effdepth-tmp-{_HOST}-{os.getpid()}-{secrets.token_hex(8)}"
    name, room = path.name, 255 - 1 - len(suffix.encode())
    if len(name.encode()) > room:
        digest = hashlib.sha256(name.encode()).hexdigest()[:12]
        name = f"{name.encode()[: room - 13].decode(errors='ignore')}-{digest}"
    return path.with_name(f".{name}{suffix}")


def temporary_of(name: str) -> str | None:
    """The file name a temporary of effdepth's atomic writes stands for, or None."""
    match = _TEMPORARY.match(name)
    return match["name"] if match else None


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def create_exclusive(path: Path, mode: int = 0o644):
    """A new file at ``path`` opened for binary writing; fails if anything (a link included) is there."""
    return os.fdopen(os.open(path, _CREATE, mode), "wb")


def is_disk_error(exc: BaseException) -> OSError | None:
    """The ``OSError`` behind a failed write, also when a library wrapped it (polars reports
    ``os error 28``, safetensors its own error): None when it was not the disk or the file system."""
    if isinstance(exc, OSError):
        return exc
    text = str(exc)
    match = re.search(r"os error (\d+)|\[Errno (\d+)\]", text)
    if match:
        number = int(match[1] or match[2])
        return OSError(number, os.strerror(number))
    if "No space left on device" in text:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return None


def _write_failed(path: Path, exc: OSError, kept: str) -> CacheWriteError:
    why = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else (exc.strerror or str(exc))
    return CacheWriteError(f"cannot write {path} ({why}); nothing was lost: {kept}")


class OutputExistsError(EffdepthError):
    """A file appeared at an output path after effdepth checked it was free: it was not replaced."""


def atomic_write(
    path: Path, write: Callable, kept: str = "files written before are intact", replace: bool = True
) -> None:
    """``write(handle)`` into a new, exclusively created temporary file (an open binary handle), then
    put it at ``path``: renamed over what is there (a link is replaced, never followed) or, with
    ``replace`` False, claimed at that moment (a hard link, which fails if anything appeared at
    ``path`` since it was checked: ``OutputExistsError``, the file there untouched). On failure the
    temporary is removed and a one-line ``CacheWriteError`` says what happened (``kept``: what the
    user still has)."""
    tmp = temporary_path(path)
    created = False
    try:
        with create_exclusive(tmp) as handle:
            created = True
            write(handle)
        if replace:
            os.replace(tmp, path)
        else:
            try:
                try:
                    os.link(tmp, path)  # no-replace: never over a file that appeared since the check
                except FileExistsError:
                    raise
                except OSError:  # a file system without hard links: claim the name empty, then fill it
                    os.close(os.open(path, _CREATE, 0o644))
                    os.replace(tmp, path)
            except FileExistsError:
                raise OutputExistsError(
                    f"{path} appeared while effdepth was working; it was not replaced: move it away or choose "
                    "another name, then run again"
                ) from None
            tmp.unlink(missing_ok=True)
    except BaseException as exc:
        if created:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        disk = is_disk_error(exc) if isinstance(exc, Exception) else None
        if disk is not None:
            raise _write_failed(path, disk, kept) from exc
        raise


def atomic_write_bytes(
    path: Path, data: bytes, kept: str = "files written before are intact", replace: bool = True
) -> None:
    atomic_write(path, lambda handle: handle.write(data), kept, replace)


def atomic_write_json(path: Path, payload: dict, kept: str = "files written before are intact") -> None:
    atomic_write_bytes(path, (json.dumps(payload, indent=2) + "\n").encode(), kept)


def atomic_write_parquet(
    path: Path, frame, kept: str = "files written before are intact", replace: bool = True
) -> None:
    """The frame is serialized in memory first, so a full disk is the plain ``OSError`` of our write;
    ``replace`` as ``atomic_write``."""
    import io

    def write(handle) -> None:
        buffer = io.BytesIO()
        frame.write_parquet(buffer)
        handle.write(buffer.getvalue())

    atomic_write(path, write, kept, replace)


def make_dirs(path: Path, mode: int = 0o755) -> None:
    """Create ``path`` and its missing parents with exactly ``mode`` whatever the umask (``umask 000``
    made effdepth's own cache world-writable, which it then refused); existing folders are left as
    they are."""
    missing = []
    current = Path(path)
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, mode)
        except FileExistsError:
            continue  # made meanwhile by another process: theirs to have set
        os.chmod(folder, mode)


def atomic_folder(folder: Path, build: Callable[[Path], None], kept: str = "nothing was cached there yet") -> None:
    """``build(temporary folder)`` then rename it to ``folder`` (which must not exist); the
    temporary folder, effdepth's own (created by this call under an unpredictable name), is removed
    on any failure."""
    tmp = temporary_path(folder)
    made = False
    try:
        make_dirs(folder.parent)
        tmp.mkdir(mode=0o755)
        os.chmod(tmp, 0o755)
        made = True
        build(tmp)
        os.rename(tmp, folder)
    except BaseException as exc:
        if made:
            shutil.rmtree(tmp, ignore_errors=True)
        disk = is_disk_error(exc) if isinstance(exc, Exception) else None
        if disk is not None:
            raise _write_failed(folder, disk, kept) from exc
        raise


def remove_recorded_folder(folder: Path, names) -> bool:
    """Remove the files ``names`` (effdepth's record of what it wrote there) from ``folder``, then the
    folder if nothing else is left; True if the folder is gone. Nothing unrecorded is deleted."""
    for name in names:
        if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
            continue
        with contextlib.suppress(OSError):
            entry = folder / name
            if entry.is_symlink() or entry.is_file():
                entry.unlink()
    try:
        folder.rmdir()
    except OSError:
        return False
    return True


# --- checked reads ---------------------------------------------------------------------------


def read_regular(path: Path, limit: int = RECORD_LIMIT, what: str = "file") -> bytes:
    """The bytes of ``path``, which must be a regular file (no link, FIFO or device) of at most
    ``limit`` bytes. Opened non-blocking and checked on the open descriptor, so nothing swapped in
    between the check and the read can block. ``FileNotFoundError`` when nothing is there."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotARegularFile(f"{path} is a symbolic link, not a {what} effdepth wrote; move it away") from exc
        if exc.errno in (errno.EISDIR, errno.ENXIO):
            raise NotARegularFile(f"{path} is not a regular file; move it away") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARegularFile(f"{path} is not a regular file (a FIFO, device or folder); move it away")
        if st.st_size > limit:
            raise NotARegularFile(
                f"{path} is {st.st_size} bytes, more than a {what} can be ({limit} bytes); move it away"
            )
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > limit:
                raise NotARegularFile(f"{path} grew beyond {limit} bytes while read; move it away")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_json(path: Path, limit: int = RECORD_LIMIT, what: str = "record") -> object:
    """A JSON record read through ``read_regular``: ``OSError``/``NotARegularFile`` if unreadable,
    ``ValueError`` if not JSON."""
    return json.loads(read_regular(path, limit, what).decode("utf-8"))


def remove_stale_temporaries(folder: Path, owns: Callable[[str], bool]) -> None:
    """Delete temporaries of killed writes in ``folder`` (call while holding its lock): regular
    files (or effdepth's temporary folders) named ``.<own name>.effdepth-tmp-<pid>``."""
    for entry in folder.iterdir():
        name = temporary_of(entry.name)
        if name is None or not owns(name) or entry.is_symlink():
            continue
        if entry.is_file():
            entry.unlink(missing_ok=True)


def _writer_is_gone(match: re.Match) -> bool:
    """Whether the writer a temporary's name records (host, pid) is a process of this host that no
    longer runs. Another host's, a live pid (reused or not) and this process's own are never gone."""
    if match["host"] != _HOST or match["token"] is None:
        return False
    pid = int(match["pid"])
    if pid == os.getpid() or pid > 1 << 22:  # no pid is above 2**22 on Linux
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive under another user, or unknowable: kept
        return False
    return False


def remove_dead_temporaries(folder: Path, owns: Callable[[str], bool]) -> None:
    """Delete the temporaries a killed write of effdepth's left in ``folder``, where no lock says
    whose the folder is (effdepth's prompt files, a user's ``plot --out`` folder): regular files
    named ``.<own name>.effdepth-tmp-<host>-<pid>-<token>`` — a name only effdepth's atomic writes
    give — whose writer on this host no longer runs. Never a link, never another host's or a live
    writer's temporary."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    for entry in entries:
        match = _TEMPORARY.match(entry.name)
        if match is None or not owns(match["name"]) or entry.is_symlink() or not entry.is_file():
            continue
        if _writer_is_gone(match):
            entry.unlink(missing_ok=True)


# --- verified files ------------------------------------------------------------------------


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """The sha256 of a regular file (a FIFO or device there is refused, never read)."""
    digest = hashlib.sha256()
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotARegularFile(f"{path} is not a regular file (a FIFO, device or folder); move it away")
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def fingerprint(path: Path) -> dict:
    """Size, inode, mtime and ctime of ``path`` (the link itself is never followed)."""
    st = os.lstat(path)
    return {"size": st.st_size, "inode": st.st_ino, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def file_record(path: Path, sha256: str | None = None) -> dict:
    """What effdepth writes down about a file it wrote: its sha256 and fingerprint."""
    return {"sha256": sha256 or sha256_file(path), **fingerprint(path)}


def same_fingerprint(record: dict, path: Path) -> bool:
    current = fingerprint(path)
    return all(record.get(key) == value for key, value in current.items())


def check_file(path: Path, record: dict | None, full: bool = False) -> tuple[str, dict | None]:
    """``(state, record)`` of ``path`` against what was recorded when it was written:
    ``verified`` (unchanged since hashed, or hashed again now and equal; the record is refreshed),
    ``missing`` (no regular file there, or a link), ``unrecorded`` (no usable record) or ``changed``
    (its sha256 differs: damaged or edited since). ``full`` hashes even an unchanged fingerprint."""
    if path.is_symlink() or not path.is_file():
        return "missing", record
    if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
        return "unrecorded", record
    if not full and same_fingerprint(record, path):
        return "verified", record
    digest = sha256_file(path)
    if digest != record["sha256"]:
        return "changed", record
    return "verified", file_record(path, digest)


# --- the lock --------------------------------------------------------------------------------


def _lock_text() -> str:
    return f"{LOCK_MARK}\npid {os.getpid()}\nhost {socket.gethostname()}\n"


def _holder(text: str) -> str:
    words = dict(line.split(" ", 1) for line in text.splitlines()[1:] if " " in line)
    return f"pid {words.get('pid', '?')} on {words.get('host', '?')}"


class DirectoryLock:
    """``.effdepth.lock`` in ``folder``, held by this process until ``release``."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.path = folder / LOCK_NAME
        self._fd: int | None = None

    def _foreign(self, what: str) -> CacheLockError:
        return CacheLockError(
            f"{self.path} is {what}, not effdepth's lock; effdepth does not touch it: move it away or use another "
            "folder"
        )

    def _create(self) -> bool:
        """Create the lock file whole (content first, then a hard link to its final name)."""
        tmp = temporary_path(self.path)
        made = False
        try:
            with create_exclusive(tmp) as handle:
                made = True
                handle.write(_lock_text().encode())
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise _write_failed(self.path, exc, "nothing was written") from exc
            raise CacheLockError(
                f"cannot write in {self.folder} ({exc.strerror or exc}); choose another folder"
            ) from exc
        finally:
            if made:
                with contextlib.suppress(OSError):
                    tmp.unlink(missing_ok=True)

    def _drop_own_temporaries(self, st: os.stat_result) -> None:
        """Unlink the other names of the lock file that are effdepth's temporaries of this very lock
        (``_create`` links its temporary to the lock's name, then unlinks it: a process killed in
        between leaves both); any other name is left, and the lock is then refused as foreign."""
        for other in self.folder.iterdir():
            if temporary_of(other.name) != LOCK_NAME:
                continue
            with contextlib.suppress(OSError):
                own = other.lstat()
                if stat.S_ISREG(own.st_mode) and (own.st_ino, own.st_dev) == (st.st_ino, st.st_dev):
                    other.unlink()

    def _open_existing(self) -> int | None:
        try:
            fd = os.open(self.path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return None  # released between our link attempt and now: try again
        except OSError as exc:
            if exc.errno == errno.ELOOP or self.path.is_symlink():
                raise self._foreign("a symbolic link") from exc
            if self.path.is_dir():
                raise self._foreign("a directory") from exc
            raise CacheLockError(f"cannot open {self.path} ({exc.strerror or exc})") from exc
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:  # a creator killed between link and unlink
            self._drop_own_temporaries(st)
            st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            raise self._foreign("a special file" if not stat.S_ISREG(st.st_mode) else "a file with other names")
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        if not text.startswith(LOCK_MARK):
            os.close(fd)
            raise self._foreign("a file of other content")
        return fd

    def acquire(self) -> None:
        for _ in range(5):  # the lock file can vanish (a holder releasing) between our steps: retry
            created = self._create()
            fd = self._open_existing()
            if fd is None:
                continue
            try:
                import fcntl

                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except ImportError:  # no flock (Windows): one run per folder is then up to the user
                pass
            except OSError as exc:
                text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                    raise CacheLockError(
                        f"cannot lock {self.folder}: its filesystem refuses file locks ({exc.strerror or exc}); "
                        "effdepth writes only where it can lock (local disks, NFSv4, CephFS, GPFS, Lustre -o flock)"
                    ) from exc
                raise LockHeldError(
                    f"{self.folder} is being written by another effdepth process ({_holder(text)}); "
                    "wait for it to finish or choose another folder"
                ) from exc
            try:
                same = os.fstat(fd).st_ino == os.lstat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            if not created:  # a stale lock of a killed effdepth process: ours now; say who holds it
                text = _lock_text().encode()
                os.ftruncate(fd, 0)
                os.pwrite(fd, text, 0)
            self._fd = fd
            return
        raise CacheLockError(f"could not lock {self.folder}; another effdepth process keeps starting there")

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Unlock; the lock file goes too, if it is still the one this process holds."""
        if self._fd is None:
            return
        try:
            if os.lstat(self.path).st_ino == os.fstat(self._fd).st_ino:
                self.path.unlink()
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[DirectoryLock]:
    """Hold ``folder``'s lock for the block."""
    lock = DirectoryLock(folder)
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()


# the cache root: every cache above lives under it
CACHE_ENV = "EFFDEPTH_CACHE"
SYSTEM_FOLDERS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/sbin", "/sys", "/usr")


def cache_dir() -> Path:
    """Root of effdepth's cache (``$EFFDEPTH_CACHE``, else ``~/.cache/effdepth``), resolved once (a
    link is followed here, and only here); refused in one line when it is, or links to, the file
    system's root or a system folder, or when there is no home directory to put it in."""
    root = os.environ.get(CACHE_ENV)
    try:
        path = Path(root).expanduser() if root else Path.home() / ".cache" / "effdepth"
    except (RuntimeError, KeyError) as exc:  # HOME unset and no passwd entry
        raise EffdepthError(
            f"cannot find a home directory for effdepth's cache ({exc}); set {CACHE_ENV} to a folder of your own"
        ) from None
    resolved = path.resolve()
    if (resolved.exists() or path.is_symlink()) and not resolved.is_dir():
        where = f"{CACHE_ENV}={root}" if root else str(path)
        raise EffdepthError(
            f"cannot write the model cache {where}: it is not a directory; set {CACHE_ENV} to a directory"
        )
    text = resolved.as_posix()
    if text == "/" or any(text == folder or text.startswith(folder + "/") for folder in SYSTEM_FOLDERS):
        link = " a link to" if resolved != path.absolute() else ""
        raise EffdepthError(
            f"effdepth's cache {path} is{link} a system folder ({text}); set {CACHE_ENV} to a folder of your own"
        )
    if resolved.is_dir():
        check_private(resolved)  # others could change effdepth's records there, hence its numbers
    return resolved


def check_cache_dir() -> Path:
    """The cache root, after checking it can be one: a file (or a link to one) at that path is a
    one-line error naming the setting, never silently "nothing cached"."""
    root = cache_dir()
    if (root.exists() or root.is_symlink()) and not root.is_dir():
        where = f"{CACHE_ENV}={os.environ[CACHE_ENV]}" if os.environ.get(CACHE_ENV) else str(root)
        raise EffdepthError(
            f"cannot write the model cache {where}: it is not a directory; set {CACHE_ENV} to a directory"
        )
    check_private(root)
    return root


def check_private(path: Path) -> None:
    """Refuse a cache folder other users can write to (as ssh refuses a key with loose permissions):
    whoever can change effdepth's records there can change its numbers. A sticky folder (``/tmp``)
    is fine: others cannot replace what is in it."""
    import stat

    try:
        st = os.stat(path)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise EffdepthError(
            f"the cache folder {path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); effdepth does "
            f"not trust records others can change: run `chmod go-w {path}` or set {CACHE_ENV} to a private folder"
        )


def file_hashes(path: Path) -> dict[str, str]:
    """The sha256 of every file of a local model (a folder's top-level files, or the file itself),
    by name. Each file is hashed in full once and again only when its size, inode or times change;
    the records live in effdepth's cache (``fingerprints/``), never in the model's folder."""
    path = Path(path).expanduser().resolve()
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    store = cache_dir() / "fingerprints" / f"{hashlib.sha256(str(path).encode()).hexdigest()[:32]}.json"
    try:
        records = read_json(store)
        records = records if isinstance(records, dict) else {}
    except (OSError, ValueError, EffdepthError):
        records = {}
    fresh = {}
    for file in files:
        target = file.resolve()  # a hub snapshot links its files to blobs: the content is the blob's
        state, record = check_file(target, records.get(file.name))
        fresh[file.name] = record if state == "verified" else file_record(target)
    if fresh != records:
        try:
            make_dirs(store.parent, 0o700)
            atomic_write_json(store, fresh)
        except (OSError, EffdepthError):  # a read-only cache: hashed again next time
            pass
    return {name: record["sha256"] for name, record in fresh.items()}


def model_files_digest(path: Path) -> str:
    """One sha256 over the names and sha256 of a local model's files: what identifies its weights
    in a run's key (a change to any file is another model)."""
    return hashlib.sha256(json.dumps(file_hashes(path), sort_keys=True).encode()).hexdigest()
