"""dsopt's state blobs section by section (the layout of
src/state/blob.hpp: magic, format version, size, the header, named
sections, a CRC-32 of everything before it), for state dicts that keep
part of a blob elsewhere (``_fsdp_state``): a blob's sections by name, and
the same blob with some sections' bytes replaced (by name; their sizes
may differ, the checksum is made again). The contents stay dsopt's to check when
the blob is loaded. ``section_kind`` says what a section holds
(test_fsdp2.py checks that every algorithm's sections are among those it
knows).
"""

import struct
import zlib

from ..errors import CorruptState, Mismatch

MAGIC = b"DSOPTST\0"
_VERSION = 1


class Blob:
    """A parsed blob: ``header`` (the bytes from the algorithm's name to the
    parameters, as written), ``sections`` (name -> bytes, in order)."""

    def __init__(self, data):
        data = bytes(data)
        if data[:8] != MAGIC or len(data) < 28:
            raise CorruptState("dsopt state blob: wrong magic or truncated")
        version, _, total = struct.unpack_from("<IIQ", data, 8)
        if version != _VERSION or total != len(data):
            raise CorruptState(f"dsopt state blob: format {version}, {total} bytes; expected format "
                          f"{_VERSION}, {len(data)} bytes")
        if zlib.crc32(data[:-4]) != struct.unpack_from("<I", data, len(data) - 4)[0]:
            raise CorruptState("dsopt state blob: bad checksum")
        pos = 24
        (n,) = struct.unpack_from("<I", data, pos)
        pos += 4 + n + 8  # the algorithm's name, world size and rank
        (count,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + 16 * count
        self.header = data[24:pos]
        (nsections,) = struct.unpack_from("<I", data, pos)
        pos += 4
        self.sections = {}
        for _ in range(nsections):
            (n,) = struct.unpack_from("<I", data, pos)
            name = data[pos + 4:pos + 4 + n].decode()
            (size,) = struct.unpack_from("<Q", data, pos + 4 + n)
            pos += 4 + n + 8
            self.sections[name] = data[pos:pos + size]
            pos += size
        if pos != len(data) - 4:
            raise CorruptState("dsopt state blob: sections do not end at the checksum")

    def replaced(self, sections) -> bytes:
        """The blob with the sections ``sections`` (name -> bytes) in place
        of its own of those names (their sizes may differ: a 1-bit
        optimizer's errors exist from its compression stage on; dsopt checks
        them against the rest when it loads the blob); Mismatch when one is
        not among them."""
        for name in sections:
            if name not in self.sections:
                raise Mismatch(f"state section {name!r} was saved, and this optimizer has none "
                               f"(another algorithm or config)")
        body = [self.header, struct.pack("<I", len(self.sections))]
        for name, data in self.sections.items():
            data = sections.get(name, data)
            raw = name.encode()
            body += [struct.pack("<I", len(raw)), raw, struct.pack("<Q", len(data)), data]
        body = b"".join(body)
        total = 24 + len(body) + 4
        head = MAGIC + struct.pack("<IIQ", _VERSION, 0, total)
        blob = head + body
        return blob + struct.pack("<I", zlib.crc32(blob))


def pack_sections(sections) -> bytes:
    """Named byte strings as one byte string (``unpack_sections``'s)."""
    out = [struct.pack("<I", len(sections))]
    for name, data in sections.items():
        raw = name.encode()
        out += [struct.pack("<I", len(raw)), raw, struct.pack("<Q", len(data)), bytes(data)]
    return b"".join(out)


def unpack_sections(data) -> dict:
    data = bytes(data)
    (count,) = struct.unpack_from("<I", data, 0)
    pos, sections = 4, {}
    for _ in range(count):
        (n,) = struct.unpack_from("<I", data, pos)
        name = data[pos + 4:pos + 4 + n].decode()
        (size,) = struct.unpack_from("<Q", data, pos + 4 + n)
        pos += 4 + n + 8
        sections[name] = data[pos:pos + size]
        pos += size
    return sections


# dsopt's blob sections (src/state/) by what they hold: every rank's own
# (rank-local), per element and reached through state views, or the same on
# every rank (everything else: "common", the 1-bit optimizers' record of the
# topology their errors belong to included).
_RANK_LOCAL = (".worker_error", ".server_error", ".momentum_tail", ".accumulator", ".anchor")
_PER_ELEMENT = (".exp_avg", ".exp_avg_sq", ".momentum_buffer", ".exp_avg_sq_fresh", ".masters")


def section_kind(name):
    """"rank_local", "per_element" or "common" (see above)."""
    if name.endswith(_RANK_LOCAL):
        return "rank_local"
    if name.endswith(_PER_ELEMENT):
        return "per_element"
    return "common"
