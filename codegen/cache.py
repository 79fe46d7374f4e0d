"""Disk cache of compiled artifacts (cubin, PTX, compiler log).

Keyed by a frozen ``CacheKey``; stored under ``$FLASHGEN_CACHE_DIR`` or ``~/.cache/flashgen``.

* Writes are atomic: a temporary file in the same directory, fsync'd, then ``os.replace``.  Two
  processes compiling the same kernel at once both write complete, identical entries; readers see
  either the old complete file or the new one, never a half-written one.
* Each entry carries a SHA-256 of its body.  A corrupt or truncated entry (or one written for a
  different key) is detected on read, removed, and reported as a miss: it is never returned.

File format (version 1)::

    b"FGCACHE1" | sha256(body) (32 bytes) | body
    body = u32 big-endian JSON length | JSON {"key": ..., "meta": ..., "blobs": [[name, size], ...]}
           | blob bytes, in the listed order
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping

__all__ = ["CacheKey", "CacheEntry", "DiskCache", "default_cache_dir", "source_sha256"]

MAGIC = b"FGCACHE1"
FORMAT_DIR = "v1"


def source_sha256(source: str | bytes) -> str:
    """Hex SHA-256 of a source text (UTF-8)."""
    if isinstance(source, str):
        source = source.encode("utf-8")
    return hashlib.sha256(source).hexdigest()


@dataclass(frozen=True)
class CacheKey:
    """What a compiled artifact depends on.

    ``options`` is the tuple of compiler options that affect the output, in order, without host
    paths (include directories are replaced by a marker naming the header versions), so different
    virtual environments with the same toolchain share entries.
    """

    source_sha256: str
    arch: str
    nvrtc_version: tuple[int, int]
    options: tuple[str, ...] = ()

    def __post_init__(self):
        if not (isinstance(self.source_sha256, str) and len(self.source_sha256) == 64):
            raise ValueError(f"source_sha256 must be 64 hex characters, got {self.source_sha256!r}")
        int(self.source_sha256, 16)
        if not isinstance(self.arch, str) or not self.arch:
            raise ValueError(f"arch must be a non-empty string, got {self.arch!r}")
        object.__setattr__(self, "nvrtc_version", tuple(int(v) for v in self.nvrtc_version))
        object.__setattr__(self, "options", tuple(str(o) for o in self.options))

    def to_json(self) -> dict:
        d = asdict(self)
        d["nvrtc_version"] = list(self.nvrtc_version)
        d["options"] = list(self.options)
        return d

    def digest(self) -> str:
        """Stable hex digest naming this key's file."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    key: CacheKey
    blobs: Mapping[str, bytes]
    meta: Mapping[str, object] = field(default_factory=dict)


def default_cache_dir() -> Path:
    env = os.environ.get("FLASHGEN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "flashgen"


class CorruptEntry(Exception):
    pass


def _encode(key: CacheKey, blobs: Mapping[str, bytes], meta: Mapping[str, object]) -> bytes:
    names = list(blobs)
    header = {
        "key": key.to_json(),
        "meta": dict(meta),
        "blobs": [[n, len(blobs[n])] for n in names],
    }
    hj = json.dumps(header, sort_keys=True).encode("utf-8")
    body = b"".join([struct.pack(">I", len(hj)), hj] + [bytes(blobs[n]) for n in names])
    return MAGIC + hashlib.sha256(body).digest() + body


def _decode(data: bytes) -> tuple[dict, dict[str, bytes]]:
    if len(data) < len(MAGIC) + 32 + 4 or not data.startswith(MAGIC):
        raise CorruptEntry("bad magic or too short")
    digest = data[len(MAGIC) : len(MAGIC) + 32]
    body = data[len(MAGIC) + 32 :]
    if hashlib.sha256(body).digest() != digest:
        raise CorruptEntry("checksum mismatch")
    (hlen,) = struct.unpack(">I", body[:4])
    try:
        header = json.loads(body[4 : 4 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptEntry(f"bad header: {e}") from e
    pos = 4 + hlen
    blobs: dict[str, bytes] = {}
    for name, size in header["blobs"]:
        blobs[name] = body[pos : pos + size]
        pos += size
    if pos != len(body):
        raise CorruptEntry("length mismatch")
    return header, blobs


class DiskCache:
    """A directory of cache entries; safe to share between processes."""

    def __init__(self, directory: str | os.PathLike | None = None):
        self.directory = Path(directory) if directory is not None else default_cache_dir()

    def path_for(self, key: CacheKey) -> Path:
        d = key.digest()
        return self.directory / FORMAT_DIR / d[:2] / f"{d}.fgc"

    def get(self, key: CacheKey) -> CacheEntry | None:
        """The entry for ``key``, or None on a miss.  A corrupt entry is removed and is a miss."""
        if not isinstance(key, CacheKey):
            raise TypeError(f"cache keys are CacheKey instances, got {type(key).__name__}")
        path = self.path_for(key)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError:
            return None
        try:
            header, blobs = _decode(data)
            if header.get("key") != key.to_json():
                raise CorruptEntry("entry was written for a different key")
        except (CorruptEntry, KeyError, TypeError, ValueError, struct.error):
            self._remove(path)
            return None
        return CacheEntry(key=key, blobs=blobs, meta=header.get("meta", {}))

    def put(self, key: CacheKey, blobs: Mapping[str, bytes], meta: Mapping[str, object] | None = None) -> Path:
        """Write an entry atomically (temp file + fsync + os.replace).  Returns its path."""
        if not isinstance(key, CacheKey):
            raise TypeError(f"cache keys are CacheKey instances, got {type(key).__name__}")
        path = self.path_for(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _encode(key, blobs, meta or {})
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            self._remove(Path(tmp))
            raise
        return path

    def remove(self, key: CacheKey) -> None:
        self._remove(self.path_for(key))

    def clear(self) -> int:
        """Remove every entry; returns how many files were removed."""
        n = 0
        root = self.directory / FORMAT_DIR
        if root.is_dir():
            for p in root.rglob("*.fgc"):
                self._remove(p)
                n += 1
        return n

    @staticmethod
    def _remove(path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError:
            pass
