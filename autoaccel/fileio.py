"""Reading and writing source files without losing anything: encoding, newlines,
permissions, owner; writes are atomic (temporary file + rename).

Only regular files are read or replaced: a FIFO blocks a reader forever and a device
such as /dev/zero never ends, and renaming over either would replace the node itself.
A symbolic link is written through (the file it points to is replaced, as Black and
Ruff do), and a file that changed since it was read is left alone: the edit made
meanwhile would otherwise be lost.
"""

from __future__ import annotations

import io
import os
import re
import stat
import tokenize
from dataclasses import dataclass
from pathlib import Path

# A source file larger than this is no hand-written training script. Lint time and
# memory grow linearly with the size, ~8 CPU-s and ~650 MB per MiB of dense training
# code (benchmarks/results/lint_scaling.md): 32 MiB would take minutes and 20 GB.
MAX_SOURCE_BYTES = 2**20
# Any other file read whole (a notebook, with its outputs).
MAX_FILE_BYTES = 32 * 2**20


class FileRefused(OSError):
    """A file autoaccel will not read or replace; the message says why."""


@dataclass(frozen=True)
class SourceFile:
    text: str  # newlines exactly as in the file (CRLF kept)
    encoding: str
    raw: bytes  # the bytes read: a write checks that the file still holds them


def os_error_message(error: OSError) -> str:
    """`error` without Python's `[Errno N]` prefix and file name."""
    return error.strerror or str(error)


def real_path(path: Path) -> Path:
    """`path` with its symbolic links resolved; a link loop stays as it is (where
    `Path.resolve` raises), for the read or write that follows to report."""
    return Path(os.path.realpath(path))


def file_kind(mode: int) -> str:
    """What the file of `mode` is when it is not a regular file ("a FIFO"), for messages."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_bytes(path: Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them.
    Raises `FileRefused` for anything else (a FIFO is opened without blocking)."""
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise FileRefused(f"is {file_kind(mode)}; only regular files are read")
        with os.fdopen(descriptor, "rb", closefd=False) as stream:
            data = stream.read(limit + 1)
            if len(data) > limit:
                size = max(os.fstat(descriptor).st_size, len(data))
                raise FileRefused(f"larger than {mebibytes(limit)} ({mebibytes(size)}); not read")
    finally:
        os.close(descriptor)
    return data


def mebibytes(size: int) -> str:
    """`size` bytes as a limit is written: "1 MiB", "0.5 MiB", "30.2 MiB"."""
    return f"{size / 2**20:.3g} MiB"


def read_source(path: Path, limit: int = MAX_SOURCE_BYTES) -> SourceFile:
    """Decode with the file's PEP 263 coding cookie (UTF-8 by default); a file of more
    than `limit` bytes is refused (`FileRefused`)."""
    raw = read_bytes(path, limit)
    encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    return SourceFile(text=raw.decode(encoding), encoding=encoding, raw=raw)


def write_atomic(
    path: Path, text: str, encoding: str = "utf-8", original: bytes | None = None
) -> None:
    """Replace the file at `path` (through a symbolic link: the file it names) with
    `text` in one rename, keeping its permission bits and owner. `original`: the bytes
    `text` was made from; nothing is written when the file no longer holds them.
    Raises `FileRefused` for a target that is not a regular file, is read-only or
    belongs to another user, and `OSError` when the folder cannot be written."""
    write_all_atomic([(path, text, encoding, original)])


Replacement = tuple[Path, str, str, "bytes | None"]  # path, text, encoding, original


def write_all_atomic(replacements: list[Replacement]) -> None:
    """`write_atomic` for several files, all or none: every new file is written beside
    its target and every target checked before the first rename. Raises as
    `write_atomic` does (then nothing was replaced), with `error.path` the file at fault."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, text, encoding, original in replacements:
            try:
                staged.append((_stage(real_path(path), text, encoding, original), real_path(path)))
            except OSError as error:
                error.path = path  # type: ignore[attr-defined]
                raise
        for temporary, target in staged:
            os.replace(temporary, target)
    except BaseException:
        for temporary, _ in staged:
            if os.path.exists(temporary):
                os.unlink(temporary)
        raise


def _stage(target: Path, text: str, encoding: str, original: bytes | None) -> str:
    """The new contents of `target` in a temporary file beside it (mode and owner of the
    file it replaces); the caller renames it over `target` or removes it."""
    try:
        existing = os.stat(target)
    except FileNotFoundError:
        existing = None
    if existing is None and original is not None:
        raise FileRefused("was removed while autoaccel worked on it; nothing written")
    if existing is not None:
        _check_replaceable(target, existing)
    if not target.parent.is_dir():
        raise FileRefused(f"no such folder: {target.parent}")
    import tempfile  # only writes need it (~2 ms of a lint run's start-up)

    handle, temporary = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".tmp", dir=target.parent
    )
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(text.encode(encoding))
        if existing is not None:
            os.chmod(temporary, stat.S_IMODE(existing.st_mode))
            _keep_owner(temporary, existing)
        else:  # a new file gets the mode `open()` would give it, not mkstemp's 0600
            os.chmod(temporary, 0o666 & ~_umask())
        if original is not None and not _holds(target, original):
            raise FileRefused("changed while autoaccel worked on it; nothing written (run again)")
    except BaseException:
        os.unlink(temporary)
        raise
    return temporary


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _check_replaceable(target: Path, existing: os.stat_result) -> None:
    if not stat.S_ISREG(existing.st_mode):
        raise FileRefused(f"is {file_kind(existing.st_mode)}; only regular files are replaced")
    mode = stat.S_IMODE(existing.st_mode)
    # Root may write anything, so the mode bits decide as well as access(2).
    if not mode & 0o222:
        raise FileRefused(f"is read-only (mode {mode:04o}); not replaced")
    if not os.access(target, os.W_OK):
        raise FileRefused(f"may not be written (mode {mode:04o}, or immutable); not replaced")


def _keep_owner(temporary: str, existing: os.stat_result) -> None:
    """Give the new file the old one's owner, or refuse: renaming a file we may not
    chown over another user's would hand it to us."""
    if not hasattr(os, "geteuid") or existing.st_uid == os.geteuid():
        return
    try:
        os.chown(temporary, existing.st_uid, existing.st_gid)
    except PermissionError:
        raise FileRefused(
            f"belongs to another user (uid {existing.st_uid}); replacing it would change its owner"
        ) from None


def _holds(target: Path, original: bytes) -> bool:
    with open(target, "rb") as stream:
        return stream.read(len(original) + 1) == original


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")
_NEWLINE = re.compile(r"\r\n?|\n")


def source_lines(text: str, keepends: bool = False) -> list[str]:
    """The lines of a source text as Python counts them: `\\n`, `\\r\\n` and `\\r`
    end a line; a form feed or `\\u2028` does not (`str.splitlines` splits there)."""
    lines = _LINE.findall(text)
    return lines if keepends else [line.rstrip("\r\n") for line in lines]


def line_starts(text: str) -> list[int]:
    """The offset where each line of `text` starts."""
    return [0, *(match.end() for match in _NEWLINE.finditer(text))]
