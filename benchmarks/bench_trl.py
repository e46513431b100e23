"""agentrl's GRPO step side by side with TRL's `GRPOTrainer`: generated tokens per CPU-second of
whole training steps, on one thread, on the same model folder (the shipped tiny `search` agent).

    pip install trl          # optional, not a dependency of agentrl: pulls accelerate, datasets,
                             # pyarrow, pandas, dill, xxhash, multiprocess (no new torch or
                             # transformers with transformers 5.24 / torch 2.13; measured: trl 1.16)
    OMP_NUM_THREADS=1 python benchmarks/bench_trl.py [--steps 4] [--warmup 1] [--rounds 1]
                                      [--set key=value] [--no-one-turn] [--json PATH]

Without trl installed the script prints one line and exits 2.

Each side runs in its own child process (one after the other; with `--rounds 2` and more the
order alternates), `torch.set_num_threads(1)`, for `--warmup` + `--steps` steps; the warm-up
steps are left out of every number. CPU times are `time.process_time()` (the whole process).

- agentrl: `agentrl_cli.train.loop.train` with `--method grpo` defaults (config.py / methods.py)
  and the `--set` overrides. A step is one call of the loop's `run_step`: the multi-turn
  rollout (generation with the KV-cache engine and the env's tool calls, `rollout.tasks_per_step`
  tasks x `rollout.group_size` episodes, each turn capped at `rollout.max_new_tokens`, an episode
  at `env.max_turns` turns and `rollout.max_tokens` tokens), collation, scoring (what the
  update cannot take from its own pass), the estimator, the update (forward + backward +
  optimiser step) and the weight sync to the engine.
  Left out: model loading, the held-out evaluations (base and final; shrunk here with
  `train.eval_tasks=4 train.eval_samples=1`, they only cost wall time), traces
  (`train.trace_every=0`), metrics rows and checkpoints. The rollout part is `rollouts.run`.
- TRL: `trl.GRPOTrainer` on the same model folder, prompts = the search env's first messages
  (system prompt + the task's question, the same tasks in the same order as agentrl's steps,
  `shuffle_dataset=False`) rendered with the folder's chat template (the prompt ids are checked
  to be agentrl's), `per_device_train_batch_size` = tasks x group, `num_generations` = group,
  `max_completion_length` = `rollout.max_new_tokens`, the same temperature / top_p (top_k off),
  learning rate, clip range, max grad norm; `beta=0` (agentrl's grpo has no KL term either),
  `loss_type="dapo"` (token mean over the batch, agentrl's `token-mean`), `scale_rewards="group"`,
  one optimiser step per generation batch (`num_iterations=1`, no gradient accumulation), AdamW
  betas (0.9, 0.99) and a constant rate as agentrl's, no activation checkpointing (GRPOConfig's
  default turns it on; agentrl's is off), float32, CPU, no vLLM, no logging / saving /
  evaluation. TRL IS SINGLE-TURN HERE: each completion is one assistant message of at most
  `max_new_tokens` tokens; the tool call it usually is never runs
  (TRL's tool loop parses tool calls through the chat template's tool-call format, which the tiny
  agent's plain-text `search(...)` actions do not use). The reward is a cheap string match:
  1 when the completion is `answer(X)` with X the gold answer (normalised as the env does), else
  0, so almost every group has no spread; TRL still runs the loss forward and backward. A step is
  `on_step_begin` .. `on_step_end` of a `TrainerCallback`: generation (`transformers`'
  `generate`, padded batch with a KV cache), reward, advantages, the loss forward + backward and
  the optimiser step. The rollout part is `GRPOTrainer._generate` (tokenisation, `generate`,
  decoding). Generated tokens are counted from the reward function's `completion_ids` (each
  completion up to and including its end-of-turn token, as agentrl counts).
- agentrl 1-turn (left out with `--no-one-turn`): agentrl with `env.max_turns=1`, the model
  folder named by path: the same one-message episodes as TRL's (same prompts, same tokens per
  completion), trained the same way; the like-for-like row of the comparison.

So agentrl's default steps generate several turns per episode, feed the env's observations back
and train on them (its update reads many more tokens per generated token: "learn tokens/step",
the real tokens of the batch the update reads); TRL's generate one turn. Tokens per CPU-second
compares the cost of a generated token inside a whole training step. agentrl's update forwards a
prefix shared by a group's episodes once (`train.tree_pack`, on by default; TRL forwards every
completion with its prompt): `--set train.tree_pack=false` measures agentrl without it.
The table prints means over the measured steps of every round and the smallest and largest CPU
seconds of one step; on a loaded machine CPU times vary by tens of percent (use `--rounds`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from agentrl_cli.app.train import train as checked_train

ROOT = Path(__file__).resolve().parents[1]
INSTALL = "pip install trl"
MISSING = f"bench_trl: trl is not installed (optional; {INSTALL}), nothing to compare against"
# settings that keep the steps the same and cut what the measurement leaves out
AGENTRL_SETS = ["train.trace_every=0", "train.save_every=0", "train.eval_every=0",
                "train.eval_tasks=4", "train.eval_samples=1"]
ANSWER = re.compile(r"^\s*answer\((.*)\)\s*$", re.S)


def trl_version() -> str | None:
    """trl's version, or None when it cannot be imported."""
    try:
        import trl
    except ImportError:
        return None
    return getattr(trl, "__version__", "?")


