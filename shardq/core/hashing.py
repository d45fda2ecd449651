"""Hash functions shared by the worker and the enqueue path.

Three functions, each for a stated reason:

* **Key → shard** is fixed for the life of a deployment: MurmurHash3 x86_32
  (seed 0, signed, as stored in ``shardq_job.key_hash``) of the key's
  *hashtag* — the part between the first ``{`` and the next ``}`` when that
  part is non-empty, the whole key otherwise (Redis Cluster's rule), so
  ``order:{42}:line:7`` and ``invoice:{42}`` share a shard. ``mmh3`` is a C
  extension, stable across versions and platforms.
* **Queue name → lane** of the worker's in-memory queue uses FNV-1a 32-bit,
  deliberately a different function from key → shard so the two failure
  domains (a hot shard, a hot lane) are staggered rather than aligned.
* **CRC16 key slot** (Redis Cluster's ``CRC16-XMODEM(key) mod 16384`` with the
  same hashtag rule) is offered for interoperability and diagnostics: a key's
  slot is what a Redis Cluster would compute for it.

Lane arithmetic (``lane_count``, ``lane_index``) lives here too: lanes are a
power of two so the lane of a hash is a mask, never a modulo.

Every str is hashed as its strict UTF-8 bytes, encoded here, never by
``mmh3`` itself: a str that has no UTF-8 form (a lone surrogate such as
``"\\ud800"``, which a JSON request body can decode to) raises
``UnicodeEncodeError`` (a ``ValueError``) before it reaches the C extension,
which crashes the process on one. For every encodable str the hash is the
same as before (``mmh3`` hashes a str as UTF-8).
"""

import mmh3

__all__ = [
    "FNV32_OFFSET",
    "FNV32_PRIME",
    "MAX_LANES",
    "SLOT_COUNT",
    "crc16_xmodem",
    "fnv1a_32",
    "hashtag",
    "key_slot",
    "lane_count",
    "lane_index",
    "murmur3_32",
    "shard_for",
    "shard_key_hash",
    "utf8",
]

FNV32_OFFSET = 0x811C9DC5
FNV32_PRIME = 0x01000193
SLOT_COUNT = 16384
MAX_LANES = 64


def hashtag(key: str) -> str:
    """The part of ``key`` that is hashed: ``{tag}`` contents when non-empty."""
    start = key.find("{")
    if start != -1:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def utf8(data: bytes | str) -> bytes:
    """``data`` as bytes: a str strictly as UTF-8 (``UnicodeEncodeError`` for a
    lone surrogate), bytes as they are."""
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"expected str or bytes, not {type(data).__name__}")


def murmur3_32(data: bytes | str, seed: int = 0, *, signed: bool = True) -> int:
    """MurmurHash3 x86_32 of ``data`` (str is hashed as strict UTF-8)."""
    return mmh3.hash(utf8(data), seed, signed=signed)


def shard_key_hash(key: str) -> int:
    """Signed 32-bit MurmurHash3 x86_32 of the key's hashtag (stored as int4)."""
    return mmh3.hash(utf8(hashtag(key)), 0, signed=True)


def salted_key_hash(key: str, salt: int) -> int:
    """The hash of sub-key ``salt`` of a hot key: its hashtag plus ``#salt``
    (so a salted ``{tag}`` key spreads too), hashed like ``shard_key_hash``."""
    return mmh3.hash(utf8(f"{hashtag(key)}#{salt}"), 0, signed=True)


def shard_for(key_hash: int, shard_count: int) -> int:
    """Shard of a key hash; ``shard_count`` is a power of two.

    A negative (signed) hash masks the same way as PostgreSQL's
    ``key_hash & (n - 1)`` on int4, so Python and SQL agree.
    """
    return key_hash & (shard_count - 1)


def fnv1a_32(data: bytes | str) -> int:
    """FNV-1a 32-bit (unsigned) of ``data``; str is hashed as UTF-8."""
    data = utf8(data)
    h = FNV32_OFFSET
    for byte in data:
        h = ((h ^ byte) * FNV32_PRIME) & 0xFFFFFFFF
    return h


def _crc16_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        crc = i << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table.append(crc & 0xFFFF)
    return tuple(table)


_CRC16_TABLE = _crc16_table()


def crc16_xmodem(data: bytes | str) -> int:
    """CRC16-XMODEM (poly 0x1021, init 0, no reflection) — Redis Cluster's CRC16."""
    data = utf8(data)
    crc = 0
    table = _CRC16_TABLE
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ table[((crc >> 8) ^ byte) & 0xFF]
    return crc


def key_slot(key: str | bytes) -> int:
    """Redis Cluster slot (0..16383) of ``key``, honouring ``{hashtag}``."""
    if isinstance(key, bytes):
        start = key.find(b"{")
        if start != -1:
            end = key.find(b"}", start + 1)
            if end > start + 1:
                key = key[start + 1 : end]
        return crc16_xmodem(key) & (SLOT_COUNT - 1)
    return crc16_xmodem(hashtag(key)) & (SLOT_COUNT - 1)


def lane_count(cpu_cores: int) -> int:
    """Lanes for a worker: the next power of two ≥ ``cpu_cores``, at most 64."""
    if cpu_cores < 1:
        raise ValueError(f"cpu_cores must be at least 1, got {cpu_cores!r}")
    return min(1 << (cpu_cores - 1).bit_length(), MAX_LANES)


def lane_index(hash_value: int, count: int) -> int:
    """Lane of ``hash_value`` among ``count`` lanes (a power of two)."""
    return hash_value & (count - 1)
