"""Building the tiny agent: a supervised warm-up of the model `models/tiny.py` describes, on
*imperfect* expert demonstrations of a built-in env, then a fit of its critic.

The steps, in order (one seeded `random.Random` and one `torch.Generator` run through them, so
a recipe always gives the same model): a tokenizer trained on expert transcripts (`_corpus`),
the untrained model (`models.tiny.make_model`), the demonstrations (`_demonstrations`), the
warm-up (`_warm_up`: one `_sft_step` per step, `_held_out_success` at the checks) and the warm
critic (`fit_value_head`). The folder is published under the recipe's cache key
(`models.tiny.tiny_path`) by `ensure_tiny`.

The warm-up runs a cosine learning-rate schedule over `max_steps` (annealing gave steadier
final models than a constant rate) and, from `eval_start`, checks success (sampled, temperature
1) on `dev_tasks` training questions that the demonstrations leave out; it stops at the first
check that reaches `target_success` and otherwise keeps the best checkpoint (the later one on a
tie). A stopping check above `CEILING` (0.5: RL needs room above the start) goes back to the
snapshots taken since the check before (every eighth of a check interval; at most 32 before the
first check), bisects them and keeps the one nearest the band [target_success, 0.5]: a small
env is learnt in a few hundred steps. Why the check: the model learns to read the question's
relation late and abruptly (dev success
0.1 -> 0.3-0.5 within a few hundred steps), and *when* depends on float rounding, so the same
recipe gave held-out success 0.10 on one 2-core machine and 0.20 on another when it kept a
fixed last step; training until a check reaches `target_success` gives every machine a model just
past that jump. One held-out check of the kept model is logged (`base_success` in
`recipe.json`). The demonstrator opens a
distractor document with probability `error_rate` and follows it, so even perfect imitation
succeeds only about (1 - error_rate)^hops of the time: RL has room above.

Commands resolve `--model tiny` to the built folder here (`ensure_model`) before any work; the
libraries below `train/` only look the folder up (`models.loading.model_path`).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import random
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

from ..config import RunConfig
from ..engines.base import SamplingParams
from ..engines.hf import HFEngine
from ..envs.base import has_expert, make_env_spec
from ..errors import ConfigError
from ..models import loading
from ..models.chat import ChatFormat
from ..models.sequences import hidden_states, pad_episodes, token_logprobs
from ..models.tiny import (TinyRecipe, VALUE_HEAD, cache_path, cache_root, is_built, make_model,
                           nearest_shipped, shipped_builds, shipped_path, tiny_path,
                           train_tokenizer)
from ..rollout.runner import run_episodes, run_expert
from ..train.checkpoint import sha256_file

BUILD_THREADS = 2
# a starting agent above this dev success leaves RL little room: a warm-up whose stopping check
# passes it goes back to a snapshot since the check before (`_walk_back`)
CEILING = 0.5
SNAPSHOTS = 32        # at most this many snapshots before the first check
ESTIMATE_STEPS = 20   # the warm-up's time estimate: after this many steps, or
ESTIMATE_S = 5.0      # after this many seconds if sooner
BUILD_LOCK = ".building"      # held (flock) by a live builder inside its temp folder
_BUILD_TMP = re.compile(r"^tiny-[^.]+\.[a-z0-9_]{8}$")


# ------------------------------------------------------------------ the command boundary
def ensure_model(cfg: RunConfig, log: Callable[[str], None] = print) -> str:
    """The model folder (or hub id) `cfg.model.name` names, building the tiny model once when
    it names `tiny`: what every command calls before the libraries receive the folder."""
    if cfg.model.name == "tiny":
        ensure_tiny(loading.tiny_recipe(cfg), log)
    return loading.model_path(cfg)


def load_policy(cfg: RunConfig, log: Callable[[str], None] = print):
    """`models.loading.load_policy` after `ensure_model`: the trainer's initial policy."""
    ensure_model(cfg, log)
    return loading.load_policy(cfg, log)


