"""One compile-cache entry on disk: a readable header and a program spec, checksummed.

Layout (little endian):
    b"GXCACHE\\0" | u32 format | u64 n | header (JSON, n bytes) | u64 m | program spec (m bytes) | sha256
The header says what the entry was built for and how to bind it; the program spec
is what graphex._C.Executor loads (constants inline). The trailing SHA-256 covers
everything before it, so a truncated or corrupted file is detected before use.

Note [Cache files are written whole or not at all]
Writes go to a temporary file in the same directory, are flushed and fsynced, then
renamed over the target: readers see the old entry or the new one, never a mix,
and two processes writing the same entry leave one valid file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
from typing import Any

from .._atomic import write_atomic

MAGIC = b"GXCACHE\x00"
FORMAT_VERSION = 1
SUFFIX = ".gxc"


class EntryError(Exception):
    """A cache file that cannot be used: the message says why (truncated, corrupt, other version...)."""


@dataclasses.dataclass
class Entry:
    header: dict[str, Any]
    program: bytes


def encode_entry(entry: Entry) -> bytes:
    header = json.dumps(entry.header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    body = (MAGIC + struct.pack("<I", FORMAT_VERSION) + struct.pack("<Q", len(header)) + header
            + struct.pack("<Q", len(entry.program)) + entry.program)
    return body + hashlib.sha256(body).digest()


def decode_entry(data: bytes) -> Entry:
    if len(data) < len(MAGIC) + 4 or data[:len(MAGIC)] != MAGIC:
        raise EntryError("not a graphex cache file")
    (version,) = struct.unpack_from("<I", data, len(MAGIC))
    if version != FORMAT_VERSION:
        raise EntryError(f"cache format {version}, this graphex reads format {FORMAT_VERSION}")
    if len(data) < len(MAGIC) + 4 + 8 + 32:
        raise EntryError("truncated")
    body, digest = data[:-32], data[-32:]
    if hashlib.sha256(body).digest() != digest:
        raise EntryError("checksum mismatch (truncated or corrupted)")
    pos = len(MAGIC) + 4
    try:
        (n,) = struct.unpack_from("<Q", body, pos)
        pos += 8
        header = json.loads(body[pos:pos + n].decode("utf-8"))
        pos += n
        (m,) = struct.unpack_from("<Q", body, pos)
        pos += 8
        program = body[pos:pos + m]
    except (struct.error, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EntryError(f"malformed: {e}") from None
    if len(program) != m or pos + m != len(body) or not isinstance(header, dict):
        raise EntryError("malformed: lengths do not add up")
    return Entry(header, program)


def read_entry(path: str) -> Entry:
    try:
        with open(path, "rb") as f:
            return decode_entry(f.read())
    except OSError as e:
        raise EntryError(f"cannot read: {e.strerror}") from None


def read_header(path: str) -> dict[str, Any]:
    """Only the header (for `graphex cache ls`), still checksum-verified."""
    return read_entry(path).header


def write_entry(path: str, entry: Entry) -> None:
    """Atomically replace `path` with `entry` (Note [Cache files are written whole or not at all])."""
    write_atomic(path, encode_entry(entry), durable=True)