def run_config(steps: int, sets: list[str]):
    """agentrl's grpo config for a run of `steps` steps (both sides read their sizes from it)."""
    from agentrl_cli import config

    return config.load(method="grpo", sets=[f"train.steps={steps}"] + AGENTRL_SETS + list(sets))


def prompt_rows(cfg, tok, steps: int) -> list[dict]:
    """The first messages of the tasks agentrl's steps 1..`steps` draw, in order, rendered with
    `tok`'s chat template (system + user, ready to generate): TRL's dataset rows
    ({"prompt", "answer", "ids"}: "ids" are agentrl's prompt ids)."""
    from agentrl_cli.context import make_spec
    from agentrl_cli.models.chat import ChatFormat
    from agentrl_cli.rollout.tasks import TaskSampler

    spec = make_spec(cfg)
    env = spec.make()
    fmt = ChatFormat.from_tokenizer(tok)
    sampler = TaskSampler(spec.tasks("train"), cfg.seed, cfg.rollout.tasks_per_step)
    rows = []
    for step in range(1, steps + 1):
        for task in sampler.for_step(step):
            user = env.reset(task)
            msgs = [{"role": "system", "content": env.system_prompt},
                    {"role": "user", "content": user}]
            text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            rows.append({"prompt": text, "answer": task.answer,
                         "ids": fmt.prompt_ids(env.system_prompt, user)})
    return rows


def answer_reward(completions: list[str], answer: list[str]) -> list[float]:
    """1.0 for a completion `answer(X)` whose X is the gold answer (the env's normalisation)."""
    from agentrl_cli.envs.search import normalize_answer

    out = []
    for text, gold in zip(completions, answer):
        m = ANSWER.match(text)
        out.append(float(m is not None and normalize_answer(m.group(1)) == normalize_answer(gold)))
    return out


# ------------------------------------------------------------------------------ children
def agentrl_child(args) -> dict:
    import torch

    torch.set_num_threads(1)
    import agentrl_cli
    from agentrl_cli.train import loop

    steps: list[dict] = []
    roll = {"cpu": 0.0, "tokens": 0, "episodes": 0, "turns": 0}
    learn = {"tokens": 0}
    orig_step, orig_open, orig_update = loop.run_step, loop.open_rollouts, loop.update

    def run_step(run, step):
        roll.update(cpu=0.0, tokens=0, episodes=0, turns=0)
        learn["tokens"] = 0
        c, w = time.process_time(), time.perf_counter()
        row = orig_step(run, step)
        steps.append({"cpu": time.process_time() - c, "wall": time.perf_counter() - w,
                      "rollout_cpu": roll["cpu"], "tokens": roll["tokens"],
                      "episodes": roll["episodes"], "turns": roll["turns"],
                      "learn_tokens": learn["tokens"]})
        return row

    def open_rollouts(*a, **kw):
        r = orig_open(*a, **kw)
        inner = r.run

        def timed(*a, **kw):
            c = time.process_time()
            result = inner(*a, **kw)
            roll["cpu"] += time.process_time() - c
            roll["tokens"] += int(result.tokens)
            roll["episodes"] += len(result.episodes)
            roll["turns"] += sum(e.num_turns for e in result.episodes)
            return result
        r.run = timed
        return r

    def update(learner, batch, *a, **kw):
        learn["tokens"] += int(batch.attention_mask.sum())
        return orig_update(learner, batch, *a, **kw)

    loop.run_step, loop.open_rollouts, loop.update = run_step, open_rollouts, update
    cfg = run_config(args.warmup + args.steps, args.set)
    checked_train(cfg, Path(args.out), log=lambda s: None)
    import transformers
    if Path(agentrl_cli.__file__).resolve().parents[1] != ROOT:
        raise SystemExit(f"bench_trl: imported agentrl_cli from {agentrl_cli.__file__}, not {ROOT}")
    return {"steps": steps, "versions": {"torch": torch.__version__,
                                         "transformers": transformers.__version__}}


