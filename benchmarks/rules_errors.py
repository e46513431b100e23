"""Why the `rules` agent's answers fail, by kind (the research log's table).

    agentrl rollout --config experiments/focus-deonticbench-cpu.yaml --split eval --n 240 \
        --group-size 4 --out rules240.jsonl
    python benchmarks/rules_errors.py rules240.jsonl

Each episode of a numeric question is one of: right; no answer; answered without `calc` (when
the fee has one term or none, or several); the last `calc` names the fee's amounts as often as
the fee does but is wrong (split by whether every number in it appears in the episode's
context: copied wrong or picked wrong); the last `calc` names other amounts or counts them
otherwise (which rules apply, to how many bags).
Yes/no questions are counted right or wrong. The tasks are rebuilt from the env's settings
(`--n-train`, default the CPU experiment file's 10000) to read each fee's terms.
"""
from __future__ import annotations

import argparse
import json
import re
from collections import Counter

from agentrl_cli.envs.rules import fee_counts, make_rules_spec


def classify(episode: dict, meta: dict) -> str:
    if not meta["numeric"]:
        return "yes/no " + ("right" if episode["success"] else "wrong")
    if episode["success"]:
        return "numeric right"
    actions = [t["action"] for t in episode["turns"]]
    if not any(a.startswith("answer(") for a in actions):
        return "numeric: no answer (turns ran out or malformed)"
    calcs = [a for a in actions if a.startswith("calc(")]
    if not calcs:
        several = "several terms" if len(meta["terms"]) > 1 else "one term or none"
        return f"numeric: answered without calc, the fee has {several}"
    expr = calcs[-1][len("calc("):-1]
    if fee_counts(expr) != fee_counts("+".join(e for _, e, _ in meta["terms"])):
        return "numeric: other rules or counts (which rules apply, to how many bags)"
    context = " ".join(t["observation"] for t in episode["turns"]) + " " + episode["question"]
    seen = set(re.findall(r"\d+", context))
    where = ("every number in it is in the context" if all(n in seen for n in re.findall(r"\d+", expr))
             else "a number not in the context (copied wrong)")
    return f"numeric: the same named amounts, other numbers, {where}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("episodes", help="an `agentrl rollout --out` file of rules episodes")
    ap.add_argument("--n-train", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    spec = make_rules_spec(args.seed, n_train=args.n_train)
    meta = {t.task_id: t.meta for split in ("train", "eval") for t in spec.tasks(split)}
    eps = [json.loads(line) for line in open(args.episodes)]
    counts = Counter(classify(e, meta[e["task_id"]]) for e in eps)
    print("| outcome | episodes |\n|---|---|")
    for k, v in sorted(counts.items()):
        print(f"| {k} | {v} |")
    print(f"| all | {len(eps)} |")


if __name__ == "__main__":
    main()
