"""Check the BFCL multi-turn adapter on every task of every category.

For each task: the env's expert (ground-truth replay) must be scored solved; the same replay
with one call dropped, and with one argument changed, should be scored unsolved; and every
verdict of the env is compared with BFCL's own `multi_turn_checker` on the same calls.

    python benchmarks/check_bfcl.py [--categories base miss_func ...] [--limit N] [--seed 0]
"""
from __future__ import annotations

import argparse
import random
import time

from agentrl_cli.envs import ENVS, bfcl


def play_expert(spec, task):
    env = spec.make()
    env.reset(task)
    rng = random.Random(0)
    while True:
        res = env.step(spec.expert(env, rng))
        if res.terminated or res.truncated:
            return env, res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--categories", nargs="+", default=list(bfcl.CATEGORIES))
    ap.add_argument("--limit", type=int, default=None, help="first N tasks per category")
    ap.add_argument("--seed", type=int, default=0, help="seed of the corruptions")
    args = ap.parse_args()
    print(f"bfcl-eval data and backends from {bfcl._package_dir()}")
    head = (f"{'env':32} {'tasks':>5} {'supported':>9} {'expert solved':>13} "
            f"{'drop unsolved':>13} {'change unsolved':>15} {'agree w/ BFCL':>13} {'s':>5}")
    print(head)
    total_bad = 0
    for cat in args.categories:
        t0 = time.time()
        name = "bfcl-multi-turn-" + cat.replace("_", "-")
        spec = ENVS.get(name)(seed=0)
        tasks = spec.tasks("eval", args.limit)
        rng = random.Random(args.seed)
        supported = solved = agree = checks = 0
        corrupt = {"drop": [0, 0], "change": [0, 0]}   # [unsolved, tried]
        for task in tasks:
            entry = spec._entries[task.task_id]
            try:
                plan = bfcl.ground_truth_plan(entry)
            except Exception as e:  # noqa: BLE001  (an unsupported task is reported, not fatal)
                print(f"  unsupported {task.task_id}: {type(e).__name__}: {e}")
                continue
            supported += 1
            env, res = play_expert(spec, task)
            ok = bool(res.info.get("success"))
            solved += ok
            ref = bfcl.reference_check(entry, env.decoded)["valid"]
            agree += ref == ok
            checks += 1
            for kind in ("drop", "change"):
                bad = bfcl.corrupt_plan(plan, rng, kind)
                if bad is None:
                    continue
                env = spec.make()
                res = bfcl.run_plan(env, task, bad)
                ok = bool(res.info.get("success"))
                corrupt[kind][0] += not ok
                corrupt[kind][1] += 1
                ref = bfcl.reference_check(entry, env.decoded)["valid"]
                agree += ref == ok
                checks += 1
        total_bad += (supported - solved) + (checks - agree)
        print(f"{name:32} {len(tasks):>5} {supported:>9} {solved:>13} "
              f"{corrupt['drop'][0]:>6}/{corrupt['drop'][1]:<6} "
              f"{corrupt['change'][0]:>7}/{corrupt['change'][1]:<7} "
              f"{agree:>6}/{checks:<6} {time.time() - t0:>5.1f}")
    raise SystemExit(1 if total_bad else 0)


if __name__ == "__main__":
    main()
