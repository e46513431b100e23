"""Seconds per tiny warm-up step for recipe variants and torch thread counts, side by side.

    python benchmarks/bench_warmup_step.py [--steps 20] [--threads 1 2] \
        [--variant default='{}' two_layers='{"layers": 2}']

Each variant's model is built from `TinyRecipe(**JSON)` (the env settings of the JSON apply),
with a tokenizer trained on 200 demonstrations; the timed loop is the warm-up's
forward/backward/AdamW step on length-sorted neighbour batches, after 3 untimed steps. Run it
on an otherwise idle machine: the ratios are the result, not the absolute seconds.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl_cli.models.chat import ChatFormat  # noqa: E402
from agentrl_cli.models.sequences import pad_episodes, token_logprobs  # noqa: E402
from agentrl_cli.models.tiny import TinyRecipe, make_model, train_tokenizer  # noqa: E402
from agentrl_cli.app.tiny_build import recipe_spec  # noqa: E402
from agentrl_cli.rollout.runner import run_expert  # noqa: E402


def seconds_per_step(recipe: TinyRecipe, threads: int, steps: int) -> float:
    torch.set_num_threads(threads)
    spec = recipe_spec(recipe)
    tasks = spec.tasks("train")
    rng = random.Random(0)
    texts = [spec.make().system_prompt]
    for t in tasks[:200]:
        env = spec.make()
        texts.append(env.reset(t))
        while True:
            a = spec.expert(env, rng, recipe.error_rate)
            r = env.step(a)
            texts += [a, r.observation]
            if r.terminated or r.truncated:
                break
    fmt = ChatFormat.from_tokenizer(train_tokenizer(texts, recipe.vocab_size))
    model = make_model(recipe, len(fmt.tokenizer))
    demos = run_expert(fmt, spec, [(tasks[i % len(tasks)], 0) for i in range(200)],
                       max_tokens=recipe.max_positions, seed=0, error_rate=recipe.error_rate)
    demos.sort(key=lambda e: len(e.token_ids))
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr)

    def step() -> None:
        s = rng.randrange(len(demos) - recipe.batch_size + 1)
        ids, _, attn = pad_episodes(demos[s:s + recipe.batch_size], fmt.pad_id)
        loss = -token_logprobs(model, ids, attn).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--variant", nargs="+", default=["default={}", 'two_layers={"layers": 2}'])
    args = ap.parse_args()
    rows = []
    for v in args.variant:
        name, blob = v.split("=", 1)
        for th in args.threads:
            rows.append((name, th, seconds_per_step(TinyRecipe.from_flat(json.loads(blob)), th, args.steps)))
    ref = rows[0][2]
    print(f"{'variant':12s} {'threads':>7s} {'s/step':>8s} {'speed-up':>9s}")
    for name, th, s in rows:
        print(f"{name:12s} {th:7d} {s:8.3f} {ref / s:8.2f}x")


if __name__ == "__main__":
    main()
