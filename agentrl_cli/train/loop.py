"""The trainer loop, top to bottom (CleanRL-style): rollout -> credit -> update -> log.

The algorithm is visible in `train()`; plumbing (batches, checkpoints, display) lives beside it.
Nothing here branches on the method's name: the recipe's controller, estimator, loss and
needs (critic, reference) are looked up in registries.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .. import losses
from ..errors import ConfigError
from ..config import RunConfig, step_seed
from ..context import make_spec
from ..credit.estimators import ESTIMATORS
from ..engines import build_engine, check_engine, sampling_params
from ..evaluation.runner import evaluate
from ..methods import METHODS
from ..models.critic import build_critic, critic_config, critic_mode, is_separate, load_head_state
from ..models.loading import load_critic_model
from ..models.sequences import can_pack
from ..models.tiny import VALUE_HEAD
from ..reporting.metrics import MetricsLog, plot_learning_curve
from ..rollout.controllers import RolloutContext
from ..rollout.workers import open_rollouts
from . import checkpoint
from .batch import Batch, collate, forward, microbatches, trim
from .distributed import Local, from_env
from .prepare import PREPARERS
from .run_folder import RunFolder, atomic_write_text
from .tiny_build import load_policy
from .update import POLICY_LOSSES


class TaskSampler:
    """Training tasks in a seeded order, reshuffled every epoch; the cursor is the step."""

    def __init__(self, tasks, seed: int, per_step: int):
        self.tasks, self.seed, self.per_step = list(tasks), seed, per_step

    def for_step(self, step: int):
        n = len(self.tasks)
        out = []
        for j in range((step - 1) * self.per_step, step * self.per_step):
            epoch, i = divmod(j, n)
            order = list(range(n))
            random.Random(self.seed * 7_777 + epoch).shuffle(order)
            out.append(self.tasks[order[i]])
        return out


# The tiny build fits its value head on turn-start states only (`train.tiny_build.fit_value_head`):
# only FOCUS, which reads the critic only at segment boundaries, starts from it. Token-level
# GAE (ppo) and MPO's intra-turn trace read it at every policy token, where that fit does not
# hold (measured: critic loss 0.76 at PPO's first step vs 0.17-0.25 for the constant 0.5), so
# they start cold.
WARM_CRITIC_ESTIMATORS = ("focus",)


@dataclass
class Learner:
    model: torch.nn.Module
    critic: torch.nn.Module | None
    reference: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    params: list = field(default_factory=list)
    comm: Local = field(default_factory=Local)  # data-parallel collectives (no-ops in one process)


def initial_critic(cfg: RunConfig, model, model_path: str | None = None,
                   log: Callable[[str], None] = print) -> torch.nn.Module | None:
    """The critic a run of `cfg.method` starts with (None for a critic-free recipe): the
    `model.critic` form, and for the estimators the tiny build's fitted value head was fitted
    for (`WARM_CRITIC_ESTIMATORS`) that head, when the model folder has one. `train` and
    `agentrl rollout --method focus` both start from it."""
    if not METHODS.get(cfg.method).critic:
        return None
    torch.manual_seed(step_seed(cfg.seed, 0, salt=1))
    own = cfg.model.critic == "separate" and bool(cfg.model.critic_path)
    base = (load_critic_model(cfg, model_path, next(model.parameters()).device)
            if own else None)
    critic = build_critic(cfg.model.critic, model, base)
    warm = Path(model_path) / VALUE_HEAD if model_path else None
    # the tiny build's fitted critic (on the policy's features), for the estimators it was
    # fitted for
    if (warm is not None and warm.is_file() and cfg.algo.estimator in WARM_CRITIC_ESTIMATORS
            and not own):
        from safetensors.torch import load_file

        load_head_state(critic, load_file(str(warm)))
        log(f"critic: value head starts from {warm}")
    if is_separate(critic):
        log("critic: a separate model (" + (f"from {cfg.model.critic_path}" if own else
                                            "a copy of the initial policy") + ") + value head")
    return critic


def build_learner(cfg: RunConfig, model, comm: Local | None = None,
                  model_path: str | None = None, log: Callable[[str], None] = print) -> Learner:
    recipe = METHODS.get(cfg.method)
    critic = initial_critic(cfg, model, model_path, log)
    reference = None
    if recipe.reference or cfg.algo.kl_coef > 0:
        reference = copy.deepcopy(model).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
    critic_params = list(critic.parameters()) if critic else []
    params = list(model.parameters()) + critic_params
    # one parameter group unless the critic has its own rate (so older checkpoints still resume)
    groups = ([{"params": list(model.parameters())},
               {"params": critic_params, "lr": cfg.train.critic_lr}]
              if critic_params and cfg.train.critic_lr > 0 else params)
    opt = torch.optim.AdamW(groups, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay,
                            betas=(0.9, 0.99))
    comm = comm or Local()
    comm.broadcast_params(params)
    return Learner(model, critic, reference, opt, params, comm)


def packs(learner: Learner, cfg: RunConfig) -> bool:
    """Whether micro-batches run packed (`train.pack` and a model that allows it)."""
    return cfg.train.pack and can_pack(learner.model)


# estimators that never read the critic's per-token values (`batch.old_values`): FOCUS reads
# its critic inside the trees (`batch.extras`), so its scoring pass has no values to compute
VALUE_FREE_ESTIMATORS = ("focus",)


def engine_logprobs(cfg: RunConfig) -> bool:
    """Whether the update takes its old log-probs from the engine (`train.old_logprobs`, see
    its help) instead of a scoring pass: only a single-pass update, whose forward runs at the
    rollout's weights, can measure the gap and fall back to its own log-probs."""
    mode = cfg.train.old_logprobs
    if mode == "auto":
        mode = "engine" if cfg.rollout.engine == "hf" else "score"
    return mode == "engine" and cfg.train.ppo_epochs == 1 and cfg.train.minibatches == 1


