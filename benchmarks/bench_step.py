"""Training-step cost: wall and CPU time, throughput and peak memory of each phase of a few
`agentrl train` steps, optionally side by side with an older commit.

Runs `train()` for `--steps` steps (defaults of `--method`, seed 0, the default tiny build) in
a child process and times every phase by wrapping the trainer loop's own functions, so any
commit with the same loop structure can be measured by the same script:

- rollout: `rollouts.run` (generation + env), generated tokens per CPU-second, split into
  decode forwards (every fed row one token), prefills (prompts, observations, refeeds:
  forwards with a longer chunk), forks (KV cache copies), critic values at tree nodes, env
  steps, sampling, the FOCUS planner's bookkeeping, and the rest of the drivers' loops (token
  bookkeeping, tokenisation of observations, Python); the mean rows per decode forward (how
  full the engine is); and the real share of decode attention: the fed rows' real tokens over
  the cache columns every computed row attends to (holes left by other rows, and idle rows
  computed by a dense forward, are the rest); the mean context of a decoded token (the fed
  rows' real tokens: what its attention must read however the cache is laid out); and, for a
  tree rollout, the share of decode forwards that ran before the step's first continuation
  (only root paths running: no node has a finished sample to weigh a continuation by yet);
- scoring: from `collate` to the start of `update` (batch, scoring pass, preparer, estimator);
- update: `update` (forward + backward + optimiser step);
- eval: `evaluate` (the base check at step 0 and the final one);
- learn = scoring + update: processed tokens (prompt, completions and observations of the
  batch's episodes: every real token the update reads) per CPU-second of these two phases, and
  forwarded tokens: those the update's forward actually runs (with `train.tree_pack` a prefix
  shared by several episodes counts once).

Peak RSS per phase: the kernel's high-water mark (`VmHWM`) is reset (`/proc/self/clear_refs`,
5) when a phase starts and read when it ends; "load" is the peak before the first phase
(imports, model, engine). The process peak is the largest of them.

    python benchmarks/bench_step.py [--method grpo | --method focus,grpo] [--steps 3]
                                    [--threads 1] [--rounds 1]
                                    [--against REV] [--arm NAME:key=value,...] [--set key=value]

`--against REV` checks REV out as a git worktree under /tmp, runs the same measurement there
(a child process with `PYTHONPATH` at the worktree), alternating with the current tree
`--rounds` times, and prints current / REV ratios and the largest difference between the two
runs' metrics.jsonl (same seed: the same run up to float noise, unless a change is meant to
alter it). `--arm NAME:train.pack=true` adds the current tree with more overrides as another
arm (ratios against REV, or against the plain current tree without `--against`). Several
methods (`--method focus,grpo`) run side by side as arms named by method, with ratios against
the last one. CPU times are the process's (`time.process_time`, all threads); with `--threads 1`
they do not depend on the machine's other load as much as wall times do.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from agentrl_cli.app.train import train as checked_train

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("load", "rollout", "scoring", "update", "eval", "other")
SKIP_METRICS = ("time/", "tokens/s", "focus/bookkeeping_seconds",
                "focus/bookkeeping_share")                    # wall clocks


# ------------------------------------------------------------------------------ child
def _hwm_kb() -> int:
    m = re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text())
    return int(m.group(1)) if m else 0


def _reset_hwm() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:                           # not Linux, or not permitted: peaks are cumulative
        return False


class Phases:
    """Wall, CPU and peak RSS of named phases (a phase may run many times)."""

    def __init__(self):
        self.stats = {p: {"wall": 0.0, "cpu": 0.0, "peak_mb": 0.0, "calls": 0} for p in PHASES}
        self.resettable = True
        self._open = None

    def start(self, name: str) -> None:
        """Close the gap since the last phase ("load" before the first one, else "other")."""
        if self.stats["load"]["calls"] == 0:
            self.stats["load"] = {"wall": time.perf_counter() - T0, "cpu": time.process_time(),
                                  "peak_mb": _hwm_kb() / 1024, "calls": 1}
        else:
            self.between()
        self.resettable = _reset_hwm() and self.resettable
        self._open = (name, time.perf_counter(), time.process_time())

    def stop(self) -> None:
        name, w, c = self._open
        s = self.stats[name]
        s["wall"] += time.perf_counter() - w
        s["cpu"] += time.process_time() - c
        s["peak_mb"] = max(s["peak_mb"], _hwm_kb() / 1024)
        s["calls"] += 1
        self._open = None
        _reset_hwm()

    def between(self) -> None:
        o = self.stats["other"]
        o["peak_mb"] = max(o["peak_mb"], _hwm_kb() / 1024)

    def finish(self, wall: float, cpu: float) -> None:
        """The "other" phase: what no phase covers (engine sync, metrics, checkpoints, plots)."""
        self.between()
        o = self.stats["other"]
        o["wall"] = wall - sum(s["wall"] for k, s in self.stats.items() if k != "other")
        o["cpu"] = cpu - sum(s["cpu"] for k, s in self.stats.items() if k != "other")
        o["calls"] = 1


T0 = time.perf_counter()
ROLLOUT_PARTS = ("decode", "prefill", "fork", "values", "env", "sampling", "planner")


def _split_rollout(parts: dict, count: dict) -> None:
    """Wrap the engine's forwards and forks, critic values, env steps and sampling where the
    rollout drivers call them, adding each call's CPU time to `parts` (they never nest). Calls
    outside a rollout (evaluation) are not counted."""
    import importlib

    from agentrl_cli.context import episode, operators

    def optional(name):                 # an older commit may not have the module
        try:
            return importlib.import_module(name)
        except ImportError:
            return None

    kv_batch = optional("agentrl_cli.engines.kv_batch") or optional("agentrl_cli.engines.hf")
    kv_ragged = optional("agentrl_cli.engines.kv_ragged") or kv_batch

    drivers = [m for m in map(optional, ("agentrl_cli.rollout.focus", "agentrl_cli.rollout.executors",
                                         "agentrl_cli.rollout.token_loop")) if m is not None]

    def wrap(owner, name, part, classify=None):
        fn = getattr(owner, name)

        def run(*a, **kw):
            if not IN_ROLLOUT[0]:
                return fn(*a, **kw)
            key = classify(a, kw) if classify else part
            c = time.process_time()
            try:
                return fn(*a, **kw)
            finally:
                parts[key] += time.process_time() - c
        setattr(owner, name, run)

    def fed(chunks):
        return [c for c in chunks if c]

    def kind(a, kw):                       # (self, chunks) or (self, rows, chunks)
        chunks = fed(a[-1])
        if chunks and max(len(c) for c in chunks) == 1:
            count["decode_forwards"] += 1
            count["decode_rows"] += len(chunks)
            kv = a[0]                          # the cache before the forward: what it attends
            computed = a[1] if len(a) == 3 else range(kv.n)
            fed_rows = [r for r, c in zip(computed, a[-1]) if c]
            if getattr(kv, "ragged", False):   # no holes: a forward attends its longest row
                if len(a) == 3 and computed:       # fed rows filling their block run as it
                    lo, hi = min(computed), max(computed) + 1
                    if len(computed) >= getattr(kv_ragged, "BLOCK_SHARE", 2.0) * (hi - lo):
                        computed = range(lo, hi)
                width = max((int(kv.lengths[r]) for r in computed), default=0)
            else:
                width = int(kv.mask.shape[1])
            count["decode_attended"] += len(computed) * width
            count["decode_real"] += int(sum(int(kv.lengths[r]) for r in fed_rows))
            if not BRANCHED[0]:
                BRANCHED[1] += 1               # before this rollout's first continuation
            return "decode"
        return "prefill"

    planner = optional("agentrl_cli.rollout.planner")
    if planner is not None and hasattr(planner, "FocusPlanner"):
        branch = planner.FocusPlanner.branch

        def branched(*a, **kw):
            if IN_ROLLOUT[0] and not BRANCHED[0]:
                BRANCHED[0] = True
                count["decode_before_branch"] += BRANCHED[1]
            return branch(*a, **kw)
        planner.FocusPlanner.branch = branched

    for cls in (kv_batch.KVBatch, getattr(kv_ragged, "RaggedKVBatch", None)):    # each layout's own methods
        if cls is None:
            continue
        for name in ("_forward", "_forward_rows"):
            if name in vars(cls):
                wrap(cls, name, None, kind)
        if "fork" in vars(cls):
            wrap(cls, "fork", "fork")
    for mod in drivers:
        for name in ("head_values", "critic_values"):
            if hasattr(mod, name):
                wrap(mod, name, "values")
        if hasattr(mod, "sample_rows"):
            wrap(mod, "sample_rows", "sampling")
    wrap(kv_batch, "sample", "sampling")         # where `KVBatch.generate` looks them up
    wrap(kv_batch, "sample_rows", "sampling")
    wrap(episode, "step_env", "env")
    wrap(operators, "step_env", "env")


IN_ROLLOUT = [False]
BRANCHED = [False, 0]   # this rollout launched a continuation; decode forwards before it


def _forwarded(learner, batch, cfg) -> int:
    """Tokens the update's forward runs over `batch`: real tokens, or with tree packing the
    distinct tokens of each micro-batch's prefix tree."""
    try:
        from agentrl_cli.models.sequences import tree_pack_rows
        from agentrl_cli.train.batch import microbatches, trim
        from agentrl_cli.train.learner import packs
    except ImportError:                 # a commit without tree packing: every real token
        return int(batch.attention_mask.sum())

    form = packs(learner, cfg)
    if form != "tree":
        return int(batch.attention_mask.sum())
    total = 0
    for rows in microbatches(batch, cfg.train.max_tokens_per_microbatch, form):
        mb = trim(batch.select(rows))
        total += int(tree_pack_rows(mb.input_ids, mb.attention_mask)[0].shape[0])
    return total


