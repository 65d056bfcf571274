"""Tokenizers: text <-> token ids, behind one small interface, chosen by a spec string.

What is a *tokenizer spec*? The string in ``data.tokenizer`` that says which tokenizer a job uses:

- ``"bytes"``: :class:`ByteTokenizer`, one token per UTF-8 byte, vocabulary 256, no EOS.
- ``"PATH"``: a ``tokenizer.json`` file, or a local directory holding tokenizer files
  (``tokenizer.json`` first, else whatever ``transformers.AutoTokenizer`` loads offline).
- ``"bpe:N"``: a byte-level BPE of vocabulary ``N`` trained on the job's own documents, with
  ``<|endoftext|>`` as EOS. Training is deterministic (same documents -> the same
  ``tokenizer.json`` bytes) and cached on disk by (source digest, N), so every peer builds or
  reuses the same one.

What is a tokenizer's *digest*? sha256 of what defines it exactly (its ``tokenizer.json``
serialisation and EOS token): two peers with equal digests turn the same text into the same ids.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from geotrain.data.disk import build_lock, write_atomic
from geotrain.errors import ConfigError

__all__ = [
    "EOS_CANDIDATES",
    "BPE_EOS",
    "ByteTokenizer",
    "HFTokenizer",
    "Tokenizer",
    "default_cache_dir",
    "load_tokenizer",
    "train_bpe",
]

logger = logging.getLogger(__name__)

#: tokens taken as end-of-sequence when a tokenizer's config names none, in this order
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "<|im_end|>")
#: the EOS token of ``bpe:N`` tokenizers
BPE_EOS = "<|endoftext|>"
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")
_BPE_FORMAT = "geotrain-bpe-v1"  # bump when training settings change: old cached tokenizers are not reused


def default_cache_dir() -> Path:
    """``~/.cache/geotrain``: where tokenizers (``tokenizers/``) and token files (``tokens/``) are cached."""
    return Path.home() / ".cache" / "geotrain"


@runtime_checkable
class Tokenizer(Protocol):
    """What the data layer, the model and export need from a tokenizer.

    ``encode`` adds no special tokens (the token cache puts ``eos_id`` between documents);
    ``save(directory)`` writes files ``transformers.AutoTokenizer.from_pretrained(directory)``
    loads and returns True, or returns False when the tokenizer has nothing to write.
    """

    @property
    def name(self) -> str: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def eos_id(self) -> int | None: ...
    @property
    def digest(self) -> str: ...
    def encode(self, text: str) -> Any: ...
    def encode_batch(self, texts: Sequence[str]) -> list[Any]: ...
    def decode(self, ids: Any) -> str: ...
    def save(self, directory: str | Path) -> bool: ...


def _ids_list(ids: Any) -> list[int]:
    if isinstance(ids, torch.Tensor):
        return [int(i) for i in ids.reshape(-1).tolist()]
    if isinstance(ids, np.ndarray):
        return [int(i) for i in ids.reshape(-1).tolist()]
    return [int(i) for i in ids]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, the alphabet of byte-level BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


class ByteTokenizer:
    """Text <-> byte tokens (vocabulary 256, no EOS). Decoding replaces invalid UTF-8 (a cut mid-character) with U+FFFD.

    ``save`` writes an equivalent byte-level ``tokenizer.json`` whose id ``b`` is byte ``b``, so an
    exported byte-level model is loadable with ``transformers`` too.
    """

    name = "bytes"
    vocab_size = 256
    eos_id: int | None = None
    digest = hashlib.sha256(b"geotrain-bytes-v1").hexdigest()

    def encode(self, text: str) -> torch.Tensor:
        """``(N,)`` uint8 tokens of the UTF-8 bytes of ``text``."""
        data = text.encode("utf-8")
        if not data:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, tokens: Any) -> str:
        if isinstance(tokens, torch.Tensor):
            if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) > 255):
                raise ValueError("byte tokens must lie in [0, 255]")
            return bytes(tokens.to(torch.uint8).tolist()).decode("utf-8", errors="replace")
        ids = _ids_list(tokens)
        if any(not 0 <= i <= 255 for i in ids):
            raise ValueError("byte tokens must lie in [0, 255]")
        return bytes(ids).decode("utf-8", errors="replace")

    def backend(self) -> Any:
        """The same tokenizer as a ``tokenizers.Tokenizer`` (ByteLevel, no merges, id = byte value)."""
        from tokenizers import Tokenizer as _Tok
        from tokenizers import decoders, models, pre_tokenizers

        vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
        tok = _Tok(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        return tok

    def save(self, directory: str | Path) -> bool:
        _save_tokenizer_files(self.backend(), Path(directory), {})
        return True

    def __repr__(self) -> str:
        return "ByteTokenizer()"


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` (from a ``tokenizer.json``, a directory, or ``bpe:N`` training).

    ``special`` holds the special tokens (``bos_token``, ``eos_token``, ...) as strings, written
    back by :meth:`save`. ``eos_id`` is None when the tokenizer has no EOS token: documents are
    then joined without a separator.
    """

    def __init__(self, backend: Any, *, name: str, special: dict[str, str] | None = None) -> None:
        self._tok = backend
        self._name = name
        self.special: dict[str, str] = dict(special or {})
        eos = self.special.get("eos_token")
        if eos is None:
            eos = next((c for c in EOS_CANDIDATES if backend.token_to_id(c) is not None), None)
            if eos is not None:
                self.special["eos_token"] = eos
        self._eos_id: int | None = None if eos is None else backend.token_to_id(eos)
        if eos is not None and self._eos_id is None:
            raise ConfigError(f"tokenizer {name!r}: its eos_token {eos!r} is not in its vocabulary")
        if self._eos_id is None:
            logger.warning("tokenizer %s has no EOS token; documents are joined without one", name)
        # one past the largest id, not the entry count: a vocabulary with gaps still fits the embedding
        ids = backend.get_vocab(with_added_tokens=True).values()
        self._vocab_size = max(ids, default=-1) + 1
        canonical = json.dumps({"tokenizer": backend.to_str(), "special": self.special}, sort_keys=True)
        self._digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    @property
    def name(self) -> str:
        return self._name

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eos_id(self) -> int | None:
        return self._eos_id

    @property
    def digest(self) -> str:
        return self._digest

    @property
    def backend(self) -> Any:
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._tok

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Any) -> str:
        return str(self._tok.decode(_ids_list(ids), skip_special_tokens=False))

    def save(self, directory: str | Path) -> bool:
        _save_tokenizer_files(self._tok, Path(directory), self.special)
        return True

    def __repr__(self) -> str:
        return f"HFTokenizer({self._name!r}, vocab_size={self._vocab_size}, eos_id={self._eos_id})"


