"""``ResponseReader``: one HTTP/1.1 answer read from bytes as they arrive, pure (no I/O).

It reads what the API server sends: a status line, headers, then a body framed by
Content-Length, by chunked transfer coding, or by the end of the connection. Anything
else, or anything over its bounds, is a ``MalformedResponse`` naming what was wrong in one
line; the connection it came on is then dropped, never reused.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from scheduler.cluster.kube._http import ConnectionClosed, MalformedResponse

HEAD_LIMIT = 65536
"""A status line and headers longer than this, together, are refused."""
BODY_LIMIT = 1 << 30
"""A whole answer's body longer than this is refused (a streamed body is not bounded)."""
CHUNK_LINE_LIMIT = 4096
"""A chunk's size line (extensions included) or a trailer line longer than this is refused."""

_HEAD_END = b"\r\n\r\n"
# A header field as RFC 9110 writes it: a token, a colon, the value without control
# characters (tab allowed), spaces around it dropped.
_FIELD = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*((?:[^\x00-\x08\x0a-\x1f\x7f]*"
                    rb"[^\x00-\x20\x7f])?)[ \t]*")
_REASON = re.compile(rb"[^\x00-\x08\x0a-\x1f\x7f]*")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?")
_NO_BODY = (204, 304)
_SHOWN = 60  # bytes of a refused line quoted in the error

# The states of an answer, in the order they come.
_HEAD, _LENGTH, _CHUNK_SIZE_LINE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE, _DONE = (
    range(8))


def _quoted(line: bytes | bytearray) -> str:
    shown = repr(bytes(line[:_SHOWN]))
    return shown + ("..." if len(line) > _SHOWN else "")


def _line_end(buffer: bytearray, position: int, end: int, what: str) -> int:
    """Where the CRLF ending the line at ``position`` starts, or -1 while it has not come;
    raises ``MalformedResponse`` for a line longer than ``CHUNK_LINE_LIMIT``."""
    line_end = buffer.find(b"\r\n", position, position + CHUNK_LINE_LIMIT + 2)
    if line_end < 0 and end - position > CHUNK_LINE_LIMIT + 1:
        raise MalformedResponse(f"{what} runs over {CHUNK_LINE_LIMIT} bytes")
    return line_end


class ResponseReader:
    """One answer, fed the bytes that arrive (``feed``) and told when the connection
    ends (``eof``). Its body is collected (``body``) or, with ``stream``, handed on as it
    arrives when the status is under 400 (``on_open`` called first): a watch.

    ``keep_alive`` says, once it is ``done``, whether the connection may carry the next
    request: HTTP/1.1, no ``Connection: close``, framed by length or chunks, nothing sent
    after the answer.
    """

    __slots__ = ("_buffer", "_length", "_on_open", "_parts", "_received", "_sink", "_state",
                 "_stream", "_total", "keep_alive", "reason", "status")

    def __init__(self, stream: Callable[[bytes], None] | None = None,
                 on_open: Callable[[], None] | None = None) -> None:
        self._stream = stream
        self._on_open = on_open
        self._sink: Callable[[bytes], None] | None = None
        self._buffer = bytearray()
        self._parts: list[bytes] = []
        self._state = _HEAD
        self._length = 0  # bytes left of the body, or of the chunk
        self._total = 0  # bytes of body collected
        self._received = False
        self.status = 0
        self.reason = ""
        self.keep_alive = False

    @property
    def done(self) -> bool:
        return self._state == _DONE

    @property
    def received(self) -> bool:
        """Whether any byte of the answer has come."""
        return self._received

    def body(self) -> bytes:
        """The body collected (empty when it was streamed)."""
        return b"".join(self._parts)

    def feed(self, data: bytes) -> bool:
        """Read what arrived; whether the answer is whole. Raises ``MalformedResponse``,
        or what the stream's consumer raised."""
        if not data:
            return self._state == _DONE
        self._received = True
        if self._state == _DONE:  # bytes after the answer: the connection is out of step
            self.keep_alive = False
            return True
        buffer = self._buffer
        buffer += data
        position = 0
        end = len(buffer)
        try:
            while position < end:
                state = self._state
                if state in (_LENGTH, _CHUNK_DATA):
                    taken = min(self._length, end - position)
                    self._take(bytes(buffer[position:position + taken]))
                    position += taken
                    self._length -= taken
                    if self._length == 0:
                        self._state = _DONE if state == _LENGTH else _CHUNK_END
                elif state == _HEAD:
                    head_end = buffer.find(_HEAD_END, position)
                    if head_end < 0:
                        if end - position > HEAD_LIMIT:
                            raise MalformedResponse(
                                f"the answer's headers run over {HEAD_LIMIT} bytes")
                        break
                    if head_end - position > HEAD_LIMIT:
                        raise MalformedResponse(
                            f"the answer's headers run over {HEAD_LIMIT} bytes")
                    self._head(bytes(buffer[position:head_end]))
                    position = head_end + len(_HEAD_END)
                elif state == _CHUNK_SIZE_LINE:
                    line_end = _line_end(buffer, position, end, "a chunk size line")
                    if line_end < 0:
                        break
                    self._chunk_size(buffer[position:line_end])
                    position = line_end + 2
                elif state == _CHUNK_END:
                    if end - position < 2:
                        if buffer[position:end] != b"\r":
                            raise MalformedResponse("a chunk's data does not end with CRLF")
                        break
                    if buffer[position:position + 2] != b"\r\n":
                        raise MalformedResponse("a chunk's data does not end with CRLF")
                    position += 2
                    self._state = _CHUNK_SIZE_LINE
                elif state == _TRAILERS:
                    line_end = _line_end(buffer, position, end, "a trailer line")
                    if line_end < 0:
                        break
                    line = buffer[position:line_end]
                    position = line_end + 2
                    if not line:
                        self._state = _DONE
                    elif _FIELD.fullmatch(line) is None:
                        raise MalformedResponse(f"a malformed trailer line: {_quoted(line)}")
                elif state == _UNTIL_CLOSE:
                    self._take(bytes(buffer[position:end]))
                    position = end
                else:  # _DONE, with bytes left over
                    self.keep_alive = False
                    position = end
        finally:
            del buffer[:position]
        return self._state == _DONE

    def eof(self) -> bool:
        """The connection ended: whether the answer is whole then (a body framed by the
        connection's end). Raises ``ConnectionClosed`` for an answer cut short."""
        if self._state == _UNTIL_CLOSE:
            self._state = _DONE
        if self._state != _DONE:
            where = "in the middle of the answer" if self._received else "before any answer"
            raise ConnectionClosed(f"the API server closed the connection {where}")
        return True

    def _take(self, data: bytes) -> None:
        if self._sink is not None:
            self._sink(data)
            return
        self._total += len(data)
        if self._total > BODY_LIMIT:
            raise MalformedResponse(f"the answer's body runs over {BODY_LIMIT} bytes")
        self._parts.append(data)

    def _head(self, head: bytes) -> None:
        status_line, *lines = head.split(b"\r\n")
        version, _, rest = status_line.partition(b" ")
        code, _, reason = rest.partition(b" ")
        if (version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3
                or not code.isdigit() or code[0] == 0x30  # a status from 100 to 999
                or _REASON.fullmatch(reason) is None):
            raise MalformedResponse(f"a malformed status line: {_quoted(status_line)}")
        status = int(code)
        length: int | None = None
        chunked = False
        close = version != b"HTTP/1.1"
        for line in lines:
            field = _FIELD.fullmatch(line)
            if field is None:
                raise MalformedResponse(f"a malformed header line: {_quoted(line)}")
            name = field[1].lower()
            if name == b"content-length":
                value = field[2]
                if not value.isdigit() or len(value) > 18:
                    raise MalformedResponse(f"a malformed Content-Length: {_quoted(value)}")
                if length is not None and length != int(value):
                    raise MalformedResponse("two Content-Lengths that differ")
                length = int(value)
            elif name == b"transfer-encoding":
                codings = [coding.strip(b" \t").lower() for coding in field[2].split(b",")]
                # Only chunked is read: no other coding was asked for (no Accept-Encoding,
                # no TE), and one after chunked would leave the body's end unknown.
                if chunked or any(coding != b"chunked" for coding in codings):
                    raise MalformedResponse(
                        f"a transfer coding this client does not read: {_quoted(field[2])}")
                chunked = True
            elif name == b"connection":
                close = close or b"close" in field[2].lower()
        if status < 200:
            if status == 101:
                raise MalformedResponse("a protocol switch (101) nobody asked for")
            return  # an informational answer: the real one follows
        self.status = status
        self.reason = reason.decode("latin-1")
        self.keep_alive = not close
        if self._stream is not None and status < 400:
            if self._on_open is not None:
                self._on_open()
            self._sink = self._stream
        if status in _NO_BODY:
            self._state = _DONE
        elif chunked:
            # Framed twice: the length cannot be trusted, nor the connection after it.
            self.keep_alive = self.keep_alive and length is None
            self._state = _CHUNK_SIZE_LINE
        elif length is not None:
            if length > BODY_LIMIT and self._sink is None:
                raise MalformedResponse(f"the answer's body runs over {BODY_LIMIT} bytes")
            self._length = length
            self._state = _LENGTH if length else _DONE
        else:
            self.keep_alive = False
            self._state = _UNTIL_CLOSE

    def _chunk_size(self, line: bytearray) -> None:
        size = _CHUNK_SIZE.fullmatch(line)
        if size is None:
            raise MalformedResponse(f"a malformed chunk size line: {_quoted(line)}")
        self._length = int(size[1], 16)
        self._state = _CHUNK_DATA if self._length else _TRAILERS