def child(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    import agentrl_cli
    from agentrl_cli import config
    from agentrl_cli.train import loop

    where = Path(agentrl_cli.__file__).resolve().parents[1]
    if where != Path(args.tree).resolve():
        raise SystemExit(f"imported agentrl_cli from {where}, expected {args.tree}")
    ph = Phases()
    count = {"generated": 0, "processed": 0, "forwarded": 0, "steps": 0}

    def timed(name, fn, after=None):
        def run(*a, **kw):
            ph.start(name)
            IN_ROLLOUT[0] = name == "rollout"
            BRANCHED[:] = [False, 0]
            try:
                out = fn(*a, **kw)
            finally:
                ph.stop()
                IN_ROLLOUT[0] = False
            if after is not None:
                after(out, *a)
            return out
        return run

    def count_rollout(result, *a):
        count["generated"] += int(result.tokens)
        if result.timing is not None:
            parts["planner"] += result.timing.bookkeeping_seconds     # wall, one thread: ~CPU

    parts = {k: 0.0 for k in ROLLOUT_PARTS}
    count.update(decode_forwards=0, decode_rows=0, decode_attended=0, decode_real=0,
                 decode_before_branch=0)
    _split_rollout(parts, count)

    orig_open, orig_collate, orig_update = loop.open_rollouts, loop.collate, loop.update

    def open_rollouts(*a, **kw):
        r = orig_open(*a, **kw)
        r.run = timed("rollout", r.run, count_rollout)
        return r

    def collate(*a, **kw):
        ph.start("scoring")               # closed when the update starts
        return orig_collate(*a, **kw)

    def update(learner, batch, *a, **kw):
        ph.stop()
        count["processed"] += int(batch.attention_mask.sum())
        count["forwarded"] += _forwarded(learner, batch, cfg)
        count["steps"] += 1
        return timed("update", orig_update)(learner, batch, *a, **kw)

    loop.open_rollouts, loop.collate, loop.update = open_rollouts, collate, update
    loop.evaluate = timed("eval", loop.evaluate)
    cfg = config.load(method=args.method, sets=[f"train.steps={args.steps}"] + args.set)
    out = Path(args.out)
    checked_train(cfg, out, log=lambda s: None)
    total_wall = time.perf_counter() - T0
    ph.finish(total_wall, time.process_time())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]
    result = {"phases": ph.stats, **count, "rollout_parts": parts, "wall": total_wall, "cpu": time.process_time(),
              "peak_reset": ph.resettable, "metrics": rows,
              "rev": subprocess.run(["git", "-C", args.tree, "rev-parse", "--short", "HEAD"],
                                    capture_output=True, text=True).stdout.strip()}
    Path(args.child).write_text(json.dumps(result))