def trl_child(args) -> dict:
    import torch

    torch.set_num_threads(1)
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agentrl_cli.app.tiny_build import ensure_model

    cfg = run_config(args.warmup + args.steps, args.set)
    path = ensure_model(cfg, log=lambda s: None)
    tok = AutoTokenizer.from_pretrained(path)
    total = args.warmup + args.steps
    rows = prompt_rows(cfg, tok, total)
    for r in rows:                                 # TRL tokenises the text itself: same ids?
        if tok(r["prompt"], add_special_tokens=True)["input_ids"] != r["ids"]:
            raise SystemExit("bench_trl: TRL's prompt ids differ from agentrl's")
    data = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    ro, tr, al = cfg.rollout, cfg.train, cfg.algo
    cur = {"tokens": 0, "completions": 0, "rollout_cpu": 0.0, "learn_tokens": 0}
    steps: list[dict] = []

    def reward(completions, answer, completion_ids=None, **kw):
        cur["tokens"] += sum(len(ids) for ids in completion_ids)
        cur["completions"] += len(completion_ids)
        return answer_reward(completions, answer)
    reward.__name__ = "answer_match"

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **kw):
            cur.update(tokens=0, completions=0, rollout_cpu=0.0, learn_tokens=0)
            self.c, self.w = time.process_time(), time.perf_counter()

        def on_step_end(self, *a, **kw):
            steps.append({"cpu": time.process_time() - self.c, "wall": time.perf_counter() - self.w,
                          "rollout_cpu": cur["rollout_cpu"], "tokens": cur["tokens"],
                          "episodes": cur["completions"], "turns": cur["completions"],
                          "learn_tokens": cur["learn_tokens"]})

    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    checkpointing = ("activation_checkpointing" if "activation_checkpointing" in fields
                     else "gradient_checkpointing")
    gcfg = GRPOConfig(
        output_dir=str(Path(args.out)), max_steps=total, seed=cfg.seed,
        per_device_train_batch_size=ro.tasks_per_step * ro.group_size,
        gradient_accumulation_steps=1, num_generations=ro.group_size, num_iterations=1,
        max_completion_length=ro.max_new_tokens, temperature=ro.temperature, top_p=ro.top_p,
        top_k=0, learning_rate=tr.lr, weight_decay=tr.weight_decay, max_grad_norm=tr.grad_clip,
        epsilon=al.eps_low, epsilon_high=al.eps_high, beta=0.0, loss_type="dapo",
        scale_rewards="group", shuffle_dataset=False, use_vllm=False, use_cpu=True, bf16=False,
        fp16=False, report_to="none", logging_strategy="no", save_strategy="no",
        eval_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
        adam_beta2=0.99, lr_scheduler_type="constant", model_init_kwargs={"dtype": torch.float32},
        **{checkpointing: False})   # GRPOConfig turns activation checkpointing on by default
    trainer = GRPOTrainer(model=path, reward_funcs=reward, args=gcfg, train_dataset=data,
                          processing_class=tok, callbacks=[Timer()])
    generate, compute_loss = trainer._generate, trainer.compute_loss

    def timed_generate(*a, **kw):
        c = time.process_time()
        try:
            return generate(*a, **kw)
        finally:
            cur["rollout_cpu"] += time.process_time() - c

    def counted_loss(model, inputs, *a, **kw):
        cur["learn_tokens"] += int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())
        return compute_loss(model, inputs, *a, **kw)

    trainer._generate, trainer.compute_loss = timed_generate, counted_loss
    trainer.train()
    return {"steps": steps, "versions": {"trl": trl.__version__, "torch": torch.__version__,
                                         "transformers": transformers.__version__}}


