"""The `hf` engine's decode speed against a minimal hand-written KV-cached greedy loop.

Both run the same model on the same 32 left-padded prompts (token ids, lengths 60-140) and
decode the same number of tokens greedily, with no stop token (every row decodes to the end):

- engine: `extend(prompts)` then `generate(..., SamplingParams(greedy=True))` on the engine's batch,
  which also returns each token's log-prob and keeps per-row bookkeeping (what rollouts use);
- loop: one prefill forward and one forward per token over transformers' own `DynamicCache`,
  `argmax` of the last logits, explicit position ids (the few lines one would write by hand).

The two are interleaved (engine, loop, engine, loop, ...) and each is timed in CPU time of
this thread; the medians give the ratio `loop time / engine time` (1.0 = the engine is as fast
as the loop). The tokens of the two must agree. Model: the cached default tiny build
(`$AGENTRL_CACHE`, default `~/.cache/agentrl`), else a randomly initialised model of the same
architecture built from its config (`--random` forces that).

Run: python benchmarks/bench_decode.py  [--rows 32] [--new-tokens 96] [--rounds 7] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from agentrl_cli.engines.base import SamplingParams
from agentrl_cli.engines.hf import HFEngine
from agentrl_cli.engines.kv_cache import cache_arg
from agentrl_cli.models.tiny import TinyRecipe, make_model, tiny_path


def load_model(random_init: bool):
    path = tiny_path(TinyRecipe())
    if not random_init and (path / "model.safetensors").exists():
        from transformers import AutoModelForCausalLM

        from agentrl_cli.models.loading import quiet_transformers

        quiet_transformers()
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32,
                                                     attn_implementation="sdpa")
        return model.eval(), f"cached tiny build {path}"
    recipe = TinyRecipe()
    model = make_model(recipe, recipe.vocab_size)
    model.config._attn_implementation = "sdpa"
    return model.eval(), "randomly initialised tiny architecture (no cached build)"


def make_prompts(rows: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(60, 141, (rows,), generator=g).tolist()
    return [torch.randint(16, vocab, (n,), generator=g).tolist() for n in lengths]


def run_engine(model, prompts, new_tokens: int, pad_id: int) -> list[list[int]]:
    batch = HFEngine(model, pad_id).new_batch(len(prompts))   # the layout the engine picks
    batch.extend(prompts)
    ids, _ = batch.generate(list(range(len(prompts))), SamplingParams(greedy=True,
                            max_new_tokens=new_tokens), stop_ids=())
    return ids


@torch.no_grad()
def run_loop(model, prompts, new_tokens: int, pad_id: int) -> list[list[int]]:
    from transformers import DynamicCache

    n, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros(n, width, dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = torch.tensor(p)
        mask[r, width - len(p):] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    lengths = mask.sum(1)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                logits_to_keep=1, **cache_arg(model, cache))
    tokens = []
    for step in range(new_tokens):
        tok = out.logits[:, -1].argmax(-1)
        tokens.append(tok)
        if step == new_tokens - 1:
            break
        mask = torch.cat([mask, mask.new_ones(n, 1)], dim=1)
        out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=lengths[:, None],
                    use_cache=True, **cache_arg(model, cache))
        lengths = lengths + 1
    return torch.stack(tokens, 1).tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=7, help="interleaved engine/loop pairs (median)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--random", action="store_true", help="random weights, skip the cached build")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, what = load_model(args.random)
    pad_id = model.config.pad_token_id or 0
    prompts = make_prompts(args.rows, model.config.vocab_size)
    print(f"model: {what}; {args.rows} rows, prompts {min(map(len, prompts))}-"
          f"{max(map(len, prompts))} tokens, {args.new_tokens} new tokens each, greedy, "
          f"torch threads = {torch.get_num_threads()}")
    run_engine(model, prompts, 4, pad_id), run_loop(model, prompts, 4, pad_id)  # warm-up
    times = {"engine": [], "loop": []}
    for _ in range(args.rounds):
        for name, fn in (("engine", run_engine), ("loop", run_loop)):
            t0 = time.thread_time()
            out = fn(model, prompts, args.new_tokens, pad_id)
            times[name].append(time.thread_time() - t0)
            if name == "engine":
                engine_ids = out
            elif out != engine_ids:
                same = sum(a == b for a, b in zip(out, engine_ids))
                print(f"warning: tokens differ from the loop's in {args.rows - same} rows")
    eng, loop = statistics.median(times["engine"]), statistics.median(times["loop"])
    toks = args.rows * args.new_tokens
    print(f"engine: {eng * 1e3:8.1f} ms CPU  ({toks / eng:8.0f} tokens/CPU-s)")
    print(f"loop:   {loop * 1e3:8.1f} ms CPU  ({toks / loop:8.0f} tokens/CPU-s)")
    print(f"engine speed / loop speed = {loop / eng:.3f}  (median of {args.rounds} interleaved rounds)")


if __name__ == "__main__":
    main()
