"""Encoded sizes of compressed ZeRO's block codecs
(docs/guides/compressed-zero.md "Codecs"): a run of m elements in blocks of
b elements is ceil(m / b) records of a 4-byte scale and b codes."""

BITS = {"int8": 8, "int4": 4, "sign": 1}


def run_bytes(codec: str, block: int, m: int) -> int:
    """R(m): encoded bytes of m elements."""
    return -(-m // block) * (4 + block * BITS[codec] // 8)


def gradient_piece_bytes(codec: str, block: int, m: int) -> int:
    """What one rank sends another for a reduce-scatter piece of m elements."""
    return 4 * m if codec == "none" else run_bytes(codec, block, m)


def parameter_chunk_bytes(codec: str, block: int, chunk: int, width: int) -> int:
    """What one rank sends another for an allgather chunk of `chunk`
    elements (`width` the parameters' own bytes when uncompressed)."""
    if codec == "none":
        return width * chunk
    if codec == "bf16":
        return 2 * chunk
    return run_bytes("int8", block, chunk)
