"""Hugging Face causal language models as block models, cut into stages with no per-family code.

What is an *HF model* here? Any local ``transformers`` causal LM (a
``config.json``, or a directory written by ``save_pretrained``) seen as an
ordered list of blocks:

- block ``0``: the embeddings, token ids ``(B, T)`` int64 -> hidden ``(B, T, C)``
  (the input embedding, plus an additive learned position embedding and the
  embedding dropout where the model has them, as GPT-2 does);
- blocks ``1 .. L``: one decoder layer each, ``(B, T, C) -> (B, T, C)``; each
  block computes what its layer needs from ``T`` alone (position ids
  ``arange(T)``, the model's own rotary embedding, the model's own causal or
  sliding-window mask), so a block runs the same on any peer;
- block ``L + 1``: the final norm and the LM head, ``(B, T, C) -> (B, T, V)``.

The parts are found from the model's own structure: the base model
(``model.base_model``), its single ``ModuleList`` of decoder layers, its input
embedding (``get_input_embeddings()``), its final norm and its output
embedding (``get_output_embeddings()``). A base model holding anything else
with weights is refused with a :class:`~geotrain.errors.ConfigError` naming
the architecture, and so is a cut whose logits differ from the model's own
(checked once on a short sequence when real weights are built), so a model
whose forward does something the structure does not show (a scaled
embedding, a logit cap) cannot train silently wrong.

What is the *name mapping*? Block parameters have short, stable names:
``embed.weight`` and ``pos.weight`` in block 0, ``layer.<name in the decoder
layer>`` in decoder blocks, ``norm.*`` and ``head.weight`` in the last block.
A stage names them ``blocks.<i>.<name>``; :meth:`HFModel.hf_state_dict` maps
them to the model's own state-dict names (``model.layers.0.mlp.up_proj.weight``)
and :meth:`HFModel.geotrain_name` maps back, so a trained swarm exports a
directory ``transformers`` loads.

Nothing is downloaded: every path is local and every ``transformers`` load
passes ``local_files_only=True``.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from geotrain.errors import ConfigError
from geotrain.models.blocks import BlockModel, TiedGroup

__all__ = ["HFModel", "weights_digest"]

log = logging.getLogger(__name__)

ATTN_IMPLEMENTATIONS = ("sdpa", "eager")
_FINAL_NORMS = ("norm", "ln_f", "final_layernorm", "final_layer_norm", "final_norm")
_POSITION_EMBEDDINGS = ("wpe", "embed_positions", "position_embeddings")
_EMBED_DROPOUTS = ("drop", "dropout", "embed_dropout", "emb_drop")
_ROTARY = ("rotary_emb",)
# config fields naming work a causal LM's own forward does after its head (invisible in its modules)
_UNSUPPORTED_FLAGS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


# -- blocks -------------------------------------------------------------------------------------
class HFEmbedding(nn.Module):
    """Block 0: token ids ``(B, T)`` -> hidden ``(B, T, C)``; ``+ pos(arange T)`` and dropout where the model has them."""

    def __init__(self, embed: nn.Module, pos: nn.Module | None, drop: nn.Module | None) -> None:
        super().__init__()
        self.embed = embed
        self.pos = pos
        self.drop = drop

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)  # (B, T, C)
        if self.pos is not None:
            positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)  # (1, T)
            h = h + self.pos(positions).to(h.device)
        if self.drop is not None:
            h = self.drop(h)
        return h


class HFDecoderLayer(nn.Module):
    """Blocks ``1 .. L``: one decoder layer of the model, ``(B, T, C) -> (B, T, C)``.

    ``rotary`` is this block's own copy of the model's rotary embedding (it has
    no trainable parameters); ``mask_fn`` is the mask builder the model's own
    forward uses for this layer (causal or sliding window), called with no
    padding and no cache, exactly as the model does for a full sequence.
    """

    def __init__(
        self,
        layer: nn.Module,
        *,
        rotary: nn.Module | None,
        mask_fn: Callable[..., Any],
        mask_config: Any,
        cache_kwarg: str,
        checkpointing: bool,
    ) -> None:
        super().__init__()
        self.layer = layer
        self.rotary = rotary
        self.checkpointing = checkpointing
        # plain attributes, not submodules: the config is read by the mask builder only
        self._mask_fn = mask_fn
        self._mask_config = mask_config
        self._cache_kwarg = cache_kwarg

    def _run(self, h: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(h.shape[1], device=h.device).unsqueeze(0)  # (1, T)
        mask = self._mask_fn(
            config=self._mask_config,
            inputs_embeds=h,
            attention_mask=None,
            # positions are arange(T), never packed: None skips the mask builder's data-dependent packing check
            position_ids=None,
            **{self._cache_kwarg: None},
        )
        kwargs: dict[str, Any] = {"attention_mask": mask, "position_ids": positions, "use_cache": False}
        if self.rotary is not None:
            kwargs["position_embeddings"] = self.rotary(h, position_ids=positions)
        out = self.layer(h, **kwargs)
        # older layers return (hidden, ...) tuples; newer ones the hidden tensor
        return out[0] if isinstance(out, (tuple, list)) else out

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.checkpointing and self.training and torch.is_grad_enabled():
            out = checkpoint(self._run, h, use_reentrant=False)
            assert isinstance(out, torch.Tensor)
            return out
        return self._run(h)


class HFHead(nn.Module):
    """Block ``L + 1``: final norm and LM head, ``(B, T, C) -> (B, T, V)`` logits."""

    def __init__(self, norm: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.head = head

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(h))


# -- finding the parts --------------------------------------------------------------------------
def _architecture(config: Any) -> str:
    archs = getattr(config, "architectures", None) or []
    model_type = getattr(config, "model_type", "?")
    return f"{'/'.join(archs) or model_type} (model_type {model_type!r})"


def _has_weights(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _module_name(root: nn.Module, target: nn.Module) -> str:
    for name, mod in root.named_modules():
        if mod is target:
            return name
    raise AssertionError("module not found in its own model")


def _mask_function(config: Any, layer_index: int) -> Callable[..., Any]:
    from transformers import masking_utils

    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        kind = layer_types[layer_index]
        if kind == "full_attention":
            return masking_utils.create_causal_mask
        if kind == "sliding_attention":
            return masking_utils.create_sliding_window_causal_mask
        raise ConfigError(
            f"cannot cut {_architecture(config)}: decoder layer {layer_index} has attention type {kind!r}; "
            "only 'full_attention' and 'sliding_attention' layers are supported"
        )
    if getattr(config, "sliding_window", None) is not None:
        return masking_utils.create_sliding_window_causal_mask
    return masking_utils.create_causal_mask


def _cache_kwarg(fn: Callable[..., Any]) -> str:
    params = inspect.signature(fn).parameters
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    raise ConfigError(f"transformers' {fn.__name__} takes neither 'cache' nor 'past_key_values'; unsupported version")


class _Parts:
    """The model's parts and their state-dict prefixes (``model.layers.``), found from its structure."""

    def __init__(self, model: Any, config: Any) -> None:
        arch = _architecture(config)
        base = getattr(model, "base_model", None)
        if not isinstance(base, nn.Module) or base is model:
            raise ConfigError(f"cannot cut {arch}: looked for a base model (model.base_model) inside the causal LM")
        lists = [(n, m) for n, m in base.named_children() if isinstance(m, nn.ModuleList)]
        if len(lists) != 1:
            raise ConfigError(
                f"cannot cut {arch}: looked for exactly one ModuleList of decoder layers in the base model "
                f"({type(base).__name__}); found {[n for n, _ in lists] or 'none'}"
            )
        self.layers_name, layers = lists[0]
        self.layers: list[nn.Module] = list(layers)
        embed = model.get_input_embeddings()
        head = model.get_output_embeddings()
        if embed is None or head is None:
            raise ConfigError(f"cannot cut {arch}: looked for get_input_embeddings() and get_output_embeddings()")
        self.embed, self.head = embed, head
        self.pos: nn.Module | None = None
        self.drop: nn.Module | None = None
        self.norm: nn.Module | None = None
        self.rotary: nn.Module | None = None
        unknown = []
        for name, child in base.named_children():
            if child is layers or child is embed:
                continue
            if name in _POSITION_EMBEDDINGS and type(child) is nn.Embedding:
                self.pos = child
            elif name in _FINAL_NORMS and _has_weights(child):
                self.norm = child
            elif name in _EMBED_DROPOUTS and isinstance(child, nn.Dropout):
                self.drop = child
            elif name in _ROTARY and not _has_weights(child):
                self.rotary = child
            elif _has_weights(child) or not isinstance(child, (nn.Dropout, nn.Identity)):
                unknown.append(f"{name} ({type(child).__name__})")
        if self.norm is None:
            raise ConfigError(f"cannot cut {arch}: looked for a final norm named one of {_FINAL_NORMS} in the base model")
        if unknown:
            raise ConfigError(
                f"cannot cut {arch}: the base model holds modules the cut does not know where to put: "
                f"{', '.join(unknown)} (known: decoder ModuleList, input embedding, {_POSITION_EMBEDDINGS} position "
                f"embedding, {_FINAL_NORMS} final norm, {_ROTARY} rotary embedding, dropout)"
            )
        if self.head is embed or not isinstance(getattr(self.head, "weight", None), nn.Parameter):
            raise ConfigError(f"cannot cut {arch}: looked for an output embedding with its own weight (an nn.Linear)")
        self.prefix = {
            "embed": _module_name(model, embed),
            "pos": _module_name(model, self.pos) if self.pos is not None else "",
            "layers": _module_name(model, layers),
            "norm": _module_name(model, self.norm),
            "head": _module_name(model, self.head),
        }