@torch.no_grad()
def score(learner: Learner, batch: Batch, cfg: RunConfig, deferred: bool = False) -> None:
    """Fill old log-probs, old values and reference log-probs (before the update).

    `deferred` (the trainer's loop): leave out what nothing before the update reads and the
    update does not need from here: old log-probs when `engine_logprobs(cfg)` (the update
    fills them, see `update`), values when the estimator does not read them
    (`VALUE_FREE_ESTIMATORS`) and no value clipping does, reference log-probs without a KL
    term. What is left out stays None; with nothing left, no forward runs."""
    B, L = batch.input_ids.shape
    want_lp = not (deferred and engine_logprobs(cfg))
    want_v = learner.critic is not None and not (
        deferred and cfg.algo.estimator in VALUE_FREE_ESTIMATORS and not cfg.algo.value_clip)
    want_ref = learner.reference is not None and not (deferred and cfg.algo.kl_coef <= 0)
    old = torch.zeros(B, L) if want_lp else None
    vals = torch.zeros(B, L) if want_v else None
    ref = torch.zeros(B, L) if want_ref else None
    learner.model.eval()
    critic_mode(learner.critic, False)
    pack = packs(learner, cfg)
    rows_all = microbatches(batch, cfg.train.max_tokens_per_microbatch, pack)
    for rows in rows_all if (want_lp or want_v or want_ref) else []:
        mb = trim(batch.select(rows))
        w = mb.input_ids.shape[1]
        if want_lp or want_v:
            lp, v = forward(learner.model, learner.critic if want_v else None, mb,
                            cfg.rollout.temperature, cfg.train.logprob_chunk, pack, want_lp)
            if want_lp:
                old[rows, :w] = lp.float().cpu()
            if want_v:
                vals[rows, :w] = v.float().cpu()
        if want_ref:
            rlp, _ = forward(learner.reference, None, mb, cfg.rollout.temperature,
                             cfg.train.logprob_chunk, pack)
            ref[rows, :w] = rlp.float().cpu()
    batch.old_logprobs, batch.old_values, batch.ref_logprobs = old, vals, ref