# ------------------------------------------------------------------------------ parent
def measure(tree: Path, sets: list[str], args, tmp: Path, tag: str, method: str) -> dict:
    dest = tmp / f"{tag}.json"
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(args.threads),
           "MKL_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(dest), "--tree", str(tree),
           "--out", str(tmp / f"run-{tag}"), "--method", method, "--steps", str(args.steps),
           "--threads", str(args.threads)] + [x for s in sets for x in ("--set", s)]
    subprocess.run(cmd, env=env, check=True, cwd=tmp)
    return json.loads(dest.read_text())


def ratio(a: float, b: float) -> str:
    """`a / b` as "1.23x"; "-" where b is 0 (a count the reference arm does not have)."""
    return f"{a / b:.2f}x" if b else "-"


def derived(r: dict) -> dict:
    p = r["phases"]
    learn = p["scoring"]["cpu"] + p["update"]["cpu"]
    return {
        "generated tok / rollout CPU s": r["generated"] / max(p["rollout"]["cpu"], 1e-9),
        "processed tok / learn CPU s": r["processed"] / max(learn, 1e-9),
        "learn CPU s / step": learn / max(r["steps"], 1),
        "forwarded tok / generated tok": r.get("forwarded", 0) / max(r["generated"], 1),
        "processed tok / generated tok": r["processed"] / max(r["generated"], 1),
        "rows per decode forward": r.get("decode_rows", 0) / max(r.get("decode_forwards", 0), 1),
        "real share of decode attention": r.get("decode_real", 0) / max(r.get("decode_attended", 0), 1),
        "mean context of a decoded token": r.get("decode_real", 0) / max(r.get("decode_rows", 0), 1),
        "decode forwards before the first continuation": (r.get("decode_before_branch", 0)
                                                          / max(r.get("decode_forwards", 0), 1)),
        "peak RSS MB": max(s["peak_mb"] for s in p.values()),
    }


