"""Datasets for training: sources of documents, tokenizers, the token cache, split, shards and batches.

- Sources: :func:`stdlib_corpus` (the embedded corpus, no download), :func:`open_source` for
  streaming "stdlib" / "text" / "jsonl" / "parquet" / "hf_disk" documents (:class:`DocumentSource`).
- Tokenizers: :func:`load_tokenizer` ("bytes", "bpe:N", or a local tokenizer file/directory),
  :class:`ByteTokenizer`, :class:`HFTokenizer`.
- :func:`build_token_cache`: documents tokenised once into a memory-mapped token file.
- :class:`DataConfig`, :func:`build_dataset` -> :class:`TokenDataset`: train/validation split,
  per-pipeline shards, deterministic ``(B, T + 1)`` batches.
"""

from geotrain.data.cache import TokenCache, build_token_cache, token_dtype
from geotrain.data.dataset import DataConfig, DatasetStats, TokenDataset, build_dataset, load_corpus
from geotrain.data.sources import (
    Corpus,
    DocumentSource,
    ReadStats,
    hf_corpus,
    open_source,
    stdlib_corpus,
    text_file_corpus,
)
from geotrain.data.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, load_tokenizer, train_bpe

__all__ = [
    "ByteTokenizer",
    "Corpus",
    "DataConfig",
    "DatasetStats",
    "DocumentSource",
    "HFTokenizer",
    "ReadStats",
    "TokenCache",
    "TokenDataset",
    "Tokenizer",
    "build_dataset",
    "build_token_cache",
    "hf_corpus",
    "load_corpus",
    "load_tokenizer",
    "open_source",
    "stdlib_corpus",
    "text_file_corpus",
    "token_dtype",
    "train_bpe",
]