def _old_from_engine(m: Batch, lp: torch.Tensor, tolerance: float) -> bool:
    """Set micro-batch `m`'s old log-probs, given `lp`, the trainer's at the rollout's weights:
    the engine's where their mean gap to `lp` over policy tokens is within `tolerance`, else
    `lp` itself (what a scoring pass would give). Returns whether the engine's were used."""
    own = lp.detach()
    engine = m.engine_logprobs.to(own.dtype)
    mask = m.response_mask.to(own.dtype)
    gap = float(((engine - own).abs() * mask).sum() / mask.sum().clamp(min=1))
    m.old_logprobs = engine if gap <= tolerance else own
    return gap <= tolerance


def _rows(mask: torch.Tensor, agg: str) -> float:
    """Rows a per-row aggregation divides by: those with a policy token for seq-mean (rows
    without one are left out of its mean, `losses.aggregate`), every row for token-sum-norm."""
    return float((mask.sum(1) > 0).sum()) if agg == "seq-mean" else float(mask.shape[0])


def update(learner: Learner, batch: Batch, cfg: RunConfig, step: int) -> dict:
    """PPO-style epochs x minibatches over the frozen batch; micro-batches accumulate grads."""
    algo, tr = dataclasses.replace(cfg.algo, agg_norm=cfg.agg_norm), cfg.train  # 0 -> the run's cap
    policy_loss = POLICY_LOSSES.get(algo.loss)
    learner.model.train()
    critic_mode(learner.critic, True)
    rng = random.Random(step_seed(cfg.seed, step, salt=2))
    device = next(learner.model.parameters()).device  # the batch is built on CPU
    # critic warm-up (verl's trainer.critic_warmup): only the value head learns; the policy
    # loss, the KL term and the backbone's share of the critic gradient are all dropped
    critic_only = learner.critic is not None and step <= tr.critic_warmup
    pack = packs(learner, cfg)
    # old log-probs left to this update (`score(deferred=True)`): one pass, so every forward
    # below runs at the rollout's weights; `batch.old_logprobs` gets the trainer's log-probs
    # from these forwards (what a scoring pass gives: the step's logged gap reads them)
    defer = batch.old_logprobs is None
    if defer and (tr.ppo_epochs != 1 or tr.minibatches != 1):
        raise ValueError("a multi-pass update needs its old log-probs from score() first")
    if defer:
        batch.old_logprobs = torch.zeros(batch.input_ids.shape)
    engine_tokens = policy_tokens = 0.0
    sums: dict[str, float] = {}
    count = 0
    for _ in range(tr.ppo_epochs):
        order = list(range(batch.size))
        if tr.minibatches > 1:
            rng.shuffle(order)
        for k in range(tr.minibatches):
            rows = order[k::tr.minibatches]
            mbatch = batch.select(rows)
            # loss weights divide by the minibatch's counts over all data-parallel ranks
            n_tok, n_val, n_rows = learner.comm.all_sum([
                float(mbatch.response_mask.sum()),
                float(mbatch.value_mask.sum()) if mbatch.value_mask is not None else 1.0,
                _rows(mbatch.response_mask, algo.agg)])
            n_tok, n_val, n_rows = max(n_tok, 1.0), max(n_val, 1.0), max(n_rows, 1.0)
            learner.optimizer.zero_grad(set_to_none=True)
            stats: dict[str, float] = {}
            for micro in microbatches(mbatch, tr.max_tokens_per_microbatch, pack):
                m = trim(mbatch.select(micro)).to(device)
                # token-mean: micro-batch mean x its share of tokens = the minibatch token mean;
                # seq-mean, token-sum-norm: per-row terms, so the micro-batch's share of rows
                weight = (float(m.response_mask.sum()) / n_tok if algo.agg == "token-mean"
                          else _rows(m.response_mask, algo.agg) / n_rows)
                lp, values = forward(learner.model, learner.critic, m, cfg.rollout.temperature,
                                     tr.logprob_chunk, pack)
                if defer:
                    from_engine = _old_from_engine(m, lp, tr.logprob_tolerance)
                    batch.old_logprobs[[rows[i] for i in micro], :lp.shape[1]] = lp.detach().float().cpu()
                    n = float(m.response_mask.sum())
                    engine_tokens, policy_tokens = engine_tokens + n * from_engine, policy_tokens + n
                loss, st = policy_loss(lp, m, algo)
                total = loss.detach() * 0.0 if critic_only else loss * weight
                if learner.reference is not None and algo.kl_coef > 0 and not critic_only:
                    kl = losses.aggregate(losses.kl_k3(lp, m.ref_logprobs, m.response_mask),
                                          m.response_mask, algo.agg, algo.agg_norm)
                    total = total + algo.kl_coef * kl * weight
                    st["kl/ref"] = kl.detach()
                if values is not None and m.returns is not None:
                    vw = float(m.value_mask.sum()) / n_val
                    vl, vst = losses.value_loss(values, m.returns, m.value_mask, m.old_values,
                                                clip=algo.value_clip or None)
                    total = total + algo.vf_coef * vl * vw
                    st = {**st, **vst, "loss/critic": vl.detach()}
                total.backward()
                st["loss/policy"] = loss.detach()
                for key, v in st.items():
                    stats[key] = stats.get(key, 0.0) + float(v) * weight
            if critic_only:
                for p in learner.model.parameters():
                    p.grad = None           # AdamW leaves a parameter without a gradient alone
            learner.comm.reduce_grads(learner.params)
            stats = learner.comm.sum_dict(stats)
            if tr.grad_clip > 0:
                gn = torch.nn.utils.clip_grad_norm_(learner.params, tr.grad_clip)
                stats["grad_norm"] = float(gn)
            learner.optimizer.step()
            for key, v in stats.items():
                sums[key] = sums.get(key, 0.0) + v
            count += 1
    learner.model.eval()
    critic_mode(learner.critic, False)
    out = {k: v / count for k, v in sums.items()}
    out["old_logprobs/engine"] = engine_tokens / max(policy_tokens, 1.0)
    return out