def report(name: str, runs: list[dict]) -> dict:
    """Print one tree's medians over rounds; return them."""
    med = lambda xs: statistics.median(xs)
    r0 = runs[0]
    print(f"\n{name} (build {r0['rev']}): {r0['steps']} steps, {r0['generated']} generated tokens, "
          f"{r0['processed']} processed tokens, {len(runs)} run(s), medians")
    print(f"  {'phase':<8} {'wall s':>8} {'CPU s':>8} {'peak RSS MB':>12}")
    out = {}
    for ph in PHASES:
        w = med([r["phases"][ph]["wall"] for r in runs])
        c = med([r["phases"][ph]["cpu"] for r in runs])
        m = med([r["phases"][ph]["peak_mb"] for r in runs])
        out[ph] = {"wall": w, "cpu": c, "peak_mb": m}
        print(f"  {ph:<8} {w:>8.2f} {c:>8.2f} {m:>12.0f}")
    print(f"  {'total':<8} {med([r['wall'] for r in runs]):>8.2f} {med([r['cpu'] for r in runs]):>8.2f}")
    parts = r0.get("rollout_parts")
    if parts:
        roll = med([r["phases"]["rollout"]["cpu"] for r in runs])
        split = {k: med([r["rollout_parts"][k] for r in runs]) for k in parts}
        split["rest"] = roll - sum(split.values())
        print(f"  rollout CPU split ({roll:.2f} s; ms per 1k generated tokens, share):")
        for k, v in split.items():
            print(f"    {k:<9} {1e6 * v / max(r0['generated'], 1):>8.0f}  {v / max(roll, 1e-9):>6.1%}")
        out["rollout_split"] = split
    d = {k: med([derived(r)[k] for r in runs]) for k in derived(r0)}
    for k, v in d.items():
        print(f"  {k}: {v:.1f}" if v >= 10 else f"  {k}: {v:.3f}")
    if not r0["peak_reset"]:
        print("  (VmHWM could not be reset: phase peaks are cumulative)")
    out["derived"] = d
    return out