# ------------------------------------------------------------------------------ parent
def summary(steps: list[dict], warmup: int) -> dict:
    """Per-step means and rates over the measured steps (the first `warmup` left out)."""
    kept = steps[warmup:]
    if not kept:
        raise ValueError(f"no measured steps ({len(steps)} steps, {warmup} warm-up)")
    n = len(kept)
    tot = {k: sum(s[k] for s in kept) for k in ("cpu", "wall", "rollout_cpu", "tokens",
                                                 "episodes", "turns", "learn_tokens")}
    return {
        "steps": n,
        "tokens/step": tot["tokens"] / n,
        "episodes/step": tot["episodes"] / n,
        "tokens/episode": tot["tokens"] / max(tot["episodes"], 1),
        "turns/episode": tot["turns"] / max(tot["episodes"], 1),
        "learn tokens/step": tot["learn_tokens"] / n,
        "CPU s/step": tot["cpu"] / n,
        "rollout CPU s/step": tot["rollout_cpu"] / n,
        "tok/CPU s (step)": tot["tokens"] / max(tot["cpu"], 1e-9),
        "tok/CPU s (rollout)": tot["tokens"] / max(tot["rollout_cpu"], 1e-9),
        "CPU s/step spread": (min(s["cpu"] for s in kept), max(s["cpu"] for s in kept)),
    }


ROWS = ("episodes/step", "turns/episode", "tokens/episode", "tokens/step", "learn tokens/step",
        "CPU s/step", "rollout CPU s/step", "tok/CPU s (step)", "tok/CPU s (rollout)")
RATIOS = ("tok/CPU s (step)", "tok/CPU s (rollout)")
REF = "TRL"
ONE_TURN = "agentrl 1-turn"


def _num(x: float) -> str:
    return f"{x:.1f}" if x >= 10 else f"{x:.3f}"


def table(sums: dict[str, dict]) -> list[str]:
    """The side-by-side table of `summary` results, one column per arm (`REF` = "TRL" among
    them), then each other arm's ratio to TRL of the two throughputs."""
    ref = sums[REF]
    others = [k for k in sums if k != REF]
    names = others + [REF]
    heads = [f"{k}/{REF}" if k == "agentrl" else f"{k.split()[-1]}/{REF}" for k in others]
    w = max(12, *(len(n) + 1 for n in names))
    lines = ["  " + f"{'':<22}" + "".join(f"{n:>{w}}" for n in names)
             + "".join(f"{h:>{w}}" for h in heads)]
    for k in ROWS:
        ratios = [f"{sums[o][k] / ref[k]:.2f}x" if k in RATIOS and ref[k] > 0 else ""
                  for o in others]
        lines.append("  " + f"{k:<22}" + "".join(f"{_num(sums[n][k]):>{w}}" for n in names)
                     + "".join(f"{r:>{w}}" for r in ratios))
    spread = ["{:.2f}..{:.2f}".format(*sums[n]["CPU s/step spread"]) for n in names]
    lines.append("  " + f"{'CPU s/step min..max':<22}" + "".join(f"{x:>{w}}" for x in spread))
    return lines


def build() -> str:
    """The measured agentrl tree: HEAD's short hash, and the package files changed from it."""
    git = lambda *a: subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True,
                                    text=True).stdout.rstrip()
    dirty = git("status", "--porcelain", "--", "agentrl_cli").splitlines()
    rev = git("rev-parse", "--short", "HEAD") or "unknown"
    return rev + (f" + uncommitted changes to {', '.join(l[3:] for l in dirty)}" if dirty else "")


