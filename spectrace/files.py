"""How spectrace's folders and files are made: private modes, no followed links, durable renames (a leaf: the store's
segments, and the files a vLLM process writes itself, the shipper's loss ledger and the exposition files).

The store holds model paths, request ids and, with ``SPECTRACE_RECORD_TOKENS=1``, draft token ids.
Its folders are made ``0700`` and its files ``0600`` (``0750`` / ``0640`` with
``SPECTRACE_STORE_GROUP=1``: readable by the owner's group), whatever the umask. A segment's
temporary file is created with ``O_EXCL | O_NOFOLLOW`` (never through a planted link, never
over another file), its data is flushed to disk before the rename that makes it visible, and the
folder after it (``fsync``): a crash leaves either no file or a whole one, never a visible
zero-byte file. What this costs per flush is in BENCHMARKS.md ("Durable segments").
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO, Callable

PRIVATE = (0o700, 0o600)
GROUP = (0o750, 0o640)


def modes(group: bool) -> tuple[int, int]:
    """(folder mode, file mode) of the store: private, or readable by the owner's group."""
    return GROUP if group else PRIVATE


class UnsafeFolder(OSError):
    """A folder of the store this process must not write into: another user's, or not a folder."""


def owner(root: Path) -> int | None:
    """The uid owning the store at ``root`` (its files are that user's), or None when it is missing."""
    try:
        return os.stat(root).st_uid
    except OSError:
        return None


def make_folder(folder: Path, root: Path, mode: int, on_widened: Callable[[Path, int], None] | None = None) -> None:
    """Make ``folder`` and every missing folder from ``root`` down to it with ``mode``; check the ones that exist.

    An existing folder must be a folder (``root`` may be a link to one, the others not) owned by this
    process's user; one that is writable by group or others is made ``mode`` (``on_widened(path, old mode)``
    is told). Anything else raises :class:`UnsafeFolder`: its owner could plant, replace or remove segments."""
    root = Path(root)
    parts = Path(folder).relative_to(root).parts
    for path in [root, *(root.joinpath(*parts[: i + 1]) for i in range(len(parts)))]:
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            pass
        else:
            os.chmod(path, mode)  # the umask may have taken bits the mode asks for (group reading)
            continue
        info = os.stat(path) if path == root else os.lstat(path)
        if not stat.S_ISDIR(info.st_mode):
            raise UnsafeFolder(f"{path} is not a folder")
        if info.st_uid != os.geteuid():
            raise UnsafeFolder(f"{path} is owned by uid {info.st_uid}, not this user (uid {os.geteuid()}): refused")
        if info.st_mode & 0o022:
            os.chmod(path, mode)
            if on_widened is not None:
                on_widened(path, stat.S_IMODE(info.st_mode))


def create_exclusive(path: Path, mode: int) -> int:
    """A new file at ``path`` with ``mode``, open for writing: fails if anything is there already,
    a link included (``O_EXCL | O_NOFOLLOW``). Returns the descriptor (the caller closes it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)  # exactly ``mode``, whatever the umask
    except BaseException:
        os.close(fd)
        raise
    return fd


def sync_folder(folder: Path) -> None:
    """Make the renames and unlinks done in ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(tmp: Path, final: Path, mode: int, write: Callable[[BinaryIO], object], *, sync: bool = True) -> None:
    """Write the file ``final`` through the hidden temporary name ``tmp``, created here (``create_exclusive``: in a
    folder only this user can write): ``write(out)`` writes the content to ``out``, a file object over that
    descriptor (never a path opened again by name). With ``sync``, the data is on disk before the rename; the
    caller syncs the folder (``sync_folder``). On any error the temporary file is removed and the error raised."""
    fd = create_exclusive(tmp, mode)
    try:
        with os.fdopen(fd, "wb", closefd=False) as out:
            write(out)
        if sync:
            os.fsync(fd)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    finally:
        os.close(fd)
