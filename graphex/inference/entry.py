"""One compile-cache entry on disk: a versioned header and the exported program, checksummed.

Layout (little endian):
    b"GXCACHE\\0" | u32 format | u64 n | header (JSON, n bytes) | u64 m | program (m bytes) | sha256
The program is byte for byte what graphex.export writes as program.gxp (typed bindings,
result leaves and tree, `info`; Note [One artifact for cache and deploy],
graphex/tools/inspecting.py); weights are never stored, they are bound by name. The header
is the cache's own: key parts, sources, custom ops fingerprints, created, compile seconds,
shape guards, plus the bindings in the form the Python loader reads. Its layout is
HEADER_SCHEMA (checked on read: Note [A cache header is schema'd]). The trailing SHA-256
covers everything before it, so a truncated or corrupted file is detected before use.

Note [Cache files are written whole or not at all]
Writes go to a temporary file in the same directory, are flushed and fsynced, then
renamed over the target: readers see the old entry or the new one, never a mix,
and two processes writing the same entry leave one valid file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import struct
from typing import Any

from ..base.atomic import write_atomic
from ..program import Binding, Leaf

MAGIC = b"GXCACHE\x00"
FORMAT_VERSION = 4  # 2: the program is the export artifact's; the header names HEADER_SCHEMA. 3: shape guards are
# checked from the program's typed guards only (Note [One binder]), so an entry of 2 may lack the ones it needs.
# 4: an entry of 3 may be a trace with side effects that nothing reads (Note [A trace with side effects is not
# cached]: Dynamo's report of them was asked for where it always came back empty), so none is trusted
HEADER_SCHEMA = "graphex.cache_header/3"  # 2: Dynamo's guards (dynamo_guards, guard_format); 3: typed Bindings
PROGRAM_IDENTIFIER = b"GXPG"  # csrc/schema/program.fbs: bytes 8-12 (after the size prefix and root offset)

# Note [A cache header is schema'd]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The header is JSON for `graphex cache ls` and people, but not free-form: it names its
# schema (HEADER_SCHEMA), and a header of another schema or missing one of these fields
# (or with a field of the wrong type) is an EntryError naming the field, before anything
# is bound or run. A new field is optional for readers; renaming or retyping one means a
# new HEADER_SCHEMA.
HEADER_FIELDS: dict[str, type | tuple[type, ...]] = {
    "header_schema": str, "key_parts": dict, "function": dict, "created": str, "signature": str,
    "inputs": list, "outputs": dict, "sources": list, "custom_ops": list, "num_ops": int,
    "graphex": str, "torch": str, "dynamo_guards": list, "guard_format": int,
}
SUFFIX = ".gxc"


class EntryError(Exception):
    """A cache file that cannot be used: the message says why (truncated, corrupt, other version...)."""


@dataclasses.dataclass
class Entry:
    header: dict[str, Any]
    program: bytes

    @property
    def bindings(self) -> list[Binding]:
        """Note [A program input is bound by one typed Binding]: where each program input comes from."""
        return [Binding.from_json(b) for b in self.header["inputs"]]

    @property
    def leaves(self) -> list[Leaf]:
        return [Leaf.from_json(leaf) for leaf in self.header["outputs"]["leaves"]]


def check_header(header: Any) -> None:
    """Note [A cache header is schema'd]: raises EntryError naming what is wrong."""
    if not isinstance(header, dict):
        raise EntryError("malformed: the header is not a JSON object")
    if header.get("header_schema") != HEADER_SCHEMA:
        raise EntryError(f"header schema {header.get('header_schema')!r}, this graphex reads {HEADER_SCHEMA!r}")
    for name, kind in HEADER_FIELDS.items():
        if not isinstance(header.get(name), kind):
            raise EntryError(f"malformed header: field {name!r} is missing or not a {getattr(kind, '__name__', kind)}")
    try:  # the bindings and leaves parse as written (Note [A program input is bound by one typed Binding])
        entry = Entry(header, b"")
        entry.bindings, entry.leaves  # noqa: B018
    except (ValueError, TypeError, KeyError) as e:
        raise EntryError(f"malformed header: {e}") from None


def encode_entry(entry: Entry) -> bytes:
    entry.header.setdefault("header_schema", HEADER_SCHEMA)
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
    check_header(header)
    if program[8:12] != PROGRAM_IDENTIFIER:
        raise EntryError("malformed: the entry's program is not a graphex program (no GXPG identifier)")
    return Entry(header, program)


def check_owned(path: str) -> None:
    """Note [A cache file is loaded only when it is the user's own]
    An entry's shape guards are a Python expression and its Dynamo guards become a generated check
    function (guards.py), so an entry is code. It is read only when the file and the directory it
    lies in belong to this user and nobody else can write them: a regular file (not a symlink, one link), owned
    by this process's user, not writable by group or others, in a directory with the same rules.
    Entries are written 0600 in a directory made 0700. Anything else is refused, naming why."""
    me = os.geteuid()
    for what, where in (("cache directory", os.path.dirname(os.path.abspath(path))), ("cache file", path)):
        try:
            st = os.lstat(where)
        except OSError as e:
            raise EntryError(f"cannot read: {e.strerror}") from None
        if what == "cache file" and not stat.S_ISREG(st.st_mode):
            raise EntryError("refused: not a regular file (a symlink or a device)")
        if what == "cache file" and st.st_nlink != 1:
            raise EntryError(f"refused: the cache file {where} has {st.st_nlink} hard links (it may be reached "
                             "through a directory others can write)")
        if st.st_uid != me:
            raise EntryError(f"refused: the {what} {where} belongs to uid {st.st_uid}, not to this user ({me}); "
                             "graphex loads only entries that are the user's own")
        if st.st_mode & 0o022:
            raise EntryError(f"refused: the {what} {where} is writable by group or others (mode "
                             f"{stat.S_IMODE(st.st_mode):o}); run `chmod go-w {where}` if it is yours")


def read_entry(path: str) -> Entry:
    check_owned(path)  # Note [A cache file is loaded only when it is the user's own]
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
    write_atomic(path, encode_entry(entry), durable=True, mode=0o600)
