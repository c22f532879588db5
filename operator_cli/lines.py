"""Decode a byte stream (a pod's followed log, a replica's stdout) into text lines as they complete."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

__all__ = ["text_lines"]


def text_lines(chunks: Iterable[bytes], carriage_return_ends_line: bool = False) -> Iterator[str]:
    """Each complete line as soon as its newline arrives, then the unterminated rest; bad UTF-8 is
    replaced, never raised. With ``carriage_return_ends_line``, a progress bar's ``\\r`` updates
    become lines of their own instead of one endless line."""
    buf = b""
    for chunk in chunks:
        buf += chunk.replace(b"\r", b"\n") if carriage_return_ends_line else chunk
        *complete, buf = buf.split(b"\n")
        for line in complete:
            yield line.decode("utf-8", "replace")
    if buf:
        yield buf.decode("utf-8", "replace")
