"""The learner: the policy, its critic and reference, and their optimiser; the scoring pass
(old log-probs, old values, reference log-probs) and the update (PPO-style epochs over the
frozen batch, micro-batches accumulating gradients). The trainer's loop (`train.loop`) calls
`build_learner` once, then `score` and `update` every step.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file

from .. import losses
from ..config import RunConfig, step_seed
from ..credit.estimators import ESTIMATORS, reads_values
from ..errors import ConfigError
from ..methods import METHODS
from ..models.critic import build_critic, critic_mode, is_separate, load_head_state
from ..models.loading import load_critic_model
from ..models.lora import reference_of, trainable_parameters
from ..models.sequences import can_pack, tree_packable
from ..models.tiny import VALUE_HEAD, fitted_env_differences
from .batch import Batch, forward, microbatches, trim
from .distributed import Local
from .policy_losses import POLICY_LOSSES


@dataclass
class Learner:
    model: torch.nn.Module
    critic: torch.nn.Module | None
    reference: torch.nn.Module | None     # or models.lora.BaseView (a LoRA policy's base)
    optimizer: torch.optim.Optimizer
    params: list = field(default_factory=list)
    comm: Local = field(default_factory=Local)  # data-parallel collectives (no-ops in one process)


def initial_critic(cfg: RunConfig, model, model_path: str | None = None,
                   log: Callable[[str], None] = print) -> torch.nn.Module | None:
    """The critic a run of `cfg.method` starts with (None for a critic-free recipe): the
    `model.critic` form, starting from the tiny build's fitted value head when the model folder
    has one, the recipe asks for it (`Recipe.warm_critic`) and the run keeps the recipe's
    estimator (the head was fitted for it). `train` and `agentrl rollout --method focus` both
    start from it."""
    recipe = METHODS.get(cfg.method)
    if not recipe.critic:
        return None
    torch.manual_seed(step_seed(cfg.seed, 0, salt=1))
    own = cfg.model.critic == "separate" and bool(cfg.model.critic_path)
    base = (load_critic_model(cfg, model_path, next(model.parameters()).device)
            if own else None)
    critic = build_critic(cfg.model.critic, model, base)
    warm = Path(model_path) / VALUE_HEAD if model_path else None
    rung = cfg.algo.focus_critic          # the critic ladder (docs/methods.md): cold, pretrained
    loaded = False
    # the tiny build's fitted critic (on the policy's features), for the recipes it was fitted for
    if (warm is not None and warm.is_file() and recipe.warm_critic and not own
            and cfg.algo.estimator == recipe.defaults.get("algo.estimator")):
        other = fitted_env_differences(warm.parent, cfg.env)
        if other:                         # fitted on another world: its values mean nothing here
            log(f"critic: the value head in {warm.parent} was fitted on another env "
                f"({'; '.join(other[:3])}): starting a cold critic")
        elif rung == "cold":
            log(f"critic: algo.focus_critic=cold: the value head in {warm.parent} is left out")
        else:
            load_head_state(critic, load_file(str(warm)))
            loaded = True
            log(f"critic: value head starts from {warm}")
    if rung == "pretrained" and not loaded:
        raise ConfigError(
            f"algo.focus_critic=pretrained starts from a value head fitted on the base policy's "
            f"Monte-Carlo returns on this env ({VALUE_HEAD} in the model folder, as `agentrl "
            f"build-tiny` writes it); {model_path or 'the model'} has none that fits "
            f"{cfg.method} on env '{cfg.env.name}': use algo.focus_critic=learned or cold")
    if is_separate(critic):
        log("critic: a separate model (" + (f"from {cfg.model.critic_path}" if own else
                                            "a copy of the initial policy") + ") + value head")
    return critic


def initial_reference(model):
    """The frozen reference (KL, TRACE): a LoRA policy's own base, the same module run with
    its adapters disabled (`models.lora.BaseView`, no second copy); otherwise a frozen copy of
    the initial policy."""
    view = reference_of(model)
    if view is not None:
        return view
    reference = copy.deepcopy(model).eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    return reference


def build_learner(cfg: RunConfig, model, comm: Local | None = None,
                  model_path: str | None = None, log: Callable[[str], None] = print) -> Learner:
    recipe = METHODS.get(cfg.method)
    critic = initial_critic(cfg, model, model_path, log)
    reference = None
    if recipe.reference or cfg.algo.kl_coef > 0:
        reference = initial_reference(model)
    # with LoRA only the adapters (and a separate critic's own adapters) are trainable
    policy_params = trainable_parameters(model)
    critic_params = [p for p in critic.parameters() if p.requires_grad] if critic else []
    params = policy_params + critic_params
    # one parameter group unless the critic has its own rate (so older checkpoints still resume)
    groups = ([{"params": policy_params},
               {"params": critic_params, "lr": cfg.train.critic_lr}]
              if critic_params and cfg.train.critic_lr > 0 else params)
    opt = torch.optim.AdamW(groups, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay,
                            betas=(0.9, 0.99))
    comm = comm or Local()
    comm.broadcast_params(params)
    return Learner(model, critic, reference, opt, params, comm)


# the tree mask is dense ([T, T] for T distinct tokens of a micro-batch): 64 MB of booleans at
# 8192 tokens, 4 GB at 65,536, so larger micro-batches run the per-episode forward
TREE_PACK_MAX_TOKENS = 8192


def packs(learner: Learner, cfg: RunConfig) -> bool | str:
    """How micro-batches run: "tree" (`train.tree_pack`, a model that allows it and micro-batches
    of at most `TREE_PACK_MAX_TOKENS` tokens: shared prefixes forwarded once), True (`train.pack` and a model that allows it: packed without
    padding), False (right-padded rows)."""
    if (cfg.train.tree_pack and tree_packable(learner.model)
            and cfg.train.max_tokens_per_microbatch <= TREE_PACK_MAX_TOKENS):
        return "tree"
    return cfg.train.pack and can_pack(learner.model)


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
    fills them, see `update`), values when the estimator declared it does not read them
    (`credit.estimators.value_free`) and no value clipping does, reference log-probs without a KL
    term. What is left out stays None; with nothing left, no forward runs."""
    B, L = batch.input_ids.shape
    want_lp = not (deferred and engine_logprobs(cfg))
    want_v = learner.critic is not None and not (
        deferred and not reads_values(ESTIMATORS.get(cfg.algo.estimator))
        and not cfg.algo.value_clip)
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
    """PPO-style epochs x minibatches over the frozen batch; micro-batches accumulate grads.
    Dropout in the update (LoRA's `model.lora_dropout`, a model's own) draws from torch's
    global generator seeded from (seed, step, rank) and restored afterwards, so a resumed run draws
    the same masks and nothing outside the update sees a different random state."""
    device = next(learner.model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(step_seed(cfg.seed, step, salt=4 + 1000 * learner.comm.rank))
        return _update(learner, batch, cfg, step)


def lr_factor(tr, step: int) -> float:
    """The learning-rate multiplier at training step `step` (1-based) of `tr` (the train
    section): `tr.warmup_steps` steps of linear warm-up from 0 (step s at s / warmup_steps),
    then `tr.lr_schedule` over the remaining steps up to `tr.steps`: constant 1, linear from 1
    down to 1 / (steps - warmup) at the last step, cosine half a period from 1 toward 0. A
    function of the step alone, so a resumed run continues the schedule exactly."""
    w, n = tr.warmup_steps, tr.steps
    if step <= w:
        return step / w
    if tr.lr_schedule == "constant":
        return 1.0
    progress = (step - w - 1) / max(1, n - w)
    if tr.lr_schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def set_lr(learner: Learner, cfg: RunConfig, step: int) -> float:
    """Set the optimiser's rates for `step` (`lr_factor`): the policy's group from `train.lr`,
    the critic's own group (`train.critic_lr`, when it has one) from its rate, both scaled
    alike. -> the policy's rate."""
    factor = lr_factor(cfg.train, step)
    groups = learner.optimizer.param_groups
    bases = [cfg.train.lr] + [cfg.train.critic_lr] * (len(groups) - 1)
    for group, base in zip(groups, bases):
        group["lr"] = base * factor
    return groups[0]["lr"]


def _update(learner: Learner, batch: Batch, cfg: RunConfig, step: int) -> dict:
    algo, tr = dataclasses.replace(cfg.algo, agg_norm=cfg.agg_norm), cfg.train  # 0 -> the run's cap
    lr = set_lr(learner, cfg, step)
    learner.model.train()
    critic_mode(learner.critic, True)
    rng = random.Random(step_seed(cfg.seed, step, salt=2))
    # critic warm-up (verl's trainer.critic_warmup): only the value head learns; the policy
    # loss, the KL term and the backbone's share of the critic gradient are all dropped
    critic_only = learner.critic is not None and step <= tr.critic_warmup
    # old log-probs left to this update (`score(deferred=True)`): one pass, so every forward
    # below runs at the rollout's weights; `batch.old_logprobs` gets the trainer's log-probs
    # from these forwards (what a scoring pass gives: the step's logged gap reads them)
    defer = batch.old_logprobs is None
    if defer and (tr.ppo_epochs != 1 or tr.minibatches != 1):
        raise ValueError("a multi-pass update needs its old log-probs from score() first")
    if defer:
        batch.old_logprobs = torch.zeros(batch.input_ids.shape)
    tokens = [0.0, 0.0]                   # policy tokens whose old log-prob: the engine's, all
    sums: dict[str, float] = {}
    count = 0
    for _ in range(tr.ppo_epochs):
        order = list(range(batch.size))
        if tr.minibatches > 1:
            rng.shuffle(order)
        for k in range(tr.minibatches):
            stats = _minibatch_step(learner, batch, order[k::tr.minibatches], cfg, algo, defer,
                                    critic_only, tokens)
            for key, v in stats.items():
                sums[key] = sums.get(key, 0.0) + v
            count += 1
    learner.model.eval()
    critic_mode(learner.critic, False)
    out = {k: v / count for k, v in sums.items()}
    out["old_logprobs/engine"] = tokens[0] / max(tokens[1], 1.0)
    out["lr"] = lr
    return out


def _minibatch_step(learner: Learner, batch: Batch, rows: list[int], cfg: RunConfig, algo,
                    defer: bool, critic_only: bool, tokens: list[float]) -> dict[str, float]:
    """One optimiser step on the minibatch `rows`: micro-batches accumulate gradients (each
    weighted by its share of the minibatch), then clip and step -> the step's stats. With
    `defer`, the forwards' log-probs become `batch.old_logprobs` and `tokens` counts the
    policy tokens whose old log-prob came from the engine."""
    tr = cfg.train
    device = next(learner.model.parameters()).device  # the batch is built on CPU
    pack = packs(learner, cfg)
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
        lp, values, ent = forward(learner.model, learner.critic, m, cfg.rollout.temperature,
                                  tr.logprob_chunk, pack, entropy=True)
        if defer:
            from_engine = _old_from_engine(m, lp, tr.logprob_tolerance)
            batch.old_logprobs[[rows[i] for i in micro], :lp.shape[1]] = lp.detach().float().cpu()
            n = float(m.response_mask.sum())
            tokens[0], tokens[1] = tokens[0] + n * from_engine, tokens[1] + n
        total, st = _micro_loss(learner, m, lp, values, algo, weight, n_val, critic_only)
        total = _entropy_term(total, st, ent, m, algo, weight, n_tok, critic_only)
        total.backward()
        for key, (v, w) in st.items():   # each stat by its own micro-batch share
            stats[key] = stats.get(key, 0.0) + float(v) * w
    if critic_only:
        for p in learner.model.parameters():
            p.grad = None           # AdamW leaves a parameter without a gradient alone
    learner.comm.reduce_grads(learner.params)
    stats = learner.comm.sum_dict(stats)
    if tr.grad_clip > 0:
        stats.update(clip_grads(learner, tr.grad_clip))
    learner.optimizer.step()
    return stats


def clip_grads(learner: Learner, max_norm: float) -> dict[str, float]:
    """Clip the policy's gradient and the critic's own parameters' gradient each to `max_norm`,
    as verl and OpenRLHF clip their actor and critic models apart. One joint clip let the
    critic's gradient, often several times the policy's, use up the norm and shrink the
    policy's step with it (docs/results.md). With `model.critic=head` the backbone's gradient
    holds the critic loss's share too and is clipped as the policy's. -> the norms before
    clipping: `grad_norm` (policy), `critic/grad_norm` (when there is a critic)."""
    policy = [p for p in learner.model.parameters() if p.grad is not None]
    out = {"grad_norm": float(torch.nn.utils.clip_grad_norm_(policy, max_norm))}
    if learner.critic is not None:
        own = [p for p in learner.critic.parameters() if p.grad is not None]
        out["critic/grad_norm"] = float(torch.nn.utils.clip_grad_norm_(own, max_norm))
    return out


def _entropy_term(total, stats: dict, ent, m: Batch, algo, weight: float, n_tok: float,
                  critic_only: bool):
    """`total` less the entropy bonus (`algo.entropy_coef` x the entropy aggregated as the
    policy loss, when > 0 and the policy trains); `stats["policy/entropy"]`: the micro-batch's
    mean entropy over policy tokens, weighted by its share of the minibatch's policy tokens."""
    mask = m.response_mask
    stats["policy/entropy"] = (losses.aggregate(ent.detach(), mask, "token-mean"),
                               float(mask.sum()) / n_tok)
    if algo.entropy_coef > 0 and not critic_only:
        bonus = losses.aggregate(ent, mask, algo.agg, algo.agg_norm)
        total = total - algo.entropy_coef * bonus * weight
    return total


def _micro_loss(learner: Learner, m: Batch, lp, values, algo, weight: float, n_val: float,
                critic_only: bool):
    """One micro-batch's weighted loss (policy, KL to the reference, critic) and its stats, each
    as (value, weight): the micro-batch's share of policy tokens (or rows) for the policy's,
    of critic targets for the critic's, so that the logged means do not depend on how a batch
    is split into micro-batches."""
    loss, st = POLICY_LOSSES.get(algo.loss)(lp, m, algo)
    total = loss.detach() * 0.0 if critic_only else loss * weight
    if learner.reference is not None and algo.kl_coef > 0 and not critic_only:
        kl = losses.aggregate(losses.kl_penalty(lp, m.ref_logprobs, m.response_mask,
                                                algo.kl_estimator),
                              m.response_mask, algo.agg, algo.agg_norm)
        total = total + algo.kl_coef * kl * weight
        st["kl/ref"] = kl.detach()
    st["loss/policy"] = loss.detach()
    out = {k: (v, weight) for k, v in st.items()}
    if values is not None and m.returns is not None:
        vw = float(m.value_mask.sum()) / n_val
        vl, vst = losses.value_loss(values, m.returns, m.value_mask, m.old_values,
                                    clip=algo.value_clip or None)
        total = total + algo.vf_coef * vl * vw
        out.update({k: (v, vw) for k, v in {**vst, "loss/critic": vl.detach()}.items()})
    return total, out