def clean_stale_builds(root: Path | None = None, log: Callable[[str], None] = print,
                       max_age_s: float = 86_400.0) -> list[Path]:
    """Remove the temp folders (`tiny-*.xxxxxxxx`) of builds whose builder is gone: its lock is
    free (the kernel releases it when the process dies, however it dies), or, for a folder
    without a lock (older builds), it is older than `max_age_s`. A live build is left alone."""
    root = cache_root() if root is None else Path(root)
    removed = []
    for p in root.glob("tiny-*.*") if root.is_dir() else []:
        if not _BUILD_TMP.match(p.name) or not p.is_dir() or p.is_symlink():
            continue
        lock = p / BUILD_LOCK
        if lock.is_file():
            try:
                fd = os.open(lock, os.O_RDWR)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)              # a live builder
                continue
            shutil.rmtree(p, ignore_errors=True)
            os.close(fd)
        elif time.time() - p.stat().st_mtime > max_age_s:
            shutil.rmtree(p, ignore_errors=True)
        else:
            continue
        removed.append(p)
    if removed:
        log(f"removed {len(removed)} unfinished tiny-model build(s) from {root}: "
            + ", ".join(p.name for p in removed))
    return removed


WORLD_EPISODES = 3    # expert episodes a build's world fingerprint hashes


def world_fingerprint(recipe: TinyRecipe) -> str | None:
    """A short hash of the world the recipe's env shows: its scripted expert's first
    `WORLD_EPISODES` training episodes at error rate 0 (system prompt, every observation and
    action, rewards). None when the env has no expert. A build records it (`recipe.json`
    `world`), so a build made before the env's observations, actions or tasks changed is
    told apart from one of the env as it is now, though the recipe (and its key) is the
    same."""
    spec = recipe_spec(recipe)
    if not has_expert(spec):
        return None
    rng, h = random.Random(0), hashlib.sha256()
    for task in spec.tasks("train", WORLD_EPISODES):
        env = spec.make()
        h.update(f"{env.system_prompt}\x00{env.reset(task)}".encode())
        for _ in range(recipe.env.max_turns):
            action = spec.expert(env, rng, 0.0)
            r = env.step(action)
            h.update(f"\x00{action}\x00{r.observation}\x00{r.reward}".encode())
            if r.terminated or r.truncated:
                break
    return h.hexdigest()[:12]


def stale_world(recipe: TinyRecipe, path: Path) -> str | None:
    """How the build at `path` differs from the recipe's env now ("made for world A, the env
    now gives B"), or None: the same world, or the build records none (an older build)."""
    try:
        built = json.loads((Path(path) / "recipe.json").read_text()).get("world")
    except (OSError, ValueError, AttributeError):
        return None
    now = world_fingerprint(recipe) if built else None
    if not built or now is None or now == built:
        return None
    return f"made for world {built}, the env now gives {now}"


def ensure_tiny(recipe: TinyRecipe, log: Callable[[str], None] = print) -> Path:
    """Return the folder of the tiny model: the build that ships with the package for this
    recipe, else the cache's, building it there (once) if absent, or again when the env has
    changed since (`stale_world`: its expert's episodes differ). The build runs in a temp
    folder that holds a lock while it lives and is renamed into place when done; builds killed
    half-way are removed here (`clean_stale_builds`)."""
    path = tiny_path(recipe)
    clean_stale_builds(cache_path(recipe).parent, log)
    if is_built(path):
        stale = stale_world(recipe, path)
        if stale is None:
            return path
        if path != cache_path(recipe):
            raise ConfigError(f"the tiny agent that ships for env '{recipe.env.name}' ({path}) "
                              f"does not fit the env: {stale}; rebuild it with agentrl "
                              "build-tiny (or give --model PATH)")
        log(f"tiny: env '{recipe.env.name}' changed since its cached tiny agent was built "
            f"({stale}): building it again")
        shutil.rmtree(path)
    if recipe.max_steps > 0:
        log(build_notice(recipe, path))
    publish_build(recipe, path, log)
    return path


