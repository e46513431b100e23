"""Time the batched advantage estimators against plain per-episode loops.

Workload: 256 episodes x 20 turns x 50 policy tokens (plus a 30-token prompt and 20 observation
tokens after each turn, so L = 1430 positions), groups of 8, float32.

Two references per estimator, both producing the same [B, L] tensor as the batched version:
- "torch loop": a Python loop over episodes calling the unbatched `credit.*` definitions on each
  episode's policy tokens (what one writes without the batched code);
- "python loop": a Python loop over episodes and tokens on plain floats.
The loops are timed on a subset of episodes and scaled linearly to 256 (printed below).

Run: python benchmarks/bench_estimators.py  [--subset 32] [--repeats 7] [--threads 1] [--clock cpu]
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from agentrl_cli import credit

B, TURNS, TOKENS, ENV, PROMPT, GROUP = 256, 20, 50, 20, 30, 8
LAM, LAM_INTRA, BETA = 0.8, 0.95, 1.0
TRACE = dict(eps=0.1, K=3, gamma_td=0.8, lambda_term=2.0)


def make_batch(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    L = PROMPT + TURNS * (TOKENS + ENV)
    mask = torch.zeros(B, L)
    turn_index = torch.full((B, L), -1, dtype=torch.long)
    pos = PROMPT
    for t in range(TURNS):
        mask[:, pos:pos + TOKENS] = 1.0
        turn_index[:, pos:pos + TOKENS] = t
        pos += TOKENS + ENV
    return dict(
        mask=mask, turn_index=turn_index,
        values=torch.rand(B, L, generator=g),
        rewards=torch.randint(0, 2, (B,), generator=g).float(),
        group_index=torch.arange(B) // GROUP,
        # TRACE: the last turn is the answer, so T = TURNS - 1 tool-call turns, T + 1 states
        mean_logprobs=-3 * torch.rand(B, TURNS, generator=g),
        num_turns=torch.full((B,), TURNS, dtype=torch.long),
    )


# ----------------------------------------------------------------------------- batched


def batched(d: dict) -> dict:
    out_adv = credit.grpo_episode_advantages(d["rewards"], d["group_index"])
    return {
        "grpo": lambda: credit.grpo_token_advantages(d["rewards"], d["group_index"], d["mask"]),
        "gae": lambda: credit.gae_token_advantages(d["rewards"], d["values"], d["mask"], 1.0, 0.95),
        "mpo": lambda: credit.mpo_token_advantages(d["values"], d["rewards"], d["turn_index"],
                                                   d["mask"], LAM, LAM_INTRA, BETA),
        "trace": lambda: credit.trace_token_advantages(
            d["mean_logprobs"], d["num_turns"], out_adv, d["turn_index"], d["mask"], **TRACE),
    }


# ----------------------------------------------------------------------------- torch loop


def _episode_turns(d, b):
    return [(d["turn_index"][b] == t).nonzero().squeeze(1) for t in range(TURNS)]


def torch_loops(d: dict, n: int) -> dict:
    L = d["mask"].shape[1]
    out_adv = credit.grpo_episode_advantages(d["rewards"], d["group_index"])

    def grpo():
        out = torch.zeros(n, L)
        for start in range(0, n, GROUP):
            a = credit.grpo_advantages(d["rewards"][start:start + GROUP])
            for i in range(a.numel()):
                out[start + i] = a[i] * d["mask"][start + i]
        return out

    def gae():
        out = torch.zeros(n, L)
        for b in range(n):
            pos = d["mask"][b].nonzero().squeeze(1)
            r = torch.zeros(pos.numel())
            r[-1] = d["rewards"][b]
            out[b, pos] = credit.gae(r, d["values"][b, pos], 1.0, 0.95)[0]
        return out

    def mpo():
        out = torch.zeros(n, L)
        for b in range(n):
            turns = _episode_turns(d, b)
            adv = credit.mpo_advantages([d["values"][b, p] for p in turns], float(d["rewards"][b]),
                                        LAM, LAM_INTRA, BETA)
            for p, a in zip(turns, adv):
                out[b, p] = a
        return out

    def trace():
        out = torch.zeros(n, L)
        for b in range(n):
            r = credit.trace_turn_rewards(d["mean_logprobs"][b], float(out_adv[b]), **TRACE)
            for t, p in enumerate(_episode_turns(d, b)):
                out[b, p] = out_adv[b] + 0.2 * (r[t] if t < TURNS - 1 else 0.0)
        return out

    return {"grpo": grpo, "gae": gae, "mpo": mpo, "trace": trace}


# ----------------------------------------------------------------------------- python loop


def python_loops(d: dict, n: int) -> dict:
    """Loops over plain floats; converting the tensors to lists is part of the timed work."""
    def lists():
        return (d["mask"][:n].tolist(), d["turn_index"][:n].tolist(), d["values"][:n].tolist(),
                d["rewards"][:n].tolist(), d["mean_logprobs"][:n].tolist())

    out_adv = credit.grpo_episode_advantages(d["rewards"], d["group_index"])[:n].tolist()
    L = d["mask"].shape[1]

    def grpo():
        mask, _, _, rewards, _ = lists()
        out = []
        for start in range(0, n, GROUP):
            grp = rewards[start:start + GROUP]
            mean = sum(grp) / len(grp)
            sd = math.sqrt(sum((r - mean) ** 2 for r in grp) / (len(grp) - 1))
            for i, r in enumerate(grp):
                a = (r - mean) / (sd + 1e-6) if sd > 0 else 0.0
                out.append([a * m for m in mask[start + i]])
        return torch.tensor(out)

    def gae():
        mask, _, values, rewards, _ = lists()
        out = []
        for b in range(n):
            row = [0.0] * L
            pos = [i for i in range(L) if mask[b][i] > 0]
            acc, next_v = 0.0, 0.0
            for j, i in enumerate(reversed(pos)):
                r = rewards[b] if j == 0 else 0.0
                acc = r + next_v - values[b][i] + 0.95 * acc
                next_v = values[b][i]
                row[i] = acc
            out.append(row)
        return torch.tensor(out)

    def mpo():
        mask, turn, values, rewards, _ = lists()
        out = []
        for b in range(n):
            row = [0.0] * L
            turns = [[i for i in range(L) if turn[b][i] == t and mask[b][i] > 0] for t in range(TURNS)]
            first = [values[b][p[0]] for p in turns]
            acc, turn_adv = 0.0, [0.0] * TURNS
            for t in reversed(range(TURNS)):
                nf = first[t + 1] if t + 1 < TURNS else 0.0
                acc = (rewards[b] if t == TURNS - 1 else 0.0) + nf - first[t] + LAM * acc
                turn_adv[t] = acc
            for t, p in enumerate(turns):
                nf = first[t + 1] if t + 1 < TURNS else 0.0
                end_r = rewards[b] if t == TURNS - 1 else 0.0
                intra, acc = [0.0] * len(p), 0.0
                for k in reversed(range(len(p))):
                    nv = values[b][p[k + 1]] if k + 1 < len(p) else nf + end_r
                    acc = nv - values[b][p[k]] + LAM_INTRA * acc
                    intra[k] = acc
                mean = sum(intra) / len(intra)
                for k, i in enumerate(p):
                    row[i] = turn_adv[t] + BETA * (intra[k] - mean)
            out.append(row)
        return torch.tensor(out)

    def trace():
        eps, K, g, lt = TRACE["eps"], TRACE["K"], TRACE["gamma_td"], TRACE["lambda_term"]
        mask, turn, _, _, ml = lists()
        out = []
        T = TURNS - 1
        for b in range(n):
            d_ = [-x + eps for x in ml[b][:T + 1]]
            delta = [math.log(d_[k] / d_[k + 1]) for k in range(T)]
            r = []
            for k in range(T):
                h = min(k + K - 1, T - 1)
                c = sum(g ** (u - k) * delta[u] for u in range(k, h + 1)) / sum(
                    g ** (u - k) for u in range(k, h + 1))
                r.append(c + (lt * g ** (T - k) * out_adv[b] if h == T - 1 else 0.0))
            row = [0.0] * L
            for i in range(L):
                t = turn[b][i]
                if t >= 0 and mask[b][i] > 0:
                    row[i] = out_adv[b] + 0.2 * (r[t] if t < T else 0.0)
            out.append(row)
        return torch.tensor(out)

    return {"grpo": grpo, "gae": gae, "mpo": mpo, "trace": trace}


CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}
clock = CLOCKS["cpu"]


def median_time(fn, repeats: int) -> tuple[float, object]:
    """Median time of `repeats` calls (robust to a busy machine) and the last result."""
    times, result = [], None
    for _ in range(repeats):
        t0 = clock()
        result = fn()
        times.append(clock() - t0)
    return statistics.median(times), result


def interleaved_times(fns: list, repeats: int) -> list[tuple[float, object]]:
    """Median time of each function over `repeats` rounds that call them in turn, so that all of
    them see the same load on a busy machine; with the last result of each."""
    times, results = [[] for _ in fns], [None] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = clock()
            results[i] = fn()
            times[i].append(clock() - t0)
    return [(statistics.median(t), r) for t, r in zip(times, results)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--subset", type=int, default=32, help="episodes timed in the loop references")
    ap.add_argument("--repeats", type=int, default=7, help="timed calls per cell (median)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1 by default: on small shared CPUs extra threads "
                         "mostly add synchronisation overhead to these [256, L] ops)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                    help="cpu: this thread's CPU time (user + system, so page faults count; "
                         "steady on a shared machine); wall: elapsed time")
    args = ap.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    torch.set_num_threads(args.threads)
    n = args.subset - args.subset % GROUP or GROUP
    d = make_batch()
    scale = B / n
    fast, tl, pl = batched(d), torch_loops(d, n), python_loops(d, n)
    print(f"batch: {B} episodes x {TURNS} turns x {TOKENS} policy tokens "
          f"(L = {d['mask'].shape[1]} positions), float32, torch threads = {torch.get_num_threads()}")
    print(f"loop references timed on {n} episodes and scaled x{scale:g} to {B}; median of {args.repeats} "
          f"({args.clock} time; batched and python loop interleaved)")
    header = f"{'estimator':<10}{'batched ms':>12}{'torch loop ms':>15}{'speed-up':>10}" \
             f"{'python loop ms':>16}{'speed-up':>10}{'max |diff|':>12}"
    print(header)
    print("-" * len(header))
    for name in fast:
        fn = fast[name]
        fn()  # warm-up
        (t_fast, out), (t_py, ref_p) = interleaved_times([fn, pl[name]], args.repeats)
        out = out[0] if isinstance(out, tuple) else out
        t_torch, ref_t = median_time(tl[name], 1 if name in ("gae", "mpo") else args.repeats)
        diff = max(float((out[:n] - ref_t).abs().max()), float((out[:n] - ref_p).abs().max()))
        t_torch, t_py = t_torch * scale, t_py * scale
        print(f"{name:<10}{t_fast * 1e3:>12.2f}{t_torch * 1e3:>15.1f}{t_torch / t_fast:>9.0f}x"
              f"{t_py * 1e3:>16.1f}{t_py / t_fast:>9.0f}x{diff:>12.1e}")


if __name__ == "__main__":
    main()
