"""The cheap screen in front of the frame decoder: what it refuses, the decoder would refuse too."""

from __future__ import annotations

import pytest

from healer import errors
from healer.schemas import codec


@pytest.mark.parametrize(
    "data", [b"", b"   ", b"<html>", b"\x00\x01", b"x" * 10, b"a" * (codec.MAX_MESSAGE_BYTES + 1)]
)
def test_what_is_certainly_not_a_frame_is_refused_before_decoding_with_the_decoders_verdict(
    data: bytes,
) -> None:
    """The controller drops these as they are read, before they queue: the same reason the decoder gives."""
    early = codec.precheck_frame(data)
    assert early is not None
    with pytest.raises(errors.DecodeError) as late:
        codec.decode_frame_view(data)
    assert (early.kind, early.reason) == (late.value.kind, late.value.reason)


def test_anything_that_may_be_json_is_left_to_the_decoder() -> None:
    assert codec.precheck_frame(b"{not json") is None
    assert codec.precheck_frame(b' \n{"schema": 1}') is None
    assert codec.precheck_frame(b"[1]") is None
    assert codec.precheck_frame(b" " * 100 + b"{}") is None