def build_notice(recipe: TinyRecipe, path: Path) -> str:
    """The line before a build: why it runs, how long the shipped builds took (measured, their
    recipe.json), and the command that avoids it (a shipped build of the same env a few
    `--set`s away, else --model PATH or a shorter warm-up)."""
    took = sorted((info["build_seconds"], folder.name) for folder, info in shipped_builds()
                  if info.get("build_seconds") and info.get("recipe", {}).get("max_steps") ==
                  recipe.max_steps)
    same = [f"'{name}' {sec / 60:.0f} min" for sec, name in took
            if name == recipe.env.name]
    span = (f"the shipped builds of up to {recipe.max_steps} steps took "
            f"{took[0][0] / 60:.0f}-{took[-1][0] / 60:.0f} min each, median "
            f"{took[len(took) // 2][0] / 60:.0f}, on 2 threads"
            + (f" ({same[0]})" if same else "") + " (their recipe.json), longer on a busy machine"
            if took else "its time is estimated from its first measured warm-up steps below")
    near = nearest_shipped(recipe)
    avoid = (f"the package ships '{near[0].name}' for env '{recipe.env.name}': "
             + " ".join(f"--set {s}" for s in near[1]) + " starts from it at once; or "
             if near and near[1] else "")
    return (f"tiny: building the tiny agent for env '{recipe.env.name}' (recipe key "
            f"{recipe.key()}; no build of it ships with the package) into {path}: a supervised "
            f"warm-up of up to {recipe.max_steps} steps; {span}. It is built once and cached. "
            f"To skip it: {avoid}--model PATH (any local Hugging Face folder), or a shorter "
            f"warm-up (--set model.tiny_warmup_steps=N)")


def publish_build(recipe: TinyRecipe, path: Path, log: Callable[[str], None] = print,
                  threads: int | None = None) -> dict:
    """Build `recipe` into `path`: in a locked temp folder beside it, renamed into place when
    complete (a concurrent builder of the same recipe may win the rename: its build is kept)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".", dir=path.parent))
    fd = os.open(tmp / BUILD_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        info = build_tiny(recipe, tmp, log, threads)
        (tmp / BUILD_LOCK).unlink()       # not part of the model; still held through fd
        try:
            os.replace(tmp, path)  # atomic publish; a concurrent builder may have won
        except OSError:
            if not is_built(path):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(fd)
    return info


def rebuild(recipe: TinyRecipe, out: Path, log: Callable[[str], None] = print,
            threads: int | None = None) -> dict:
    """`agentrl build-tiny`: remake `recipe` from scratch into the new folder `out`, and compare
    it with the build that ships with the package (if one does) -> the build's `recipe.json`
    plus `shipped` (its folder) and `identical` (the same weights, byte for byte)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out} exists and is not empty: give a new folder")
    if out.exists():
        out.rmdir()                          # empty: published by rename below
    info = publish_build(recipe, out.resolve(), log, threads)
    shipped = shipped_path(recipe)
    info["shipped"] = None if shipped is None else str(shipped)
    info["identical"] = None if shipped is None else (
        sha256_file(shipped / "model.safetensors") == sha256_file(out / "model.safetensors"))
    return info


# ------------------------------------------------------------------------------ building
def recipe_spec(recipe: TinyRecipe, seed: int | None = None):
    """The env spec the recipe warms up on (its world at `seed`, default the env's own)."""
    return make_env_spec(recipe.env, seed)


def _transcript_weights(batch, attn: torch.Tensor, obs_weight: float) -> torch.Tensor:
    """[B, L]: 1 on policy tokens, `obs_weight` on observation tokens, 0 on prompt / padding."""
    w = torch.zeros(attn.shape)
    for i, e in enumerate(batch):
        first = e.turns[0].start if e.turns else len(e.token_ids)
        row = torch.tensor(e.response_mask, dtype=torch.float)
        row[first:] = torch.where(row[first:] > 0, 1.0, obs_weight)
        w[i, :len(row)] = row
    return w