# -- the block model ----------------------------------------------------------------------------
def _config_file(path: str | Path) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ConfigError(f"HF model config {str(p)!r} does not exist; give a config.json or a directory holding one")
    return p


def _load_config(path: Path, *, vocab_size: int | None, attn: str) -> Any:
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"cannot read HF model config {str(path)!r}: {e}") from e
    if vocab_size is not None:
        if vocab_size < 1:
            raise ConfigError(f"vocab_size must be >= 1; got {vocab_size}")
        config.vocab_size = vocab_size
    pad = getattr(config, "pad_token_id", None)
    if isinstance(pad, int) and not 0 <= pad < config.vocab_size:
        raise ConfigError(
            f"HF config {str(path)!r}: pad_token_id {pad} is outside the vocabulary of {config.vocab_size} tokens; "
            "set pad_token_id to null or to a token of the tokenizer"
        )
    config._attn_implementation = attn
    return config


def _build(config: Any, *, seed: int, device: str, attn: str) -> nn.Module:
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device):
            model: nn.Module = AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    return model


def _max_positions(config: Any) -> int:
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ConfigError(
        f"HF config of {_architecture(config)} names no maximum sequence length (max_position_embeddings / n_positions)"
    )


class HFModel(BlockModel):
    """A local ``transformers`` causal LM as a block model (see the module docstring).

    Build it with :meth:`from_config` (weights from a seed, equal on every
    peer) or :meth:`from_pretrained` (weights from a ``save_pretrained``
    directory). :meth:`build_block` returns a deep copy of block ``i``.
    """

    def __init__(
        self,
        model: Any,
        *,
        seed: int | None,
        seq_len: int | None,
        activation_checkpointing: bool,
        verify: bool,
    ) -> None:
        self._config: Any = model.config
        self._seed = seed
        self._hf_class = type(model).__name__
        self._max_positions = _max_positions(self._config)
        if seq_len is not None:
            if seq_len < 1:
                raise ConfigError(f"seq_len must be >= 1; got {seq_len}")
            if seq_len > self._max_positions:
                raise ConfigError(
                    f"seq_len {seq_len} is longer than {_architecture(self._config)} supports "
                    f"({self._max_positions} positions); shorten seq_len or use a config with more positions"
                )
        self._seq_len = seq_len if seq_len is not None else self._max_positions
        self._generation_config = getattr(model, "generation_config", None) if _can_generate(model) else None
        for flag in _UNSUPPORTED_FLAGS:
            if getattr(self._config, flag, None):
                raise ConfigError(
                    f"cannot cut {_architecture(self._config)}: its causal LM's forward applies {flag}="
                    f"{getattr(self._config, flag)!r} after the head, which the blocks would not; set it to null"
                )
        parts = _Parts(model, self._config)
        self._prefix = parts.prefix
        self._num_layers = len(parts.layers)
        self._tied = bool(getattr(self._config, "tie_word_embeddings", False)) and (
            getattr(parts.head, "weight", None) is getattr(parts.embed, "weight", None)
        )
        blocks: list[nn.Module] = [HFEmbedding(parts.embed, parts.pos, parts.drop)]
        for i, layer in enumerate(parts.layers):
            mask_fn = _mask_function(self._config, i)
            blocks.append(
                HFDecoderLayer(
                    layer,
                    rotary=copy.deepcopy(parts.rotary) if parts.rotary is not None else None,
                    mask_fn=mask_fn,
                    mask_config=self._config,
                    cache_kwarg=_cache_kwarg(mask_fn),
                    checkpointing=activation_checkpointing,
                )
            )
        blocks.append(HFHead(parts.norm, parts.head))  # type: ignore[arg-type]
        self._blocks = blocks
        if verify:
            self._verify(model)

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_config(
        cls,
        path: str | Path,
        *,
        seed: int,
        seq_len: int | None = None,
        vocab_size: int | None = None,
        activation_checkpointing: bool = False,
        device: str = "cpu",
        attn_implementation: str = "sdpa",
    ) -> HFModel:
        """Build the model of ``path`` (a config.json or a directory holding one) with weights from ``seed``.

        The global torch RNG is seeded inside ``fork_rng`` (and restored), so
        every peer with the same arguments builds bitwise equal weights.
        ``device="meta"`` allocates nothing (for profiles of big models).
        ``vocab_size`` (the tokenizer's) overrides the config's.
        An architecture without an sdpa path falls back to eager attention.
        """
        if attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ConfigError(f"attn_implementation must be one of {ATTN_IMPLEMENTATIONS}; got {attn_implementation!r}")
        if device not in ("cpu", "meta"):
            raise ConfigError(f"HFModel builds on 'cpu' or 'meta' (stages move to their device later); got {device!r}")
        file = _config_file(path)
        config = _load_config(file, vocab_size=vocab_size, attn=attn_implementation)
        try:
            model = _build(config, seed=seed, device=device, attn=attn_implementation)
        except ValueError as e:
            if attn_implementation != "sdpa" or "attention implementation" not in str(e):
                raise ConfigError(f"cannot build a causal LM from {str(file)!r} ({_architecture(config)}): {e}") from e
            # the same choice on every peer: this architecture has no sdpa path, so all use eager
            log.info("%s has no sdpa attention; using eager", _architecture(config))
            config = _load_config(file, vocab_size=vocab_size, attn="eager")
            model = _build(config, seed=seed, device=device, attn="eager")
        model.float()  # a config may name bf16; weights are built and trained in fp32 here
        return cls(model, seed=seed, seq_len=seq_len, activation_checkpointing=activation_checkpointing, verify=True)

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        *,
        seq_len: int | None = None,
        activation_checkpointing: bool = False,
        attn_implementation: str = "sdpa",
    ) -> HFModel:
        """Load a directory written by ``save_pretrained`` (config.json + ``*.safetensors``); fp32 weights.

        Only safetensors weights are read (never a pickled ``.bin``); a
        weight the files lack is an error, not a fresh random init.
        """
        from transformers import AutoModelForCausalLM

        d = Path(directory)
        _config_file(d)
        if not sorted(d.glob("*.safetensors")):
            raise ConfigError(f"{str(d)!r} holds no *.safetensors weights (save them with save_pretrained)")
        if attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ConfigError(f"attn_implementation must be one of {ATTN_IMPLEMENTATIONS}; got {attn_implementation!r}")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # nothing should be initialised; if anything is, the same on every peer
            try:
                loaded: Any = AutoModelForCausalLM.from_pretrained(
                    str(d), local_files_only=True, use_safetensors=True, attn_implementation=attn_implementation,
                    dtype=torch.float32, output_loading_info=True,
                )
            except (OSError, ValueError) as e:
                raise ConfigError(f"cannot load HF model from {str(d)!r}: {e}") from e
        model, info = loaded
        missing = list(info.get("missing_keys", []))
        if missing:
            raise ConfigError(f"{str(d)!r} lacks weights for {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        model.train()
        return cls(model, seed=None, seq_len=seq_len, activation_checkpointing=activation_checkpointing, verify=True)

    def _verify(self, model: nn.Module) -> None:
        """The chained blocks must give the model's own logits on a short sequence (the cut is exact).

        On the meta device only shapes can be compared: the blocks must run and give ``(1, t, V)``.
        """
        t = min(16, self._max_positions)
        vocab = int(self._config.vocab_size)
        meta = next(model.parameters()).is_meta
        ids = torch.arange(t, dtype=torch.long, device="meta" if meta else "cpu").remainder(vocab).unsqueeze(0)  # (1, t)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                x = ids
                for block in self._blocks:
                    x = block(x)
                ref = None if meta else model(input_ids=ids, use_cache=False).logits  # (1, t, V)
        except (TypeError, ValueError, RuntimeError, IndexError) as e:
            raise ConfigError(
                f"cannot cut {_architecture(self._config)}: its decoder layer does not run from hidden states, "
                f"positions and a mask alone ({type(e).__name__}: {e})"
            ) from e
        finally:
            model.train(was_training)
        if tuple(x.shape) != (1, t, vocab):
            raise ConfigError(
                f"cannot cut {_architecture(self._config)}: the blocks give shape {tuple(x.shape)}, not (1, {t}, {vocab})"
            )
        if ref is None:
            return
        scale = max(1.0, float(ref.abs().max()))
        err = float((x.float() - ref.float()).abs().max())
        if not err <= 1e-4 * scale:
            raise ConfigError(
                f"cannot cut {_architecture(self._config)} exactly: the blocks' logits differ from the model's "
                f"by {err:.3g} (its forward does something its modules do not show, e.g. a scaled embedding "
                "or a logit cap)"
            )

    # -- block model ----------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self._num_layers + 2

    @property
    def tied_groups(self) -> tuple[TiedGroup, ...]:
        if not self._tied:
            return ()
        return (TiedGroup(name="embedding", members=((0, "embed.weight"), (self.num_blocks - 1, "head.weight"))),)

    def build_block(self, index: int, seed: int) -> nn.Module:
        if self._seed is not None and seed != self._seed:
            raise ConfigError(
                f"this HF model was built with seed {self._seed}; build it again with seed={seed} "
                "(its weights are built once, whole)"
            )
        if not 0 <= index < self.num_blocks:
            raise ConfigError(f"block index must be in [0, {self.num_blocks}); got {index}")
        return copy.deepcopy(self._blocks[index])

    # -- properties ----------------------------------------------------------------------------
    @property
    def hf_config(self) -> Any:
        """The ``transformers`` config the model was built from (with the vocab_size override applied)."""
        return self._config

    @property
    def max_positions(self) -> int:
        return self._max_positions

    @property
    def vocab_size(self) -> int:
        return int(self._config.vocab_size)

    @property
    def seq_len(self) -> int:
        """Training sequence length: the one given, else the config's maximum positions."""
        return self._seq_len

    @property
    def seed(self) -> int | None:
        """The seed the weights were built from; None for weights loaded from files."""
        return self._seed

    # -- names and export -----------------------------------------------------------------------
    def _block_prefixes(self, index: int) -> list[tuple[str, str]]:
        """``(block-local prefix, HF prefix)`` pairs of block ``index``."""
        p = self._prefix
        if index == 0:
            pairs = [("embed.", p["embed"] + ".")]
            if p["pos"]:
                pairs.append(("pos.", p["pos"] + "."))
            return pairs
        if index == self.num_blocks - 1:
            return [("norm.", p["norm"] + "."), ("head.", p["head"] + ".")]
        return [("layer.", f"{p['layers']}.{index - 1}.")]

    def hf_name(self, name: str) -> str:
        """``blocks.{i}.{name in block}`` -> the model's own state-dict name."""
        head, _, rest = name.partition(".")
        index_s, _, local = rest.partition(".")
        if head != "blocks" or not index_s.isdigit() or not 0 <= int(index_s) < self.num_blocks:
            raise ConfigError(f"{name!r} is not a parameter name of this model (blocks.<i>.<name>)")
        for ours, theirs in self._block_prefixes(int(index_s)):
            if local.startswith(ours):
                return theirs + local[len(ours):]
        raise ConfigError(f"{name!r} is not a parameter name of this model")

    def geotrain_name(self, hf_name: str) -> str:
        """The model's own state-dict name -> ``blocks.{i}.{name in block}`` (the head's name for a tied weight)."""
        for i in range(self.num_blocks - 1, -1, -1):
            for ours, theirs in self._block_prefixes(i):
                if hf_name.startswith(theirs):
                    return f"blocks.{i}.{ours}{hf_name[len(theirs):]}"
        raise ConfigError(f"{hf_name!r} is not a state-dict name of {_architecture(self._config)}")

    def hf_state_dict(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Geotrain-named tensors (``blocks.{i}.{name}``) under the model's own names.

        A tied head is left out (``transformers`` ties it to the embedding on
        load); where only the head's copy is given it stands for the embedding.
        """
        out: dict[str, torch.Tensor] = {}
        head_name = f"blocks.{self.num_blocks - 1}.head.weight"
        embed_name = "blocks.0.embed.weight"
        for name, tensor in params.items():
            if self._tied and name == head_name:
                if embed_name not in params:
                    out[self._prefix["embed"] + ".weight"] = tensor
                continue
            out[self.hf_name(name)] = tensor
        return out

    def _expected_hf_names(self) -> list[str]:
        names = []
        for i in range(self.num_blocks):
            for local, _ in self._blocks[i].named_parameters():
                name = f"blocks.{i}.{local}"
                if self._tied and i == self.num_blocks - 1 and local == "head.weight":
                    continue
                names.append(self.hf_name(name))
        return names

    def save_pretrained(self, params: dict[str, torch.Tensor], out_dir: str | Path) -> Path:
        """Write ``config.json`` + ``model.safetensors`` (+ ``generation_config.json``) that ``transformers`` loads.

        ``params`` are the whole model's tensors by geotrain name (every stage's
        ``named_parameters()`` together); a missing weight is an error.
        """
        from safetensors.torch import save_file

        state = self.hf_state_dict(params)
        missing = [n for n in self._expected_hf_names() if n not in state]
        if missing:
            raise ConfigError(
                f"cannot save: {len(missing)} weights missing, e.g. {missing[:3]} (give every stage's parameters)"
            )
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        config = copy.deepcopy(self._config)
        config.architectures = list(getattr(self._config, "architectures", None) or [self._hf_class])
        dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
        if len(dtypes) == 1:  # loaders default to the config's dtype: name the one the weights are in
            config.dtype = dtypes.pop()
        config.save_pretrained(str(out))
        if self._generation_config is not None:
            self._generation_config.save_pretrained(str(out))
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        return out


def _can_generate(model: nn.Module) -> bool:
    fn = getattr(model, "can_generate", None)
    try:
        return bool(fn()) if callable(fn) else False
    except (TypeError, AttributeError):
        return False


def weights_digest(directory: str | Path) -> str:
    """sha256 over the bytes of the directory's ``*.safetensors`` files, in sorted name order (hex)."""
    d = Path(directory)
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{str(d)!r} holds no *.safetensors weights")
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()
