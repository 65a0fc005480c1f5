"""File helpers every layer may use (utils sits below all of them)."""

from __future__ import annotations

import os
import pathlib
import threading

TMP_MARK = ".tmp."      # in every temporary name `atomic_write_bytes` uses (readers may skip such files)


def _write_tmp(path: pathlib.Path, data: bytes) -> pathlib.Path:
    """`data` in a fsynced temporary next to `path` (the name is per process and thread: the weight
    publisher writes from a thread pool)."""
    tmp = path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}.{threading.get_ident()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return tmp


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """tmp file + fsync + rename: readers see the old file or the new one, never a torn one. The one
    atomic write of the repo (RL group / scheduler / weight stores, checkpoint manifests)."""
    path = pathlib.Path(path)
    os.replace(_write_tmp(path, data), path)


def atomic_create_bytes(path: str | os.PathLike, data: bytes) -> bool:
    """Like `atomic_write_bytes`, but never replaces an existing file: tmp + hard link (which fails
    if `path` exists, even under a concurrent writer). Returns whether this call created it. On a
    filesystem without hard links: check, then rename (racing writers: the last one wins)."""
    path = pathlib.Path(path)
    tmp = _write_tmp(path, data)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:                      # no hard links here (e.g. some FUSE mounts)
        if path.exists():
            return False
        os.replace(tmp, path)
        return True
    finally:
        tmp.unlink(missing_ok=True)


class UrlDir:
    """A flat directory addressed by a local path or an fsspec URL (``file://``, ``memory://``,
    ``s3://``, ``gs://`` with their fsspec packages installed): the async runtime's group and weight
    stores (docs/SPEC.md §4.1) on whatever storage every node of a cluster sees.

    `write` is atomic for readers: on a local filesystem `atomic_write_bytes` (tmp + rename); on an
    object store a single PUT is (an object appears whole or not at all), so writers commit by
    writing a pointer object last, as the weight publisher does with LATEST. `create` never replaces
    an existing name (write-once group files)."""

    def __init__(self, url: str | os.PathLike):
        from fsspec.core import url_to_fs  # noqa: PLC0415
        from fsspec.implementations.local import LocalFileSystem  # noqa: PLC0415

        self.url = str(url)
        self.fs, self.root = url_to_fs(self.url)
        self.root = self.root.rstrip("/") or "/"
        self.local = isinstance(self.fs, LocalFileSystem)
        self._made = False

    def __str__(self) -> str:
        return self.url

    @property
    def canonical(self) -> str:
        """The name two processes compare to know they address one store: a local directory's
        real absolute path (whatever the cwd or links), else the URL."""
        return os.path.realpath(self.root) if self.local else self.url.rstrip("/")

    def path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def exists(self, name: str) -> bool:
        return self.fs.exists(self.path(name))

    def read(self, name: str) -> bytes:
        return self.fs.cat_file(self.path(name))

    def write_dir(self) -> None:
        """Create the directory (once per instance; on an object store at most its bucket)."""
        if not self._made:
            self.fs.makedirs(self.root, exist_ok=True)
            self._made = True

    def write(self, name: str, data: bytes) -> None:
        self.write_dir()
        if self.local:
            atomic_write_bytes(self.path(name), data)
        else:
            self.fs.pipe_file(self.path(name), data)

    def create(self, name: str, data: bytes) -> bool:
        """Write `name` only if it does not exist; returns whether this call wrote it. Local: atomic
        even between concurrent writers (`atomic_create_bytes`); object store: check, then one PUT
        (two writers racing on one name both write, the last one wins)."""
        if self.local:
            self.write_dir()
            return atomic_create_bytes(self.path(name), data)
        if self.exists(name):
            return False
        self.write(name, data)
        return True

    def names(self) -> list[str]:
        """File names in the directory (temporaries of `atomic_write_bytes` included: callers match
        the names they own)."""
        try:
            found = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        return [p.rstrip("/").rsplit("/", 1)[-1] for p in found]

    def remove(self, name: str) -> None:
        """Delete `name` (absent already: nothing to do)."""
        try:
            self.fs.rm_file(self.path(name))
        except FileNotFoundError:
            pass


def url_dir(d: str | os.PathLike | UrlDir) -> UrlDir:
    return d if isinstance(d, UrlDir) else UrlDir(d)


def storage_protocols() -> list[str]:
    """fsspec protocols whose implementation imports here (for one-line config errors)."""
    from fsspec.registry import get_filesystem_class, known_implementations  # noqa: PLC0415

    ok = []
    for p in sorted(known_implementations):
        try:
            get_filesystem_class(p)
            ok.append(p)
        except (ImportError, ValueError):
            pass
    return ok
