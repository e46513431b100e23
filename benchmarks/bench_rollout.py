"""Multi-turn rollout throughput: the `hf` engine (KV cache kept across turns, hand-written
decode loop) next to `model.generate` on the same prompts (history re-prefilled every turn,
which is what a generate-based multi-turn loop does).

Both run greedy decoding on the same tasks with the same model, so they produce the same
episodes (checked); the printed ratio is generated tokens per second, measured side by side in
one process.

    python benchmarks/bench_rollout.py [--episodes 64] [--model tiny|PATH]
"""
from __future__ import annotations

import argparse
import time

import torch

from agentrl_cli import config
from agentrl_cli.engines.base import SamplingParams
from agentrl_cli.engines.hf import HFEngine
from agentrl_cli.app.tiny_build import load_policy
from agentrl_cli.context import make_spec
from agentrl_cli.context.episode import LiveEpisode as _Live, append_turn, apply_step, new_episode
from agentrl_cli.rollout.runner import run_episodes


def generate_loop(model, fmt, spec, tasks, max_new: int, max_tokens: int):
    """The baseline: one `model.generate` call per turn over the whole (left-padded) history."""
    lives = []
    for task, g in tasks:
        env = spec.make()
        user = env.reset(task)
        lives.append(_Live(new_episode(task, g, fmt.prompt_ids(env.system_prompt, user)), env))
    while True:
        rows = [lv for lv in lives if not lv.done]
        if not rows:
            break
        L = max(len(lv.ep.token_ids) for lv in rows)
        ids = torch.full((len(rows), L), fmt.pad_id, dtype=torch.long)
        attn = torch.zeros(len(rows), L, dtype=torch.long)
        for i, lv in enumerate(rows):
            n = len(lv.ep.token_ids)
            ids[i, L - n:] = torch.tensor(lv.ep.token_ids)
            attn[i, L - n:] = 1
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=max_new,
                                 do_sample=False, eos_token_id=list(fmt.stop_ids),
                                 pad_token_id=fmt.pad_id)
        new = out[:, L:].tolist()
        for lv, toks in zip(rows, new):
            cut = []
            for t in toks:
                cut.append(t)
                if t in fmt.stop_ids:
                    break
            turn = append_turn(lv.ep, cut, [0.0] * len(cut), fmt.decode_action(cut))
            apply_step(lv, fmt, turn, max_tokens, max_new)
    return [lv.ep for lv in lives]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    cfg = config.load(sets=[f"model.name={args.model}"])
    model, tok, fmt, path = load_policy(cfg, log=lambda s: None)
    spec = make_spec(cfg)
    tasks = [(t, i) for i, t in enumerate(spec.tasks("eval", args.episodes))]
    params = SamplingParams(greedy=True, max_new_tokens=cfg.rollout.max_new_tokens)
    engine = HFEngine(model, fmt.pad_id)
    best = {"hf engine": float("inf"), "model.generate": float("inf")}
    eps = {}
    for _ in range(args.repeats):
        t = time.perf_counter()
        eps["hf engine"] = run_episodes(engine, fmt, spec, tasks, params, cfg.rollout.max_tokens,
                                        len(tasks))
        best["hf engine"] = min(best["hf engine"], time.perf_counter() - t)
        t = time.perf_counter()
        eps["model.generate"] = generate_loop(model, fmt, spec, tasks, params.max_new_tokens,
                                              cfg.rollout.max_tokens)
        best["model.generate"] = min(best["model.generate"], time.perf_counter() - t)
    same = sum(a.token_ids == b.token_ids for a, b in zip(eps["hf engine"], eps["model.generate"]))
    print(f"model: {path}  episodes: {len(tasks)}  torch threads: {torch.get_num_threads()}")
    print(f"{'runner':<16}{'seconds':>10}{'gen tokens':>12}{'tokens/s':>10}{'turns/ep':>10}")
    rate = {}
    for name, secs in best.items():
        gen = sum(e.generated_tokens for e in eps[name])
        turns = sum(e.num_turns for e in eps[name]) / len(tasks)
        rate[name] = gen / secs
        print(f"{name:<16}{secs:>10.2f}{gen:>12}{rate[name]:>10.0f}{turns:>10.2f}")
    print(f"identical episodes: {same}/{len(tasks)}")
    print(f"speed-up (hf engine / model.generate): {rate['hf engine'] / rate['model.generate']:.2f}x")


if __name__ == "__main__":
    main()