@torch.no_grad()
def fit_value_head(model, engine, fmt, spec, tasks, n_episodes: int, max_tokens: int,
                   gen: torch.Generator, path: Path) -> dict:
    """A warm critic for the methods that need one (FOCUS above all: its allocator and its
    TD advantages are only as good as V). The warmed-up model samples `n_episodes` on training
    tasks (temperature 1); every turn-start state gets its episode's outcome as target (a
    Monte-Carlo value of the base policy); a ridge regression of those targets on the state's
    last hidden state (the same features the trainer's value head reads) gives the head's
    weight and bias, saved as `path` (safetensors, the `torch.nn.Linear` state dict). The
    trainer starts its value head from it (`train.learner.build_learner`)."""
    picks = [(tasks[i % len(tasks)], 0) for i in range(n_episodes)]
    eps = run_episodes(engine, fmt, spec, picks, SamplingParams(temperature=1.0, max_new_tokens=32),
                       max_tokens=max_tokens, batch_size=64, generator=gen)
    feats, ys = [], []
    for i in range(0, len(eps), 32):
        chunk = eps[i:i + 32]
        ids, _, attn = pad_episodes(chunk, fmt.pad_id)
        h = hidden_states(model, ids, attn).float()
        for b, e in enumerate(chunk):
            for t in e.turns:              # the state before each assistant turn
                feats.append(h[b, t.start - 1])
                ys.append(float(e.reward))
    X = torch.stack(feats).double()
    y = torch.tensor(ys, dtype=torch.float64)
    mu = X.mean(0)
    Xc = X - mu
    gram = Xc.T @ Xc
    ridge = 1e-3 * float(torch.trace(gram)) / X.shape[1] + 1e-9   # relative to the features' scale
    w = torch.linalg.solve(gram + ridge * torch.eye(X.shape[1], dtype=X.dtype), Xc.T @ (y - y.mean()))
    b = y.mean() - mu @ w
    pred = (X @ w + b).clamp(0, 1)
    save_file({"weight": w.float().unsqueeze(0).contiguous(), "bias": b.float().reshape(1)}, str(path))
    return {"states": len(y), "success": sum(e.success for e in eps) / len(eps),
            "mse": float(((pred - y) ** 2).mean()), "mse_const": float(y.var(unbiased=False))}


def _demo_worlds(recipe: TinyRecipe, spec) -> list[tuple[object, list]]:
    """(spec, training tasks) of every world the demonstrations come from. World 0 is the env
    the agent is evaluated and trained on; the others are the same generator at other seeds, so
    names, ids and facts never repeat often enough to be memorised: copying from the context is
    the only way to imitate them (one world let the model memorise names and doc ids instead)."""
    worlds = [(spec, _split_dev(recipe, spec.tasks("train"))[0])]
    k = 0
    while len(worlds) < recipe.demo_worlds and k < 4 * recipe.demo_worlds:
        k += 1
        try:
            other = recipe_spec(recipe, seed=recipe.env.seed + 7919 * k)
            worlds.append((other, other.tasks("train")))
        except ValueError:        # a world with too few questions of the asked size: skip it
            continue
    return worlds


def _split_dev(recipe: TinyRecipe, tasks: list) -> tuple[list, list]:
    """(demonstrated, dev): `dev_tasks` training questions (at most a fifth), evenly spaced
    through the split so they mix its kinds (the search env's split ends with 3-hop questions
    only), are the warm-up's checks and never demonstrated."""
    k = min(recipe.dev_tasks, len(tasks) // 5)
    picks = {i * len(tasks) // k for i in range(k)} if k else set()
    return ([t for i, t in enumerate(tasks) if i not in picks],
            [t for i, t in enumerate(tasks) if i in picks])


def _decay(recipe: TinyRecipe, step: int) -> float:
    if recipe.lr_schedule == "constant":
        return 1.0
    if recipe.lr_schedule == "cosine":   # to 10% of the peak at max_steps
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, step / recipe.max_steps)))
    raise ValueError(f"unknown lr_schedule '{recipe.lr_schedule}' (constant, cosine)")


def build_threads(threads: int | None = None) -> int:
    """The torch threads of a build: `threads` (`agentrl build-tiny --threads`), else
    `OMP_NUM_THREADS` when it is a positive whole number, else `BUILD_THREADS`."""
    if threads is not None:
        return max(1, int(threads))
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(env) if env.isdigit() and int(env) > 0 else BUILD_THREADS


def build_tiny(recipe: TinyRecipe, out: Path, log: Callable[[str], None] = print,
               threads: int | None = None) -> dict:
    """Build on `build_threads(threads)` torch threads (default `BUILD_THREADS`, the shipped
    builds' count): float reductions depend on the thread count, so a fixed count makes the
    same recipe give the same model on any machine (a laptop defaults to more threads than a
    2-core CI box). Two: 1.8x faster than one on an idle 2-core machine
    (`benchmarks/bench_warmup_step.py`); on a busy one the two OpenMP threads can stall each
    other, so `OMP_NUM_THREADS=1` (or `--threads 1`) builds on one."""
    before = torch.get_num_threads()
    torch.set_num_threads(build_threads(threads))
    try:
        return _build_tiny(recipe, out, log)
    finally:
        torch.set_num_threads(before)


