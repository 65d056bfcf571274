"""Tiny Hugging Face model configs for tests, written to a directory as ``save_pretrained`` does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

VOCAB = 101
MAX_POSITIONS = 64


def tiny_config(family: str, *, vocab_size: int = VOCAB, layers: int = 3, **overrides: Any) -> Any:
    """A ``transformers`` config of ``family`` small enough to train in milliseconds (no dropout, fp32)."""
    import transformers

    decoder = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=vocab_size, max_position_embeddings=MAX_POSITIONS,
    )
    if family == "llama":
        cfg = transformers.LlamaConfig(**{**decoder, **overrides})
    elif family == "qwen2":  # small Qwen2 models tie the embedding and the head
        cfg = transformers.Qwen2Config(**{**decoder, "tie_word_embeddings": True, **overrides})
    elif family == "mistral":  # a window shorter than the test sequences, so the sliding mask matters
        cfg = transformers.MistralConfig(**{**decoder, "sliding_window": 8, **overrides})
    elif family == "gpt2":
        cfg = transformers.GPT2Config(**{
            "n_embd": 32, "n_layer": layers, "n_head": 4, "n_inner": 64, "vocab_size": vocab_size,
            "n_positions": MAX_POSITIONS, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "bos_token_id": 0, "eos_token_id": 0, **overrides,
        })
    else:
        raise ValueError(f"unknown family {family!r}")
    cfg.architectures = [_ARCHITECTURES[family]]
    return cfg


_ARCHITECTURES = {
    "llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM",
}


def write_config(directory: Path, family: str, **kwargs: Any) -> Path:
    """``tiny_config(family, **kwargs)`` saved into ``directory`` (created); returns the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    tiny_config(family, **kwargs).save_pretrained(str(directory))
    return directory


def reference_model(directory: Path, *, seed: int, attn: str = "sdpa") -> nn.Module:
    """The unsplit ``transformers`` model of ``directory``, built from ``seed`` as the block model is."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: nn.Module = AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    return model.float()
