"""Files and directories that only their owner may read: 0600 files in 0700 directories, whatever the umask.

Everything Fray keeps under the user's home (``~/.config/fray``, ``~/.local/state/fray``,
a worker's directory) or a cluster's directory holds secrets or other users' job
data -- tokens, credentials, job payloads and failures, the controller's database --
so it is created private here rather than left to the umask of whoever runs Fray.
These functions never change the process's umask: they run in users' own programs too.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
import threading
from pathlib import Path

__all__ = ["open_private", "private_dir", "write_private"]

_DIR_MODE = 0o700
_FILE_MODE = 0o600


def private_dir(path: str | os.PathLike[str]) -> Path:
    """Make ``path`` a directory only its owner can enter (0700), creating it and its missing parents.

    Parents that exist already are left as they are (``~/.config`` is not Fray's); those
    created here are 0700, as XDG asks. ``path`` itself is Fray's own, so it is made
    0700 even if it existed with a wider mode (made by an older Fray, or by hand).
    """
    directory = Path(path)
    missing = list(itertools.takewhile(lambda p: not p.exists(), (directory, *directory.parents)))
    for parent in reversed(missing):
        try:
            os.mkdir(parent, _DIR_MODE)
        except FileExistsError:  # another process made it first
            continue
        # The umask could only have narrowed 0700, but a narrower one (0500) would lock us out.
        os.chmod(parent, _DIR_MODE)
    if not directory.is_dir():
        raise FileExistsError(errno.EEXIST, "exists and is not a directory", str(directory))
    os.chmod(directory, _DIR_MODE)
    return directory


def open_private(path: str | os.PathLike[str], flags: int = os.O_WRONLY | os.O_CREAT | os.O_APPEND) -> int:
    """``os.open(path, flags)`` for a file that is 0600 even if it existed wider; the caller closes the descriptor."""
    fd = os.open(path, flags, _FILE_MODE)
    try:
        os.fchmod(fd, _FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: str | os.PathLike[str], data: bytes | str, *, durable: bool = False) -> None:
    """Replace ``path`` with ``data`` atomically, as a 0600 file in its 0700 directory (made if missing).

    Readers see the old content or the new, never a part: ``data`` goes to a temporary
    file beside ``path`` that is renamed over it. ``durable`` fsyncs it first, so the
    new content survives a power loss once this returns.
    """
    target = Path(path)
    private_dir(target.parent)
    # One temporary name per process and thread: concurrent writers never share one.
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    content = data.encode() if isinstance(data, str) else data
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        try:
            _give_to_directory_owner(fd, target.parent)
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _give_to_directory_owner(fd: int, directory: Path) -> None:
    """A file root writes into another user's directory goes to that user, who must be able to read it.

    That is a task in a rootful container writing its failure into the task directory
    its worker bind-mounted: 0600 and owned by root, the worker could not read it.
    """
    if os.geteuid() != 0:
        return
    owner = os.stat(directory)
    if owner.st_uid != 0 and stat.S_ISDIR(owner.st_mode):
        os.fchown(fd, owner.st_uid, owner.st_gid)