def _corpus(recipe: TinyRecipe, spec, worlds, n_train: int, rng: random.Random,
            log: Callable[[str], None] = print) -> list[str]:
    """The tokenizer's training texts: expert transcripts (perfect and imperfect, alternately)
    of training tasks of every world, and the chat roles. After `ESTIMATE_S` seconds one line
    says how far it is and how long the rest takes at the measured pace."""
    texts: list[str] = []
    probe_env = spec.make()
    texts.append(probe_env.system_prompt)
    per_world = max(1, n_train // len(worlds))
    total, t0, said = sum(len(ts[:per_world]) for _, ts in worlds), time.time(), False
    for i, (w, task) in enumerate((w, t) for w, ts in worlds for t in ts[:per_world]):
        if not said and i and time.time() - t0 > ESTIMATE_S:
            spent = time.time() - t0
            said = log(f"tiny: tokenizer corpus: {i}/{total} expert transcripts in {spent:.0f}s "
                       f"(about {spent / i * (total - i):.0f}s more, measured; then "
                       f"{recipe.demos} demonstrations and the warm-up)") or True
        env = w.make()
        texts.append(env.reset(task))
        for _ in range(recipe.env.max_turns):
            action = w.expert(env, rng, recipe.error_rate if i % 2 else 0.0)
            res = env.step(action)
            texts.append(action)
            if res.observation:
                texts.append(res.observation)
            if res.terminated or res.truncated:
                break
    texts += ["user", "assistant", "tool", "system", "error"]
    return texts


def _demonstrations(recipe: TinyRecipe, worlds, fmt, rng: random.Random) -> list:
    """`recipe.demos` imperfect expert episodes spread over the worlds, shortest first (a batch
    of neighbours then wastes little on padding)."""
    demos = []
    for k, (w, ts) in enumerate(worlds):
        n = recipe.demos // len(worlds) + (k < recipe.demos % len(worlds))
        looks = w.tasks("lookup") if recipe.lookup_share > 0 else []
        picks = [((looks[rng.randrange(len(looks))] if looks and rng.random() < recipe.lookup_share
                   else ts[rng.randrange(len(ts))]), 0) for _ in range(n)]
        demos += run_expert(fmt, w, picks, max_tokens=recipe.max_positions,
                            seed=recipe.seed + k, error_rate=recipe.error_rate)
    return demos


def _sft_step(model, opt, batch, fmt, recipe: TinyRecipe, lr: float) -> torch.Tensor:
    """One supervised step on a batch of demonstrations; returns the loss."""
    for g in opt.param_groups:
        g["lr"] = lr
    ids, mask, attn = pad_episodes(batch, fmt.pad_id)
    model.train()
    logp = token_logprobs(model, ids, attn)
    # Warm-up loss on every transcript token after the prompt, observations included:
    # predicting search results and documents teaches the copy circuits (names, doc ids)
    # several times faster than the few policy tokens alone. RL later trains policy tokens
    # only (the response mask); this is language-model pre-training on the env's text.
    weight = _transcript_weights(batch, attn, recipe.obs_weight)
    loss = -(logp * weight[:, 1:]).sum() / weight[:, 1:].sum()
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


def _success(model, engine, fmt, spec, tasks, samples: int, recipe: TinyRecipe,
             gen: torch.Generator) -> float:
    """Success of `samples` sampled episodes (temperature 1) per task."""
    model.eval()
    params = SamplingParams(temperature=1.0, max_new_tokens=32)
    eps = run_episodes(engine, fmt, spec, [(t, 0) for t in tasks for _ in range(samples)],
                       params, max_tokens=recipe.max_positions, batch_size=96, generator=gen)
    return sum(e.success for e in eps) / len(eps)


def _warm_up(recipe: TinyRecipe, model, engine, fmt, spec, demos, dev_tasks,
             rng: random.Random, gen: torch.Generator, log: Callable[[str], None]):
    """The supervised warm-up -> (kept step, its dev success, the checks' history); the model
    ends holding the kept checkpoint (the best dev check, the later on a tie; the last step
    without dev tasks). A check that stops the warm-up above `CEILING` walks back through the
    snapshots taken since the check before it (`_walk_back`)."""
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0)
    t0 = time.time()
    history = []
    best = (-1.0, 0, None)          # (dev success, step, state)
    since: list[tuple[int, dict]] = []   # snapshots since the last check, for `_walk_back`
    every = max(1, recipe.eval_every // 8, recipe.eval_start // SNAPSHOTS)
    step, estimated = 0, False
    for step in range(1, recipe.max_steps + 1):
        lr = recipe.lr * min(1.0, step / 20) * _decay(recipe, step)
        # demos are sorted by length, so a batch of neighbours wastes little on padding
        start = rng.randrange(len(demos) - recipe.batch_size + 1)
        loss = _sft_step(model, opt, demos[start:start + recipe.batch_size], fmt, recipe, lr)
        if not estimated and (step == ESTIMATE_STEPS or time.time() - t0 > ESTIMATE_S):
            estimated = log(warmup_estimate(recipe, step, time.time() - t0)) or True
        if step % recipe.eval_every == 0 and step < recipe.eval_start:
            spent = time.time() - t0
            log(f"tiny: warm-up step {step}/{recipe.max_steps} loss {float(loss.detach()):.3f} "
                f"({spent:.0f}s; checks of dev success from step {recipe.eval_start}, about "
                f"{spent / step * (recipe.eval_start - step):.0f}s from now)")
        if dev_tasks and (step == recipe.max_steps
                          or step >= recipe.eval_start and step % recipe.eval_every == 0):
            success = _success(model, engine, fmt, spec, dev_tasks, recipe.dev_samples, recipe, gen)
            history.append({"step": step, "loss": float(loss.detach()), "dev_success": success})
            log(f"tiny: warm-up step {step} loss {float(loss.detach()):.3f} dev success {success:.2f}")
            if success >= best[0]:
                best = (success, step, _state(model))
            if success >= recipe.target_success:
                if success > CEILING > recipe.target_success:
                    best = _walk_back(recipe, model, engine, fmt, spec, dev_tasks, gen, best,
                                      since, history, log)
                break
            since = []
        elif dev_tasks and step % every == 0:
            since.append((step, _state(model)))
    if best[2] is None:
        return step, None, history
    model.load_state_dict(best[2])
    if best[1] != step:
        log(f"tiny: kept the checkpoint of step {best[1]} (dev success {best[0]:.2f})")
    if best[0] < recipe.target_success:
        log(not_reached(recipe, best[0], best[1]))
    return best[1], best[0], history


def warmup_estimate(recipe: TinyRecipe, step: int, spent: float) -> str:
    """The warm-up's first progress line: the time of its first `step` steps, measured, and
    what it gives for the whole warm-up (the dev checks come on top)."""
    per = spent / max(step, 1)
    checks = (f", plus a dev check every {recipe.eval_every} steps from step "
              f"{recipe.eval_start} (it stops at the first that reaches "
              f"{recipe.target_success:.2f})" if recipe.eval_start < recipe.max_steps else "")
    return (f"tiny: warm-up step {step}/{recipe.max_steps}: {per:.2f}s a step on "
            f"{torch.get_num_threads()} thread(s), measured; at most {recipe.max_steps} steps: "
            f"about {per * recipe.max_steps / 60:.1f} min{checks}")


def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _band_distance(recipe: TinyRecipe, success: float) -> float:
    """How far a dev success lies outside [target_success, CEILING] (0 inside)."""
    return max(recipe.target_success - success, success - CEILING, 0.0)


def _walk_back(recipe: TinyRecipe, model, engine, fmt, spec, dev_tasks, gen, best, since,
               history, log):
    """The stopping check overshot `CEILING`: an env learnt in a few hundred steps leaves RL no
    room. Bisect the snapshots `since` the previous check for the latest one at or under the
    ceiling (success grows with the steps, roughly) and keep the checked state nearest the band
    [target_success, CEILING] (the later on a tie). The caller loads the kept state."""
    log(f"tiny: dev success {best[0]:.2f} at step {best[1]} is above {CEILING:.2f}: checking "
        f"the snapshots since the check before")
    kept, lo, hi = best, 0, len(since) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        step, state = since[mid]
        model.load_state_dict(state)
        success = _success(model, engine, fmt, spec, dev_tasks, recipe.dev_samples, recipe, gen)
        history.append({"step": step, "dev_success": success, "walk_back": True})
        log(f"tiny: warm-up step {step} dev success {success:.2f}")
        d, d_kept = _band_distance(recipe, success), _band_distance(recipe, kept[0])
        if d < d_kept or d == d_kept and step > kept[1]:
            kept = (success, step, state)
        if success <= CEILING:
            lo = mid + 1
        else:
            hi = mid - 1
    if kept[0] > CEILING:
        log(f"tiny: note: the warm-up passed dev success {CEILING:.2f} by step {kept[1]}; for a "
            f"weaker start raise model.tiny_error_rate (the demonstrator's mistakes)")
    return kept


def not_reached(recipe: TinyRecipe, best: float, step: int) -> str:
    """The one warning of a warm-up whose checks never reached `target_success`, with what to
    try (docs/your-env.md, "A starting agent from your expert")."""
    return (f"tiny: warning: no check reached dev success {recipe.target_success:.2f} "
            f"in {recipe.max_steps} warm-up steps (best {best:.2f}, step {step}); the build keeps "
            f"that checkpoint. To try: more training tasks (env.n_train: a small split is learnt "
            f"by heart), actions that name or number something in the observation instead of "
            f"copying long strings, a longer warm-up (model.tiny_warmup_steps), or "
            f"model.tiny_target_success={max(best, 0.05):.2f} to accept this agent")


def _build_tiny(recipe: TinyRecipe, out: Path, log: Callable[[str], None] = print) -> dict:
    t0 = time.time()
    log(f"tiny: building on {torch.get_num_threads()} torch thread(s): the env's tasks, then a "
        f"tokenizer on expert transcripts, {recipe.demos} demonstrations and the warm-up")
    spec = recipe_spec(recipe)
    rng = random.Random(recipe.seed)
    train_tasks = spec.tasks("train")
    eval_tasks = spec.tasks("eval", recipe.eval_tasks)
    dev_tasks = _split_dev(recipe, train_tasks)[1]
    worlds = _demo_worlds(recipe, spec)

    # 1. tokenizer, trained on expert transcripts (perfect and imperfect) of training tasks
    tok = train_tokenizer(_corpus(recipe, spec, worlds, len(train_tasks), rng, log),
                          recipe.vocab_size)
    fmt = ChatFormat.from_tokenizer(tok)
    log(f"tiny: tokenizer trained ({len(tok)} tokens) in {time.time() - t0:.1f}s")

    # 2. model
    model = make_model(recipe, len(tok))
    n_params = sum(p.numel() for p in model.parameters())
    log(f"tiny: Qwen3 model with {n_params / 1e6:.2f}M parameters")

    # 3. warm-up on imperfect demonstrations
    demos = _demonstrations(recipe, worlds, fmt, rng)
    demo_success = sum(e.success for e in demos) / len(demos)
    log(f"tiny: {len(demos)} demonstrations recorded ({time.time() - t0:.0f}s so far)")
    demos.sort(key=lambda e: len(e.token_ids))
    engine = HFEngine(model, fmt.pad_id)
    gen = torch.Generator().manual_seed(recipe.seed)
    step, dev_success, history = _warm_up(recipe, model, engine, fmt, spec, demos, dev_tasks,
                                          rng, gen, log)
    success = None
    if recipe.max_steps > 0:
        success = _success(model, engine, fmt, spec, eval_tasks, 2, recipe, gen)
        log(f"tiny: held-out success {success:.2f} (step {step}, {len(eval_tasks)} questions x 2)")
    model.eval()
    loading.quiet_transformers()
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)

    # 4. the warm critic
    critic = {}
    if recipe.critic_episodes > 0 and recipe.max_steps > 0:   # no warm-up, no warm critic
        critic = fit_value_head(model, engine, fmt, spec, train_tasks, recipe.critic_episodes,
                                recipe.max_positions, gen, out / VALUE_HEAD)
        log(f"tiny: value head fitted on {critic['states']} states of {recipe.critic_episodes} "
            f"own episodes (success {critic['success']:.2f}, MSE {critic['mse']:.3f} vs "
            f"{critic['mse_const']:.3f} for a constant)")
    info = {"recipe": recipe.flat(), "key": recipe.key(), "world": world_fingerprint(recipe),
            "params": n_params, "threads": torch.get_num_threads(),
            "warmup_steps": step, "dev_success": dev_success, "base_success": success,
            "demo_success": demo_success,
            "history": history, "critic": critic, "build_seconds": time.time() - t0}
    (out / "recipe.json").write_text(json.dumps(info, indent=2))
    log(f"tiny: built in {time.time() - t0:.0f}s (demonstrator success {demo_success:.2f})")
    return info