def step_budget(cfg: RunConfig, base: dict) -> int:
    """Generated-token cap per step: `rollout.budget_tokens`, else with `rollout.budget_match`
    what a linear step of the base policy generates (tasks x group x the base evaluation's
    tokens per question; fixed for the run, so a resumed run keeps it), else 0 (no cap)."""
    r = cfg.rollout
    if r.budget_tokens > 0 or not r.budget_match:
        return r.budget_tokens
    return max(1, round(r.tasks_per_step * r.group_size * base["tokens_per_question"]))


def train(cfg: RunConfig, out: Path, resume: str | None = None,
          log: Callable[[str], None] = print, progress=None, overwrite: bool = False,
          ready: Callable[[], None] | None = None) -> dict:
    """Run `cfg.train.steps` steps; returns the summary (also written to out/summary.json).
    `resume`: the run folder `out` itself or one of its checkpoints; `overwrite`: start afresh
    in a folder that holds a run (see `run_folder`); `ready()` is called once the folder and
    the checkpoint to resume from have passed their checks, before any model is loaded."""
    t_start = time.time()
    check_engine(cfg.rollout.engine)      # e.g. vllm without vLLM or CUDA: fail before loading
    comm = from_env(cfg)                  # torchrun: data-parallel ranks (train/distributed.py)
    if not comm.is_main:
        log, progress = (lambda s: None), None
    out = Path(comm.on_main(str, out))
    # the run folder first (lock, no silent overwrite, leftovers removed), before any work
    folder = RunFolder.open(out, resume=bool(resume), overwrite=overwrite, log=log) if comm.is_main else None
    try:
        return _train(cfg, out, resume, log, progress, comm, t_start, ready)
    finally:
        if folder is not None:
            folder.close()