def metric_diff(a: list[dict], b: list[dict]) -> tuple[float, str]:
    """The largest |a - b| over every numeric metric both runs logged at the same step (wall
    clocks left out), and where it is."""
    worst, where = 0.0, "none"
    for ra, rb in zip(a, b):
        for k in set(ra) & set(rb):
            if k.startswith(SKIP_METRICS) or not isinstance(ra[k], (int, float)):
                continue
            d = abs(float(ra[k]) - float(rb[k]))
            if math.isnan(d) or d > worst:
                worst, where = d, f"step {ra.get('step')} {k}: {ra[k]} vs {rb[k]}"
    if len(a) != len(b):
        where += f" (rows {len(a)} vs {len(b)})"
    return worst, where


def worktree(rev: str) -> Path:
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True,
                         capture_output=True, text=True).stdout.strip()
    path = Path(tempfile.gettempdir()) / f"agentrl-bench-{sha}"
    if not (path / "agentrl_cli").is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), sha],
                       check=True, capture_output=True)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="grpo")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1, help="alternating runs per tree")
    ap.add_argument("--against", default="", help="a git revision to run side by side")
    ap.add_argument("--arm", action="append", default=[],
                    help="NAME:key=value,key=value: the current tree with these overrides too, "
                         "as another arm (repeatable)")
    ap.add_argument("--keep-worktree", action="store_true")
    ap.add_argument("--set", action="append", default=[], help="a config override (repeatable)")
    ap.add_argument("--json", default="", help="write every run's numbers here")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--tree", default=str(ROOT), help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    # arms: (tree, config overrides); ratios are of every other arm to the reference arm
    methods = [m for m in args.method.split(",") if m]
    if len(methods) > 1:                 # methods side by side; ratios against the last
        arms = {m: (ROOT, args.set, m) for m in methods}
        ref = methods[-1]
    else:
        arms = {"current": (ROOT, args.set, methods[0])}
        ref = args.against or "current"
    for spec in args.arm:
        name, _, sets = spec.partition(":")
        arms[name] = (ROOT, args.set + [x for x in sets.split(",") if x], methods[0])
    if args.against:
        arms[args.against] = (worktree(args.against), args.set, methods[0])
    runs: dict[str, list[dict]] = {k: [] for k in arms}
    print(f"bench_step: agentrl train --method {args.method} --set train.steps={args.steps} "
          + " ".join(f"--set {s}" for s in args.set) + f" ({args.threads} thread(s))")
    try:
        with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
            for r in range(args.rounds):
                names = list(arms) if r % 2 == 0 else list(arms)[::-1]
                for name in names:
                    tree, sets, method = arms[name]
                    runs[name].append(measure(tree, sets, args, Path(tmp), f"{name}-{r}", method))
    finally:
        if args.against and not args.keep_worktree:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(arms[args.against][0])], capture_output=True)
    med = {name: report(name, rs) for name, rs in runs.items()}
    for name in arms:
        if name == ref:
            continue
        cur, old = med[name], med[ref]
        print(f"\n{name} / {ref}:")
        if len(methods) > 1:
            print(f"  {'derived':<46} {name:>10} {ref:>10} {'ratio':>7}")
            for k in cur["derived"]:
                a, b = cur["derived"][k], old["derived"][k]
                print(f"  {k:<46} {a:>10.3f} {b:>10.3f} {ratio(a, b):>7}")
            continue
        for ph in PHASES:
            print(f"  {ph:<8} CPU {cur[ph]['cpu'] / max(old[ph]['cpu'], 1e-9):.2f}x   "
                  f"peak RSS {cur[ph]['peak_mb'] / max(old[ph]['peak_mb'], 1e-9):.2f}x")
        for k in cur["derived"]:
            print(f"  {k}: {ratio(cur['derived'][k], old['derived'][k])}")
        d, where = metric_diff(runs[name][0]["metrics"], runs[ref][0]["metrics"])
        print(f"  metrics.jsonl, largest difference: {d:.3g} ({where})")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
