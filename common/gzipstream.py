"""One gzip member written from texts compressed once and kept, and texts compressed as they
come: a body that costs what changed, not what it holds.

A kept text is a ``Deflated``: raw deflate data that needs nothing written before it and
leaves nothing for what follows (its compressor starts empty and ends with a full flush, so
its last block is not the final one and ends on a byte). Such pieces placed one after the
other, with texts compressed between them, are one deflate stream; the gzip trailer's
CRC-32 of the whole text is combined from each piece's own, without reading the text again.

One member rather than one gzip member per piece: RFC 1952 allows several members in a
body, and Go's reader (Prometheus) reads them all, but curl 7.88's ``--compressed`` stops
after the first one (checked), which a person reading ``/metrics`` by hand would take for
the whole text.

Python 3.11's zlib has no ``crc32_combine``: it is written here, as arithmetic on
polynomials over GF(2). A CRC-32 is the remainder of the text's polynomial modulo the CRC
polynomial (with its conditioning), so appending ``n`` bytes to a text multiplies its CRC by
``x^(8n)`` modulo the polynomial before the appended text's own CRC is added (XOR). Each
piece keeps that factor, computed once when it is compressed: combining then costs one
multiplication a piece.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from dataclasses import dataclass
from typing import TypeAlias

RAW_DEFLATE = -zlib.MAX_WBITS
"""zlib's window bits for deflate data with neither header nor trailer."""

# The CRC-32 polynomial, reflected as zlib computes it: bit 31 holds the coefficient of
# x^0, bit 0 that of x^31, and this is x^32 modulo the polynomial.
_POLYNOMIAL = 0xEDB88320
_ONE = 1 << 31
"""The polynomial 1 (x^0) in the reflected form."""


def _product(left: int, right: int) -> int:
    """``left`` times ``right`` modulo the CRC polynomial (both reflected)."""
    product = 0
    while left:
        if left & _ONE:
            product ^= right
        left = (left << 1) & 0xFFFFFFFF  # the next coefficient of left, from x^0 up
        # right times x: one place towards x^31; what leaves x^31 comes back as x^32's rest
        right = (right >> 1) ^ _POLYNOMIAL if right & 1 else right >> 1
    return product


def _squares() -> tuple[int, ...]:
    """x^(2^k) modulo the polynomial, for k from 0 to 63 (lengths up to 2^61 bytes)."""
    powers = [_ONE >> 1]  # x
    for _ in range(63):
        powers.append(_product(powers[-1], powers[-1]))
    return tuple(powers)


_X_TO_TWO_TO_THE = _squares()


_ZEROS = bytes(1 << 16)


def crc32_shift(length: int) -> int:
    """The factor that moves a CRC-32 past ``length`` more bytes: x^(8 length) modulo the
    polynomial.

    Up to 64 KiB, zlib's CRC-32 of that many zero bytes gives it (a few microseconds, a
    third of the arithmetic below): over zeros, zlib's register, started at 1 (its input
    and output are complemented), is multiplied by x^8 a byte. Beyond, it is built from the
    squares, by the bits of 8 length."""
    if length <= len(_ZEROS):
        return ~zlib.crc32(memoryview(_ZEROS)[:length], ~_ONE & 0xFFFFFFFF) & 0xFFFFFFFF
    factor = _ONE
    bits = 8 * length
    power = 0
    while bits:
        if bits & 1:
            factor = _product(factor, _X_TO_TWO_TO_THE[power])
        bits >>= 1
        power += 1
    return factor


def _times_x(value: int) -> int:
    return (value >> 1) ^ _POLYNOMIAL if value & 1 else value >> 1


def _times_x4_of_low_nibble() -> tuple[int, ...]:
    """Per value of the 4 lowest bits of a polynomial (its terms x^28 to x^31), those
    terms times x^4, reduced."""
    table = []
    for low in range(16):
        product = low
        for _ in range(4):
            product = _times_x(product)
        table.append(product)
    return tuple(table)


_LOW_NIBBLE_TIMES_X4 = _times_x4_of_low_nibble()

Mover: TypeAlias = "array[int]"
"""A ``crc32_shift`` factor as a table of its products with the 16 polynomials of degree
below 4 (a nibble of a CRC, reflected: its bit 3 the lowest term): a CRC-32 moves past the
length with 8 look-ups, where multiplying bit by bit took 32 steps (1 us rather than 5)."""


def crc32_mover(length: int) -> Mover:
    """``crc32_shift(length)`` as a ``Mover``."""
    factor = crc32_shift(length)
    # The factor times 1, x, x^2 and x^3: the nibble's bits 3, 2, 1 and 0.
    by_bit = {8: factor, 4: _times_x(factor)}
    by_bit[2] = _times_x(by_bit[4])
    by_bit[1] = _times_x(by_bit[2])
    products = array("I", [0] * 16)
    for nibble in range(1, 16):
        lowest = nibble & -nibble
        products[nibble] = products[nibble ^ lowest] ^ by_bit[lowest]
    return products


