"""One gzip member from texts compressed once and kept (``Deflated``) and texts compressed
as they come: whatever the mix and order, gunzip gives the texts one after the other, and
the CRC-32 combined from the pieces' own is the text's."""

from __future__ import annotations

import gzip
import zlib

from hypothesis import given
from hypothesis import strategies as st

from common.gzipstream import (
    DeflatedRun,
    GzipMember,
    crc32_combine,
    crc32_mover,
    crc32_shift,
    deflate_each,
)

# Repetitive texts (as exposition text is) and random ones, empty ones too.
TEXTS = st.one_of(st.binary(max_size=300),
                  st.builds(lambda word, count: word * count, st.binary(min_size=1, max_size=9),
                            st.integers(0, 5000)))


@given(st.binary(max_size=200), st.binary(max_size=200), st.integers(0, 3),
       st.sampled_from([0, 1, 100, 70_000]))
def test_crc32_combine_is_the_crc32_of_the_two_texts(first: bytes, second: bytes,
                                                      repeat: int, zeros: int) -> None:
    second = second * repeat + bytes(zeros)  # past the 64 KiB of zeros the shift reads too
    assert crc32_combine(zlib.crc32(first), zlib.crc32(second),
                         crc32_mover(len(second))) == zlib.crc32(first + second)


def test_the_shift_over_zeros_and_by_squares_agree() -> None:
    for length in (0, 1, 7, 65_536, 65_537, 1 << 20):
        by_zeros = (~zlib.crc32(bytes(length), 0x7FFFFFFF)) & 0xFFFFFFFF
        assert crc32_shift(length) == by_zeros


@given(st.lists(st.tuples(st.sampled_from(["kept", "plain", "run"]),
                          st.lists(TEXTS, min_size=1, max_size=3)), max_size=8),
       st.sampled_from([1, 3, 6]))
def test_one_member_of_kept_and_plain_texts_reads_as_the_texts(
        parts: list[tuple[str, list[bytes]]], level: int) -> None:
    member = GzipMember(level)
    body = [member.header()]
    expected = b""
    for how, texts in parts:
        expected += b"".join(texts)
        if how == "plain":
            body.extend(member.plain(text) for text in texts)
            continue
        pieces = deflate_each(texts, level)
        assert [piece.text() for piece in pieces] == texts
        if how == "run":
            run = DeflatedRun.of(tuple(pieces))
            assert run.text() == b"".join(texts)
            body.append(member.kept(run))
        else:
            body.extend(member.kept(piece) for piece in pieces)
    body.append(member.end())
    reader = zlib.decompressobj(16 + zlib.MAX_WBITS)
    assert reader.decompress(b"".join(body)) == expected
    assert reader.eof and not reader.unused_data  # one member, checked CRC and length
    assert gzip.decompress(b"".join(body)) == expected