def arms(args, model: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (child kind, extra agentrl overrides). The 1-turn arm is agentrl with episodes
    cut after their first turn (`env.max_turns=1`), loading the same folder by path (the `tiny`
    name would key a build on the changed env section)."""
    out = {"agentrl": ("agentrl", [])}
    if not args.no_one_turn:
        out[ONE_TURN] = ("agentrl", ["env.max_turns=1", f"model.name={model}"])
    out[REF] = ("trl", [])
    return out


def measure(kind: str, sets: list[str], args, tmp: Path, tag: str) -> dict:
    dest = tmp / f"{tag}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--dest", str(dest),
           "--out", str(tmp / f"run-{tag}"), "--steps", str(args.steps),
           "--warmup", str(args.warmup)] + [x for s in args.set + sets for x in ("--set", s)]
    done = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True)
    if done.returncode != 0:               # the child's own output only when it failed
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"bench_trl: the {tag} child failed (exit {done.returncode})")
    return json.loads(dest.read_text())


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="measured steps per side")
    ap.add_argument("--warmup", type=int, default=1, help="first steps left out")
    ap.add_argument("--rounds", type=int, default=1, help="runs per side (order alternates)")
    ap.add_argument("--set", action="append", default=[],
                    help="an agentrl config override, read by both sides (repeatable)")
    ap.add_argument("--no-one-turn", action="store_true",
                    help="leave out the agentrl arm cut to one turn per episode")
    ap.add_argument("--json", default="", help="write every step's numbers here")
    ap.add_argument("--child", choices=("agentrl", "trl"), default="", help=argparse.SUPPRESS)
    ap.add_argument("--dest", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.rounds < 1:
        ap.error("--steps and --rounds must be >= 1, --warmup >= 0")
    return args


def main(argv=None) -> None:
    args = parse(argv)
    if args.child:
        result = (agentrl_child if args.child == "agentrl" else trl_child)(args)
        Path(args.dest).write_text(json.dumps(result))
        return
    if trl_version() is None:
        print(MISSING)
        raise SystemExit(2)
    from agentrl_cli.app.tiny_build import ensure_model

    cfg = run_config(args.warmup + args.steps, args.set)
    model = ensure_model(cfg, log=lambda s: None)
    ro = cfg.rollout
    print(f"bench_trl: agentrl grpo vs trl.GRPOTrainer, 1 thread, {args.warmup} warm-up + "
          f"{args.steps} measured steps per arm, {args.rounds} round(s); per step "
          f"{ro.tasks_per_step} prompts x {ro.group_size} completions, <= {ro.max_new_tokens} new "
          f"tokens per turn, temperature {ro.temperature}, lr {cfg.train.lr}, model {model}"
          + "".join(f", --set {s}" for s in args.set))
    plan = arms(args, model)
    runs: dict[str, list[dict]] = {k: [] for k in plan}
    with tempfile.TemporaryDirectory(prefix="bench-trl-") as tmp:
        for r in range(args.rounds):
            for name in (list(plan) if r % 2 == 0 else list(plan)[::-1]):
                kind, sets = plan[name]
                tag = f"{name.replace(' ', '-')}-{r}"
                runs[name].append(measure(kind, sets, args, Path(tmp), tag))
    sums = {k: summary([s for run in rs for s in run["steps"][args.warmup:]], 0)
            for k, rs in runs.items()}
    v = runs[REF][0]["versions"]
    print(f"\nmeans over {args.steps * args.rounds} measured steps per arm "
          f"(CPU = time.process_time of the arm's child process)")
    print("\n".join(table(sums)))
    print(f"\nagentrl: multi-turn episodes (<= {cfg.env.max_turns} turns; the env's tool calls run "
          f"and their observations are fed back and trained on). TRL: single-turn, one completion "
          f"of <= {ro.max_new_tokens} tokens per prompt, no tool runs."
          + (f" {ONE_TURN}: agentrl with env.max_turns=1 (the same one-message episodes as TRL)."
             if ONE_TURN in sums else ""))
    print(f"versions: trl {v['trl']}, transformers {v['transformers']}, torch {v['torch']}; "
          f"agentrl {build()}")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