def crc32_combine(first: int, second: int, second_mover: Mover) -> int:
    """The CRC-32 of a text followed by another, from their CRC-32s and the second's
    ``crc32_mover`` of its length: the first CRC times the factor, a nibble at a time
    from its highest term (Horner's rule: times x^4, plus the nibble times the factor),
    plus the second."""
    moved = second_mover[first & 15]
    for bits in (4, 8, 12, 16, 20, 24, 28):
        moved = ((moved >> 4) ^ _LOW_NIBBLE_TIMES_X4[moved & 15]
                 ^ second_mover[(first >> bits) & 15])
    return moved ^ second


@dataclass(frozen=True, slots=True, eq=False)
class Deflated:
    """A text compressed to stand anywhere in a deflate stream: its data, and its CRC-32,
    length and ``crc32_mover`` for the gzip trailer. Compared by identity."""

    data: bytes
    crc: int
    size: int
    mover: Mover
    """``crc32_mover(size)``."""

    def text(self) -> bytes:
        return inflate(self.data)


EMPTY = Deflated(b"", 0, 0, crc32_mover(0))


@dataclass(frozen=True, slots=True, eq=False)
class DeflatedRun:
    """``Deflated`` pieces one after the other, as one: their CRC-32s combined once, so that
    a run kept from one body to the next costs one combination, not one a piece."""

    pieces: tuple[Deflated, ...]
    crc: int
    size: int
    mover: Mover

    @classmethod
    def of(cls, pieces: tuple[Deflated, ...]) -> DeflatedRun:
        crc = size = 0
        for piece in pieces:
            if piece.size:
                crc = crc32_combine(crc, piece.crc, piece.mover)
                size += piece.size
        return cls(pieces, crc, size, crc32_mover(size))

    @property
    def data(self) -> bytes:
        return b"".join([piece.data for piece in self.pieces])

    def text(self) -> bytes:
        return inflate(self.data)


# One compressor a level and one decompressor for the process, each used for one whole
# piece at a time (after a full flush, a compressor refers to nothing it saw before, and a
# decompressor has written all it read): a compressor's state is about 256 KiB, not worth
# making for each block.
_COMPRESSORS: dict[int, zlib._Compress] = {}
_DECOMPRESSOR = zlib.decompressobj(RAW_DEFLATE)


def inflate(data: bytes) -> bytes:
    """The text of ``Deflated`` data (or of several, one after the other)."""
    return _DECOMPRESSOR.decompress(data)


def deflate_each(texts: list[bytes], level: int) -> list[Deflated]:
    """Each text compressed on its own (a compressor emptied by a full flush after each:
    what it writes after a full flush refers to nothing before)."""
    compressor = _COMPRESSORS.get(level)
    if compressor is None:
        compressor = _COMPRESSORS[level] = zlib.compressobj(level, zlib.DEFLATED, RAW_DEFLATE)
    pieces: list[Deflated] = []
    for text in texts:
        if not text:
            pieces.append(EMPTY)
            continue
        data = compressor.compress(text) + compressor.flush(zlib.Z_FULL_FLUSH)
        pieces.append(Deflated(data, zlib.crc32(text), len(text), crc32_mover(len(text))))
    return pieces


# The header of a member: gzip's magic, deflate, no flags, no time, no extra flags, the OS
# unknown (RFC 1952 2.3).
_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


class GzipMember:
    """One gzip member written as its texts come: ``plain`` ones compressed here (level
    ``level``), ``kept`` ones (``Deflated``) sent as they are. Each call returns the bytes to
    send next; ``header`` first, ``end`` last."""

    def __init__(self, level: int) -> None:
        self._compressor = zlib.compressobj(level, zlib.DEFLATED, RAW_DEFLATE)
        self._compressing = False
        self._crc = 0
        self._size = 0

    @staticmethod
    def header() -> bytes:
        return _HEADER

    def plain(self, text: bytes) -> bytes:
        if not text:
            return b""
        self._crc = zlib.crc32(text, self._crc)
        self._size += len(text)
        self._compressing = True
        return self._compressor.compress(text)

    def kept(self, piece: Deflated | DeflatedRun) -> bytes:
        """The bytes that end what was compressed here (a full flush, so that it refers to
        nothing after it) and ``piece``'s."""
        if not piece.size:
            return b""
        self._crc = crc32_combine(self._crc, piece.crc, piece.mover)
        self._size += piece.size
        if not self._compressing:
            return piece.data
        self._compressing = False
        return self._compressor.flush(zlib.Z_FULL_FLUSH) + piece.data

    def end(self) -> bytes:
        """The final deflate block and the trailer: the text's CRC-32 and length (modulo
        2^32)."""
        return (self._compressor.flush(zlib.Z_FINISH)
                + struct.pack("<II", self._crc, self._size & 0xFFFFFFFF))
