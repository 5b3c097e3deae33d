"""What every framing decoder's tests share: feeding a decoder a stream in chunks, and the
chunkings the property tests try (split at given points, one byte at a time)."""

from __future__ import annotations

import itertools

from semhealth.collectors.frames import DecodeError, Decoder, Frame


def decode_all(decoder: Decoder, chunks: list[bytes]) -> tuple[list[Frame], list[DecodeError]]:
    """Every frame and error of ``chunks`` fed in order (chunk i arrives at t = i), then closed."""
    frames: list[Frame] = []
    for i, chunk in enumerate(chunks):
        frames += decoder.feed(chunk, i)
    frames += decoder.close(len(chunks))
    return frames, decoder.errors


def split_at(stream: bytes, points: list[int]) -> list[bytes]:
    bounds = [0, *sorted(set(points)), len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


def bytewise(stream: bytes) -> list[bytes]:
    return [stream[i : i + 1] for i in range(len(stream))]
