"""Datasets for training: the embedded default corpus, local text, optional Hugging Face data.

- :func:`stdlib_corpus`: the embedded corpus (the interpreter's standard-library source), no download.
- :class:`ByteTokenizer`: byte-level tokens, vocabulary 256.
- :class:`DataConfig`, :func:`build_dataset` -> :class:`TokenDataset`: train/validation split,
  per-pipeline shards, deterministic ``(B, T + 1)`` batches.
"""

from geotrain.data.dataset import DataConfig, TokenDataset, build_dataset, load_corpus
from geotrain.data.sources import Corpus, hf_corpus, stdlib_corpus, text_file_corpus
from geotrain.data.tokenizer import ByteTokenizer

__all__ = [
    "ByteTokenizer",
    "Corpus",
    "DataConfig",
    "TokenDataset",
    "build_dataset",
    "hf_corpus",
    "load_corpus",
    "stdlib_corpus",
    "text_file_corpus",
]