def _save_tokenizer_files(backend: Any, directory: Path, special: dict[str, str]) -> None:
    """``tokenizer.json`` + ``tokenizer_config.json`` + ``special_tokens_map.json`` in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    backend.save(str(directory / "tokenizer.json"))
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", **special}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2, sort_keys=True) + "\n")


def _special_from_config(directory: Path) -> dict[str, str]:
    """Special tokens named in ``tokenizer_config.json`` / ``special_tokens_map.json`` (strings or {content})."""
    out: dict[str, str] = {}
    for fname in ("special_tokens_map.json", "tokenizer_config.json"):  # the config wins
        f = directory / fname
        if not f.is_file():
            continue
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(f"tokenizer file {str(f)!r} is not readable JSON: {e}") from e
        if not isinstance(data, dict):
            raise ConfigError(f"tokenizer file {str(f)!r} is not a JSON object")
        for key in _SPECIAL_KEYS:
            value = data.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                out[key] = value
    return out


def _from_file(path: Path, special: dict[str, str], name: str) -> HFTokenizer:
    from tokenizers import Tokenizer as _Tok

    try:
        backend = _Tok.from_file(str(path))
    except Exception as e:  # tokenizers raises plain Exception subclasses for unreadable/invalid files
        raise ConfigError(f"tokenizer file {str(path)!r} could not be read: {e}") from e
    return HFTokenizer(backend, name=name, special=special)


def _from_directory(path: Path, name: str) -> HFTokenizer:
    special = _special_from_config(path)
    if (path / "tokenizer.json").is_file():
        return _from_file(path / "tokenizer.json", special, name)
    try:
        from transformers import AutoTokenizer

        auto = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # transformers raises many types (OSError, ValueError, ...) for "not loadable"
        raise ConfigError(
            f"directory {str(path)!r} holds no tokenizer transformers can load offline: {e}"
        ) from e
    backend = getattr(auto, "backend_tokenizer", None)
    if backend is None:
        raise ConfigError(f"tokenizer in {str(path)!r} is not a fast (tokenizers-backed) tokenizer")
    for key in _SPECIAL_KEYS:
        value = getattr(auto, key, None)
        if isinstance(value, str) and key not in special:
            special[key] = value
    return HFTokenizer(backend, name=name, special=special)


def train_bpe(texts: Iterable[str], vocab_size: int) -> HFTokenizer:
    """A byte-level BPE of ``vocab_size`` ids (``<|endoftext|>`` is id 0) trained on ``texts``, deterministically.

    The trainer's result depends only on the word counts of ``texts`` (ties between equally
    frequent pairs are broken by pair id, ids by sorted alphabet), not on thread scheduling; the
    tests train twice and compare bytes.
    """
    from tokenizers import Tokenizer as _Tok
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = _Tok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BPE_EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return HFTokenizer(tok, name=f"bpe:{vocab_size}", special={"eos_token": BPE_EOS})


def _bpe_cached(
    vocab_size: int,
    *,
    documents: Callable[[], Iterator[str]] | None,
    source_digest: str | None,
    cache_dir: Path | None,
) -> HFTokenizer:
    if documents is None or source_digest is None:
        raise ConfigError(
            f"tokenizer 'bpe:{vocab_size}' is trained on the job's data; it needs documents and their digest"
        )
    key = hashlib.sha256(f"{_BPE_FORMAT}:{source_digest}:{vocab_size}".encode()).hexdigest()[:32]
    folder = (cache_dir or default_cache_dir() / "tokenizers") / f"bpe-{vocab_size}-{key}"
    path = folder / "tokenizer.json"
    name = f"bpe:{vocab_size}"
    tok = _cached_bpe(path, vocab_size)
    if tok is None:
        folder.mkdir(parents=True, exist_ok=True)
        with build_lock(path):
            tok = _cached_bpe(path, vocab_size)  # trained while we waited?
            if tok is None:
                logger.info("tokenizer %s: training on the job's documents", name)
                tok = train_bpe(documents(), vocab_size)
                write_atomic(path, tok.backend.to_str().encode("utf-8"))
                return tok
    logger.info("tokenizer %s: reusing %s", name, path)
    return tok


def _cached_bpe(path: Path, vocab_size: int) -> HFTokenizer | None:
    """The ``bpe:N`` tokenizer cached at ``path``, or None when absent or unusable (then retrained)."""
    if not path.is_file():
        return None
    try:
        tok = _from_file(path, {"eos_token": BPE_EOS}, f"bpe:{vocab_size}")
    except ConfigError as e:
        logger.warning("cached tokenizer %s is unreadable (%s); training it again", path, e)
        return None
    if tok.vocab_size > vocab_size or tok.eos_id is None:
        logger.warning("cached tokenizer %s does not match bpe:%d; training it again", path, vocab_size)
        return None
    return tok


_BPE_SPEC = re.compile(r"bpe:(\d+)")


def load_tokenizer(
    spec: str,
    *,
    documents: Callable[[], Iterator[str]] | None = None,
    source_digest: str | None = None,
    cache_dir: Path | None = None,
) -> ByteTokenizer | HFTokenizer:
    """The tokenizer a spec names (see the module docstring).

    ``documents`` (a fresh iterator of the job's documents per call) and ``source_digest`` are
    needed only by ``bpe:N``, which is cached under ``cache_dir`` (default
    ``~/.cache/geotrain/tokenizers``). Raises :class:`ConfigError` on a bad spec, a missing path
    or an unreadable tokenizer file.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"data.tokenizer must be 'bytes', 'bpe:N' or a tokenizer path; got {spec!r}")
    if spec == "bytes":
        return ByteTokenizer()
    if spec.startswith("bpe:"):
        m = _BPE_SPEC.fullmatch(spec)
        if m is None:
            raise ConfigError(
                f"data.tokenizer {spec!r}: write bpe:N with N an integer vocabulary size, e.g. bpe:8192"
            )
        n = int(m.group(1))
        if not 258 <= n <= 1 << 20:
            raise ConfigError(
                f"data.tokenizer {spec!r}: N must be in [258, 1048576] (256 bytes + EOS + merges)"
            )
        return _bpe_cached(n, documents=documents, source_digest=source_digest, cache_dir=cache_dir)
    path = Path(spec).expanduser()
    if path.is_dir():
        return _from_directory(path, spec)
    if path.is_file():
        special = _special_from_config(path.parent) if path.name == "tokenizer.json" else {}
        return _from_file(path, special, spec)
    raise ConfigError(
        f"data.tokenizer {spec!r} is neither 'bytes', 'bpe:N' nor an existing tokenizer.json file or directory"
    )
