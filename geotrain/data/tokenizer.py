"""The byte-level tokenizer: a token is one UTF-8 byte, so the vocabulary is 256 and nothing is downloaded."""

from __future__ import annotations

import torch

__all__ = ["ByteTokenizer"]


class ByteTokenizer:
    """Text <-> byte tokens. Decoding replaces invalid UTF-8 (a cut mid-character) with U+FFFD."""

    vocab_size = 256

    def encode(self, text: str) -> torch.Tensor:
        """``(N,)`` uint8 tokens of the UTF-8 bytes of ``text``."""
        data = text.encode("utf-8")
        if not data:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def decode(self, tokens: torch.Tensor) -> str:
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) > 255):
            raise ValueError("byte tokens must lie in [0, 255]")
        return bytes(tokens.to(torch.uint8).tolist()).decode("utf-8", errors="replace")
