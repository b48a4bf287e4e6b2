"""Reading and writing source files without losing anything: encoding, newlines,
permissions; writes are atomic (temporary file + rename)."""

from __future__ import annotations

import io
import os
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SourceFile:
    text: str  # newlines exactly as in the file (CRLF kept)
    encoding: str


def read_source(path: Path) -> SourceFile:
    """Decode with the file's PEP 263 coding cookie (UTF-8 by default)."""
    raw = path.read_bytes()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    return SourceFile(text=raw.decode(encoding), encoding=encoding)


def write_atomic(path: Path, text: str, encoding: str = "utf-8") -> None:
    """Replace `path` with `text` in one rename, keeping its permission bits."""
    data = text.encode(encoding)
    mode = path.stat().st_mode & 0o7777 if path.exists() else None
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        if mode is not None:
            os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
