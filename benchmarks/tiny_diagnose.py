"""Where a tiny search model fails: failure classes of sampled held-out episodes and the
teacher-forced probability of each action token on clean expert transcripts.

    OMP_NUM_THREADS=1 python benchmarks/tiny_diagnose.py MODEL_DIR [--tasks 48] [--samples 2]
        [--temperature 1.0]

MODEL_DIR is a tiny build (it holds `recipe.json`, whose env settings are used). Failure
classes follow the gold chain: the first action that leaves it is the failure (`search` of a
wrong name: `wrong-relation` if the name is another fact of the document just opened, else
`garbled`; `open` of a document that is not the current entity's; a wrong `answer`).
Token table: for each action kind, the mean probability the model gives the expert's token at
each position of the action (position 2 of `search(` ... is the first name token, position 3
of `open(d` ... the first id digit) and of the whole action.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl_cli.engines.base import SamplingParams  # noqa: E402
from agentrl_cli.engines.hf import HFEngine  # noqa: E402
from agentrl_cli.models.chat import ChatFormat  # noqa: E402
from agentrl_cli.models.sequences import pad_episodes  # noqa: E402
from agentrl_cli.models.tiny import TinyRecipe  # noqa: E402
from agentrl_cli.train.tiny_build import recipe_spec  # noqa: E402
from agentrl_cli.rollout.runner import run_episodes, run_expert  # noqa: E402


def classify(ep, task, world) -> str:
    chain, hop = task.meta["chain"], 0
    if ep.success:
        return "ok"
    for turn in ep.turns:
        a = turn.action.strip()
        if a.startswith("search(") and a.endswith(")"):
            q = a[7:-1]
            if q != chain[hop]:
                prev = world.doc_by_title.get(chain[hop - 1]) if hop > 0 else None
                facts = [v for _, v in prev.facts] if prev else []
                return f"search hop {hop}: " + ("wrong-relation" if q in facts else "garbled")
        elif a.startswith("open(") and a.endswith(")"):
            doc = world.doc_by_id.get(a[5:-1])
            if doc is None:
                return f"open hop {hop}: no such id"
            if doc.title != chain[hop]:
                return f"open hop {hop}: wrong document"
            hop = min(hop + 1, len(chain) - 1)
        elif a.startswith("answer("):
            return f"answer after {hop} hops: wrong"
        else:
            return "malformed"
    return "truncated"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--tasks", type=int, default=48)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=1.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe = TinyRecipe.from_flat(json.loads((args.model / "recipe.json").read_text())["recipe"])
    spec = recipe_spec(recipe)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    fmt = ChatFormat.from_tokenizer(tok)
    tasks = spec.tasks("eval", args.tasks)
    pairs = [(t, 0) for t in tasks for _ in range(args.samples)]
    eps = run_episodes(HFEngine(model, fmt.pad_id), fmt, spec, pairs,
                       SamplingParams(temperature=args.temperature, max_new_tokens=32),
                       max_tokens=recipe.max_positions, batch_size=96,
                       generator=torch.Generator().manual_seed(0))
    print(f"success {sum(e.success for e in eps) / len(eps):.3f} ({len(eps)} episodes)")
    counts = collections.Counter(classify(e, t, spec.world) for e, (t, _) in zip(eps, pairs))
    for k, v in counts.most_common():
        print(f"  {v:4d}  {k}")

    clean = run_expert(fmt, spec, [(t, 0) for t in tasks], max_tokens=recipe.max_positions,
                       seed=1, error_rate=0.0)
    ids, _, attn = pad_episodes(clean, fmt.pad_id)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits.float()
    probs = logits[:, :-1].softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
    stats: dict = collections.defaultdict(list)
    for b, e in enumerate(clean):
        for turn in e.turns:
            kind = turn.action.split("(")[0]
            whole = 1.0
            for j, pos in enumerate(range(turn.start, turn.end)):
                p = float(probs[b, pos - 1])
                stats[kind, min(j, 6)].append(p)
                whole *= p
            stats[kind, "whole"].append(whole)
    print("teacher-forced p(expert token) by action position (6 = 6 and later):")
    for kind in sorted({k for k, _ in stats}):
        cells = [f"{j}:{sum(stats[kind, j]) / len(stats[kind, j]):.3f}"
                 for j in list(range(7)) + ["whole"] if stats.get((kind, j))]
        print(f"  {kind:7s} " + "  ".join(cells))


if __name__ == "__main__":
    main()
