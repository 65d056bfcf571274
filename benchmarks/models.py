"""What a Hugging Face model costs per inner step, against the reference GPT of the same size, in one run.

    python -m benchmarks.models [--d-model 128] [--layers 6] [--heads 4] [--vocab 1024] [--seq-len 128]
                                [--batch 8] [--steps 20] [--repeat 3] [--threads T]

Three contenders train the same shape (width, depth, heads, vocabulary, context) on the same random
token batches, whole model in one process, AdamW, fp32:

- ``gpt``: geotrain's reference GPT (``GPTConfig``), as a stage module of all its blocks;
- ``hf-llama``: a Llama of that shape (its SwiGLU MLP sized to the GPT's parameter count) through geotrain (``HFModel`` cut into blocks, chained as one stage);
- ``hf-llama-native``: the same Llama as plain ``transformers`` runs it (the unsplit module).

Repeats are interleaved (each contender once, then again), so load from other processes hits all alike;
each figure is the median step time over repeats. One JSON line per contender
(``{"contender", "params", "step_ms", "tokens_per_s"}``) and a ``summary`` line with the ratios:
``hf_vs_gpt`` (tokens/s of the geotrain-run Llama over the GPT's) and ``cut_overhead`` (the geotrain-run
Llama's step time over the native one's: what cutting into blocks costs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch


def _gpt(args: argparse.Namespace) -> torch.nn.Module:
    from geotrain.models import GPTConfig, build_stage

    cfg = GPTConfig(vocab_size=args.vocab, n_layer=args.layers, n_head=args.heads, d_model=args.d_model,
                    seq_len=args.seq_len, tie_embeddings=False)
    return build_stage(cfg, (0, cfg.num_blocks), seed=0)


def _llama_config(args: argparse.Namespace, directory: Path) -> Path:
    import transformers

    transformers.LlamaConfig(
        # SwiGLU has three MLP matrices: 8/3 x d_model keeps the MLP's size equal to the GPT's 4 x d_model pair
        hidden_size=args.d_model, intermediate_size=round(8 * args.d_model / 3), num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.heads, vocab_size=args.vocab,
        max_position_embeddings=args.seq_len, tie_word_embeddings=False,
    ).save_pretrained(directory)
    return directory


def _hf_cut(path: Path, args: argparse.Namespace) -> torch.nn.Module:
    from geotrain.models import build_stage
    from geotrain.models.hf import HFModel

    model = HFModel.from_config(path, seed=0, seq_len=args.seq_len)
    return build_stage(model, (0, model.num_blocks), seed=0)


class _Native(torch.nn.Module):
    def __init__(self, path: Path) -> None:
        super().__init__()
        import transformers

        torch.manual_seed(0)
        cfg = transformers.AutoConfig.from_pretrained(path)
        self.inner = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=ids, use_cache=False).logits


def _stepper(model: torch.nn.Module, batches: list[torch.Tensor]) -> Callable[[int], float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(i: int) -> float:
        b = batches[i % len(batches)]
        t0 = time.perf_counter()
        logits = model(b[:, :-1])  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), b[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    return step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, args.vocab, (args.batch, args.seq_len + 1), generator=g) for _ in range(4)]
    with tempfile.TemporaryDirectory() as tmp:
        path = _llama_config(args, Path(tmp))
        models = {"gpt": _gpt(args), "hf-llama": _hf_cut(path, args), "hf-llama-native": _Native(path)}
        steppers = {name: _stepper(m, batches) for name, m in models.items()}
        for s in steppers.values():
            s(0)  # warm-up: first-call allocations and kernel choices
        times: dict[str, list[float]] = {name: [] for name in models}
        for _ in range(args.repeat):
            for name, s in steppers.items():
                times[name].append(statistics.median(s(i) for i in range(args.steps)))
    tokens = args.batch * args.seq_len
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, m in models.items():
        print(json.dumps({"contender": name, "params": sum(x.numel() for x in m.parameters()),
                          "step_ms": round(med[name] * 1e3, 3), "tokens_per_s": round(tokens / med[name], 1)}))
    print(json.dumps({"summary": True, "hf_vs_gpt": round(med["gpt"] / med["hf-llama"], 3),
                      "cut_overhead": round(med["hf-llama"] / med["hf-llama-native"], 3),
                      "shape": {"d_model": args.d_model, "layers": args.layers, "vocab": args.vocab,
                                "seq_len": args.seq_len, "batch": args.batch}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
