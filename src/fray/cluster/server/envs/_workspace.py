"""A job's workspace as bytes: packed at submit, stored by the controller by content hash, unpacked once per worker.

The archive is a deterministic gzipped tar (sorted entries, no owners or times), so
the same directory always has the same digest and is uploaded and unpacked once.
Version-control data, virtual environments and caches are left out, and so is whatever the
directory's own ``.gitignore`` excludes (git's pattern rules, read with ``pathspec``): what git
would not commit is not shipped either.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
import threading
from pathlib import Path

import pathspec

from fray.core._private_files import private_dir
from fray.errors import ConfigError

__all__ = ["MAX_WORKSPACE_BYTES", "digest_of", "pack_workspace", "unpack_workspace", "workspace_files"]

#: The largest packed workspace a job may ship (keep data sets out of it: read them from storage).
MAX_WORKSPACE_BYTES = 256 << 20

_SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".venv",
        "venv",
        "__pycache__",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".tox",
        ".nox",
        "node_modules",
        ".ipynb_checkpoints",
    }
)
_SKIP_SUFFIXES = (".pyc", ".pyo")
_unpack_lock = threading.Lock()


def digest_of(data: bytes) -> str:
    """The content address of a packed workspace: ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def pack_workspace(directory: str, job_name: str) -> bytes:
    """Pack ``directory``; raises ConfigError saying what is wrong (not a directory, too big)."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise ConfigError(f"job {job_name!r}: workspace {directory!r} is not a directory")
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for path in workspace_files(root):
            info = tar.gettarinfo(str(path), arcname=path.relative_to(root).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if info.isfile():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
            if buffer.tell() > MAX_WORKSPACE_BYTES:
                raise ConfigError(
                    f"job {job_name!r}: workspace {directory!r} packs to more than {MAX_WORKSPACE_BYTES >> 20} MiB; "
                    "keep data and build outputs out of it (list them in its .gitignore; read data from shared "
                    "storage)"
                )
    return buffer.getvalue()


def workspace_files(root: Path) -> list[Path]:
    """The files (and symlinked directories) of ``root`` that a workspace ships, in archive order."""
    ignored = _ignore_spec(root)
    found: list[Path] = []
    for current, dirs, files in os.walk(root):
        base = Path(current)
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in _SKIP_DIRS
            and not d.endswith(".egg-info")
            and not ignored.match_file((base / d).relative_to(root).as_posix() + "/")
        )
        found.extend(base / d for d in dirs if (base / d).is_symlink())
        found.extend(
            base / f
            for f in sorted(files)
            if not f.endswith(_SKIP_SUFFIXES) and not ignored.match_file((base / f).relative_to(root).as_posix())
        )
    return found


def _ignore_spec(root: Path) -> pathspec.GitIgnoreSpec:
    """The patterns of ``root/.gitignore`` (none when there is no such file)."""
    try:
        lines = (root / ".gitignore").read_text(errors="replace").splitlines()
    except FileNotFoundError:
        lines = []
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _private_data(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
    """The ``data`` filter (no absolute paths, no escaping links), with files readable by their owner only."""
    member = tarfile.data_filter(member, path)
    if member.isfile() and member.mode is not None:
        return member.replace(mode=member.mode & 0o700, deep=False)
    return member


def unpack_workspace(data: bytes, digest: str, into: Path) -> Path:
    """Unpack a workspace under ``into`` once per digest (checked); return its directory."""
    if digest_of(data) != digest:
        raise ConfigError(f"workspace {digest} arrived corrupted (its content does not match its hash)")
    target = into / digest.replace(":", "-")
    with _unpack_lock:
        if target.is_dir():
            return target
        private_dir(into)
        staging = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=into))  # 0700
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                tar.extractall(staging, filter=_private_data)
            # Directories get the umask's mode: packed archives list none (tarfile makes them as
            # their files need them) and the data filter ignores the mode of those that are listed.
            for current, dirs, _ in os.walk(staging):
                for name in dirs:
                    if not os.path.islink(path := os.path.join(current, name)):
                        os.chmod(path, 0o700)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target