def _resume_state(cfg: RunConfig, resume: str, log: Callable[[str], None]):
    """(checkpoint, trainer state, policy weights) to resume from, or None (no checkpoint yet:
    the run starts over at step 0 with its saved config). `train.steps` below the checkpoint's
    step is a one-line error: a run continues, it is not cut back."""
    found = checkpoint.load_for_resume(resume, log)
    if found is None:
        log(f"{resume} has no checkpoint yet: starting it from step 0")
        return None
    step = found[1]["step"]
    if cfg.train.steps < step:
        raise ConfigError(f"train.steps={cfg.train.steps} is below the run's step {step}: a "
                          f"resumed run continues (give train.steps >= {step}, or start a new "
                          "run)")
    return found


def _train(cfg: RunConfig, out: Path, resume: str | None, log, progress, comm, t_start,
           ready) -> dict:
    found = _resume_state(cfg, resume, log) if resume and comm.is_main else None
    if resume:                            # the other ranks load the checkpoint rank 0 chose
        where = comm.on_main(lambda: str(found[0]) if found else "")
        if where and not comm.is_main:
            found = checkpoint.load_for_resume(where, log)
    if ready is not None:
        ready()
    torch.manual_seed(cfg.seed)
    model, tok, fmt, model_path = comm.first(lambda: load_policy(cfg, log))
    spec = make_spec(cfg)
    engine = build_engine(cfg, model, fmt)
    estimator = ESTIMATORS.get(cfg.algo.estimator)
    learner = build_learner(cfg, model, comm, model_path, log)
    rollouts = open_rollouts(cfg, engine, fmt, spec, model, learner.critic, out, log)
    sampler = TaskSampler(spec.tasks("train"), cfg.seed, cfg.rollout.tasks_per_step)
    eval_tasks = spec.tasks("eval", cfg.train.eval_tasks)
    params = sampling_params(cfg)
    if comm.is_main:
        atomic_write_text(out / "config.json",
                          json.dumps(dataclasses.replace(cfg, out=str(out)).to_dict(), indent=2))

    def run_eval(step: int) -> dict:
        return evaluate(engine, fmt, spec, eval_tasks, cfg.train.eval_samples, params,
                        cfg.rollout.max_tokens, cfg.rollout.batch_size,
                        seed=step_seed(cfg.seed, step, salt=3))

    start_step, base, tokens_total = 0, None, 0
    metrics = MetricsLog(out / "metrics.jsonl", sinks=cfg.train.log, config=cfg.to_dict())
    if found is not None:
        ckpt, state, weights = found
        model.load_state_dict(weights, strict=False)
        if learner.critic is not None and state.get("value_head") is not None:
            learner.critic.load_state_dict(state["value_head"])
        learner.optimizer.load_state_dict(state["optimizer"])
        start_step, base, tokens_total = state["step"], state["base_eval"], state["tokens_total"]
        last_eval = state.get("last_eval", base)  # the held-out check in force at the checkpoint
        if comm.is_main:
            metrics.truncate_after(start_step, on_torn=log)
        log(f"resumed from {ckpt} at step {start_step}")
    else:
        base = comm.on_main(run_eval, 0)
        if comm.is_main:
            metrics.reset()
            metrics.write({"step": 0, "eval/success": base["mean@1"],
                           "eval/tokens_per_question": base["tokens_per_question"],
                           "eval/tool_calls": base["tool_calls"]})
        log(f"base held-out success {base['mean@1']:.3f}")
        last_eval = base
    budget = step_budget(cfg, base)
    if budget != cfg.rollout.budget_tokens:
        log(f"budget: {budget} generated tokens per step (a linear step of the base policy)")
    rollouts.sync(model)                  # the engine / workers start from the trainer's weights
    if progress:
        progress.start(cfg.train.steps, start_step)
    for step in range(start_step + 1, cfg.train.steps + 1):
        t0 = time.time()
        # 1. rollout
        ctx = RolloutContext(engine, fmt, spec, params, cfg.rollout.group_size,
                             cfg.rollout.max_tokens, cfg.rollout.batch_size,
                             -(-budget // comm.world),
                             torch.Generator().manual_seed(step_seed(cfg.seed, step, salt=1000 * comm.rank)),
                             algo=cfg.algo, critic=learner.critic)
        result = rollouts.run(ctx, comm.share(sampler.for_step(step)))
        eps = result.episodes
        t_roll = time.time() - t0
        # 2. credit
        batch = collate(eps, fmt.pad_id)
        batch.extras.update(result.extras)
        score(learner, batch, cfg, deferred=True)   # what the update cannot take from its own pass
        if cfg.algo.estimator in PREPARERS:
            PREPARERS.get(cfg.algo.estimator)(learner, batch, eps, fmt, cfg)
        credit = estimator(batch, cfg.algo)
        batch.advantages, batch.returns, batch.value_mask = credit.advantages, credit.returns, credit.value_mask
        # 3. update
        stats = update(learner, batch, cfg, step)
        rollouts.sync(model)              # new weights to the engine / workers
        mask = batch.response_mask.bool()
        row = {
            "step": step,
            "reward/mean": float(batch.rewards.mean()),
            "success": sum(e.success for e in eps) / len(eps),
            "adv/mean": float(batch.advantages[mask].mean()) if mask.any() else 0.0,
            "adv/std": float(batch.advantages[mask].std()) if mask.sum() > 1 else 0.0,
            "rollout/tokens": result.tokens,
            "rollout/tokens_per_episode": sum(e.generated_tokens for e in eps) / len(eps),
            "rollout/tool_calls": sum(e.num_tool_calls for e in eps) / len(eps),
            "rollout/turns": sum(e.num_turns for e in eps) / len(eps),
            "rollout/logprob_gap": float((batch.engine_logprobs - batch.old_logprobs)[mask].abs().mean()),
            "time/rollout": t_roll,
            "time/step": time.time() - t0,
            "tokens/s": result.tokens / max(t_roll, 1e-9),
            **stats,
            **result.extras.get("metrics", {}),
        }
        if cfg.context.operator != "none":
            row["rollout/context_resets"] = sum(e.meta.get("context_resets", 0) for e in eps) / len(eps)
        row = comm.reduce_row(row, sums=("rollout/tokens", "tokens/s"))  # others: mean over ranks
        tokens_total += row["rollout/tokens"]
        if cfg.train.eval_every and step % cfg.train.eval_every == 0 or step == cfg.train.steps:
            last_eval = comm.on_main(run_eval, step)
            row.update({"eval/success": last_eval["mean@1"],
                        "eval/tokens_per_question": last_eval["tokens_per_question"],
                        "eval/tool_calls": last_eval["tool_calls"]})
        if comm.is_main:
            metrics.write(row)
        if progress:
            progress.update(step, row, last_eval["mean@1"])
        if comm.is_main and (cfg.train.save_every and step % cfg.train.save_every == 0
                             or step == cfg.train.steps):
            checkpoint.save(out, step, model, tok, {
                "step": step, "optimizer": learner.optimizer.state_dict(),
                "value_head": learner.critic.state_dict() if learner.critic else None,
                "critic_config": critic_config(learner.critic),
                "base_eval": base, "last_eval": last_eval, "tokens_total": tokens_total,
                "method": cfg.method,
            })
    if progress:
        progress.stop()
    rollouts.close()
    comm.check_same(learner.params)
    summary = {
        "method": cfg.method, "env": cfg.env.name, "model": cfg.model.name, "seed": cfg.seed,
        "base_success": base["mean@1"], "final_success": last_eval["mean@1"],
        "steps": cfg.train.steps, "wall_seconds": time.time() - t_start,
        "tokens_generated": tokens_total,
        "base_tokens_per_question": base["tokens_per_question"],
        "final_tokens_per_question": last_eval["tokens_per_question"],
        "eval_tasks": len(eval_tasks), "eval_samples": cfg.train.eval_samples,
        "model_path": model_path,
    }
    if comm.is_main:
        atomic_write_text(out / "summary.json", json.dumps(summary, indent=2))
        png = out / f".learning_curve.{os.getpid()}.tmp.png"
        plot_learning_curve(out / "metrics.jsonl", png, title=f"{cfg.method} on {cfg.env.name}, seed {cfg.seed}")
        os.replace(png, out / "learning_curve.png")
        metrics.close()
    comm.close()
    return summary
