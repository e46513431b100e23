"""The trainer loop, top to bottom (CleanRL-style): open -> (rollout -> credit -> update ->
evaluate -> save) per step -> finish.

`_train` is the loop; `open_run`, `run_step`, `evaluate_run`, `save` and `finish` are its
parts, and the learner (scoring pass and update) is `train.learner`. Nothing here branches on
the method's name: the recipe's controller, estimator, loss and needs (critic, reference) are
looked up in registries.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..config import RunConfig, step_seed
from ..credit.estimators import ESTIMATORS
from ..envs.checker import require_determinism, require_fork
from ..envs.guard import call_user
from ..errors import ConfigError, StopTraining
from ..evaluation.runner import evaluate
from ..models.critic import critic_config
from ..reporting.metrics import MetricsLog, read_metrics
from ..reporting.live import with_se
from ..reporting.plots import env_label, learning_curve
from ..rollout.controllers import CONTROLLERS, rollout_context
from ..rollout.matched_budget import linear_step_tasks, linear_step_tokens, step_budget
from ..rollout.tasks import TaskSampler
from ..rollout.rewards import reward_metrics
from ..rollout.rollouts import Rollouts, open_rollouts
from ..rollout.runtime import Runtime, build_runtime
from . import checkpoint
from .batch import collate
from .distributed import Local, from_env
from .learner import Learner, build_learner, score, update
from .prepare import PREPARERS
from .run_folder import RunFolder, atomic_write_text
from .traces import trace_due, write_trace


def match_tasks(run: "Run") -> None:
    """`rollout.focus_tasks=match` on a tree controller: the run's steps draw as many tasks as a
    linear step of the base policy draws under the run's budget, measured once at step 0 (after
    the budget) and kept in the checkpoints with the base check (`run.base["matched_tasks"]`),
    so a resumed run keeps its count. Other controllers ignore the key."""
    cfg = run.cfg
    if cfg.rollout.focus_tasks != "match" or not CONTROLLERS.get(cfg.algo.controller).trees:
        return
    if "matched_tasks" not in run.base:
        run.base = {**run.base, "matched_tasks": run.comm.on_main(linear_step_tasks, run.rt,
                                                                   run.budget)}
    n = int(run.base["matched_tasks"])
    run.sampler = TaskSampler(run.rt.spec.tasks("train"), cfg.seed, n)
    run.log(f"tasks: {n} a step (rollout.focus_tasks=match: what a linear step of the base "
            f"policy draws under the budget)")


def open_runtime(cfg: RunConfig, log: Callable[[str], None] = print,
                 prepare: Callable[[RunConfig, Callable[[str], None]], RunConfig] | None = None
                 ) -> tuple[RunConfig, Runtime]:
    """(the config to run, the runtime a run starts from): `prepare(cfg, log)` first, the
    command's part (`app.train.train`: a `tiny` built, the memory checks that read the model's
    files; it returns the config to run), then `rollout.runtime.build_runtime`."""
    if prepare is not None:
        cfg = prepare(cfg, log)
    return cfg, build_runtime(cfg, log)


def train(cfg: RunConfig, out: Path, resume: str | None = None,
          log: Callable[[str], None] = print, progress=None, overwrite: bool = False,
          ready: Callable[[], None] | None = None,
          on_step: Callable[[int, dict], object] | None = None,
          prepare: Callable[[RunConfig, Callable[[str], None]], RunConfig] | None = None) -> dict:
    """Run `cfg.train.steps` steps; returns the summary (also written to out/summary.json).
    `resume`: the run folder `out` itself or one of its checkpoints; `overwrite`: start afresh
    in a folder that holds a run (see `run_folder`); `ready()` is called once the folder and
    the checkpoint to resume from have passed their checks, before any model is loaded.
    `on_step(step, row)` is called after each step's row is logged (every rank, the same row);
    returning False or raising `errors.StopTraining` ends the run there, with a checkpoint of
    that step and a summary whose `steps` is the step reached (`--resume` continues it).
    `prepare(cfg, log)` runs before the model is loaded and returns the config to run (see
    `open_runtime`). The checks a command runs before any work (plugin names, engine, memory)
    are the caller's: `app.train.train` is the checked entry every command uses."""
    t_start = time.time()
    if CONTROLLERS.get(cfg.algo.controller).forks:   # a user env that cannot fork: before loading
        require_fork(cfg.env, f"method {cfg.method}")
    require_determinism(cfg.env, log)     # a user env: same seed, same actions -> same results
    comm = from_env(cfg)                  # torchrun: data-parallel ranks (train/distributed.py)
    if not comm.is_main:
        log, progress = (lambda s: None), None
    out = Path(comm.on_main(str, out))
    # the run folder first (lock, no silent overwrite, leftovers removed), before any work
    folder = RunFolder.open(out, resume=bool(resume), overwrite=overwrite, log=log) if comm.is_main else None
    try:
        return _train(cfg, out, resume, log, progress, comm, t_start, ready, prepare, folder,
                      on_step)
    finally:
        if folder is not None:
            try:
                folder.record_sink_files()    # what the sinks wrote since the last record
            finally:
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


@dataclass
class Run:
    """An opened run: what every step reads (models, engine, envs, logs) and the state a
    checkpoint keeps (base and last held-out check, generated tokens so far)."""
    cfg: RunConfig
    out: Path
    comm: Local
    log: Callable[[str], None]
    rt: Runtime                           # model, chat format, env spec, engine, sampling
    learner: Learner
    rollouts: Rollouts
    sampler: TaskSampler
    eval_tasks: list
    metrics: MetricsLog
    start_step: int = 0
    base: dict | None = None
    last_eval: dict | None = None
    tokens_total: int = 0
    budget: int = 0
    rollout_carry: dict = field(default_factory=dict)  # RolloutContext.carry, step to step
    spread_seen: bool = False             # a step among the first ones had reward spread
    stopped_at: int = 0                   # the step a callback stopped the run at (0: none)
    folder: RunFolder | None = None       # rank 0's open run folder (records what it writes)
    env_exception_seen: bool = False      # an env's step() raised (logged once)


def _train(cfg: RunConfig, out: Path, resume: str | None, log, progress, comm, t_start,
           ready, prepare=None, folder: RunFolder | None = None,
           on_step: Callable[[int, dict], object] | None = None) -> dict:
    run = open_run(cfg, out, resume, log, comm, ready, prepare, folder)
    if progress:
        progress.start(cfg.train.steps, run.start_step)
    for step in range(run.start_step + 1, cfg.train.steps + 1):
        row = run_step(run, step)                 # rollout -> credit -> update
        warn_no_spread(run, step, row)
        warn_env_exception(run, row)
        if cfg.train.eval_every and step % cfg.train.eval_every == 0 or step == cfg.train.steps:
            run.last_eval = comm.on_main(evaluate_run, run, step)
            row.update(_eval_fields(run.last_eval))
        if comm.is_main:
            run.metrics.write(row)
        if progress:
            progress.update(step, row)    # `eval/success` only where a check ran
        stop = on_step is not None and stop_asked(on_step, step, row, cfg.train.on_step_timeout_s)
        if comm.is_main and (cfg.train.save_every and step % cfg.train.save_every == 0
                             or step == cfg.train.steps or stop):
            save(run, step)
        if stop:
            run.stopped_at = step
            log(f"stopped by the step callback at step {step} (checkpoint saved)")
            break
    if progress:
        progress.stop()
    return finish(run, t_start)


def stop_asked(on_step: Callable[[int, dict], object], step: int, row: dict,
               timeout_s: float = 0.0) -> bool:
    """Whether the step callback asks to stop: it returned False or raised StopTraining. It
    runs under the guard every piece of user code runs under (`envs.guard.call_user`): within
    `timeout_s` (`train.on_step_timeout_s`; 0: no limit), and an exit (`sys.exit`), any other
    exception or a timeout is one line naming it, its file and the step, and the run stops
    there (a resume starts from the last checkpoint)."""
    name = getattr(on_step, "__qualname__", type(on_step).__name__)
    try:
        return call_user(on_step, (step, dict(row)), {}, timeout_s,
                         f"the step callback {name} at step {step}", passes=(StopTraining,),
                         timeout_key="train.on_step_timeout_s") is False
    except StopTraining:
        return True


def open_run(cfg: RunConfig, out: Path, resume: str | None, log, comm: Local, ready,
             prepare=None, folder: RunFolder | None = None) -> Run:
    """Models, engine, rollouts, envs and logs of a run, from its checkpoint when resuming
    (else with the base held-out check as step 0); the step budget fixed for the run.
    `prepare`: see `open_runtime`."""
    found = _resume_state(cfg, resume, log) if resume and comm.is_main else None
    if resume:                            # the other ranks load the checkpoint rank 0 chose
        where = comm.on_main(lambda: str(found[0]) if found else "")
        if where and not comm.is_main:
            found = checkpoint.load_for_resume(where, log)
    if ready is not None:
        ready()
    torch.manual_seed(cfg.seed)
    cfg, rt = comm.first(lambda: open_runtime(cfg, log, prepare))
    learner = build_learner(cfg, rt.model, comm, rt.model_path, log)
    run = Run(cfg, out, comm, log, rt, learner,
              open_rollouts(rt, learner.critic, out, log),
              TaskSampler(rt.spec.tasks("train"), cfg.seed, cfg.rollout.tasks_per_step, cfg.env.name),
              rt.spec.tasks("eval", cfg.train.eval_tasks),
              MetricsLog(out / "metrics.jsonl", sinks=cfg.train.log, config=cfg.to_dict(),
                         on_sinks=folder.record_sinks if folder is not None else None),
              folder=folder)
    if comm.is_main:
        atomic_write_text(out / "config.json",
                          json.dumps(dataclasses.replace(cfg, out=str(out)).to_dict(), indent=2))
    if found is not None:
        ckpt, state, weights = found
        st = checkpoint.open_checkpoint(ckpt, cfg, into=rt, into_critic=learner.critic,
                                        loaded=(state, weights)).state
        learner.optimizer.load_state_dict(st.optimizer)
        run.start_step, run.base, run.tokens_total = st.step, st.base_eval, st.tokens_total
        # the held-out check in force at the checkpoint
        run.last_eval = st.last_eval if st.last_eval is not None else run.base
        run.rollout_carry = st.rollout_carry
        if comm.is_main:
            run.metrics.truncate_after(run.start_step, on_torn=log)
        log(f"resumed from {ckpt} at step {run.start_step}")
    else:
        run.base = run.last_eval = comm.on_main(evaluate_run, run, 0)
        if comm.is_main:
            run.metrics.reset()
            run.metrics.write({"step": 0, **_eval_fields(run.base)})
        log(f"base held-out success {with_se(run.base['mean@1'], run.base.get('mean@1_se'))}")
        if cfg.rollout.budget_match and cfg.rollout.budget_tokens <= 0:
            run.base = {**run.base, "linear_step_tokens": comm.on_main(
                linear_step_tokens, rt)}
    run.budget = step_budget(cfg, run.base)
    if run.budget != cfg.rollout.budget_tokens:
        log(f"budget: {run.budget} generated tokens per step (a linear step of the base policy)")
    match_tasks(run)
    run.rollouts.sync(rt.model)           # the engine / workers start from the trainer's weights
    return run


def release_freed_memory() -> None:
    """Hand the heap memory that freed tensors left behind back to the operating system
    (glibc's `malloc_trim`; a no-op elsewhere). torch's CPU allocator frees into the C heap,
    which keeps it: without this, each phase's peak sits on top of what the previous phases
    left (the update's activations, the rollout's KV cache). A few milliseconds per call."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.lru_cache(maxsize=None)
def _malloc_trim():
    """glibc's `malloc_trim`, or None where there is none."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def evaluate_run(run: Run, step: int) -> dict:
    """The held-out check at `step` (its own seed, so every check of a run is reproducible)."""
    release_freed_memory()
    cfg = run.cfg
    rt = run.rt
    return evaluate(rt.engine, rt.fmt, rt.spec, run.eval_tasks, cfg.train.eval_samples,
                    rt.params, cfg.rollout.max_tokens, cfg.rollout.batch_size,
                    seed=step_seed(cfg.seed, step, salt=3))


def _eval_fields(ev: dict) -> dict:
    """A check's metrics row fields; `eval/success_se` is the task-clustered standard error of
    `eval/success` (`evaluation.runner.task_clustered_se`; None with one held-out task)."""
    return {"eval/success": ev["mean@1"], "eval/success_se": ev.get("mean@1_se"),
            "eval/tokens_per_question": ev["tokens_per_question"],
            "eval/tool_calls": ev["tool_calls"]}


def run_step(run: Run, step: int) -> dict:
    """One training step: rollout -> credit -> update; -> its metrics row (over all ranks)."""
    cfg, comm, learner, rt, fmt = run.cfg, run.comm, run.learner, run.rt, run.rt.fmt
    t0 = time.time()
    release_freed_memory()                # what the last update and check left in the heap
    # 1. rollout
    ctx = rollout_context(rt, torch.Generator().manual_seed(step_seed(cfg.seed, step, salt=1000 * comm.rank)),
                          budget=-(-run.budget // comm.world), critic=learner.critic,
                          carry=run.rollout_carry)
    result = run.rollouts.run(ctx, comm.share(run.sampler.for_step(step)))
    eps = result.episodes
    t_roll = time.time() - t0
    env_errors = env_errors_within_rate(cfg.env, eps, step)
    # 2. credit
    batch = collate(eps, fmt.pad_id, result.payload)   # the estimator's inputs, passed through
    score(learner, batch, cfg, deferred=True)   # what the update cannot take from its own pass
    if cfg.algo.estimator in PREPARERS:
        PREPARERS.get(cfg.algo.estimator)(learner, batch, eps, fmt, cfg)
    credit = ESTIMATORS.get(cfg.algo.estimator)(batch, cfg.algo)
    batch.advantages, batch.returns, batch.value_mask = credit.advantages, credit.returns, credit.value_mask
    if comm.is_main and trace_due(step, cfg.train.trace_every, cfg.train.steps):   # agentrl view
        if run.folder is not None:
            run.folder.claim(files=[f"traces/step-{step:06d}.json"])
        write_trace(run.out, step, eps, batch, result.trees or None, fmt, cfg.method,
                    algo=cfg.algo)
    # 3. update
    stats = update(learner, batch, cfg, step)
    run.rollouts.sync(rt.model)           # new weights to the engine / workers
    mask = batch.response_mask.bool()
    row = {
        "step": step,
        "reward/mean": float(batch.rewards.mean()),
        **group_metrics(batch, eps),
        "success": sum(e.success for e in eps) / len(eps),
        "adv/mean": float(batch.advantages[mask].mean()) if mask.any() else 0.0,
        "adv/std": float(batch.advantages[mask].std()) if mask.sum() > 1 else 0.0,
        "rollout/tokens": result.tokens,
        "rollout/tokens_per_episode": sum(e.generated_tokens for e in eps) / len(eps),
        "rollout/tool_calls": sum(e.num_tool_calls for e in eps) / len(eps),
        "rollout/turns": sum(e.num_turns for e in eps) / len(eps),
        "env/exceptions": len(env_errors),
        "rollout/logprob_gap": float((batch.engine_logprobs - batch.old_logprobs)[mask].abs().mean()),
        "time/rollout": t_roll,
        "time/step": time.time() - t0,
        "tokens/s": result.tokens / max(t_roll, 1e-9),
        **stats,
        **result.metrics,
        **credit.metrics,
        **reward_metrics(eps),
    }
    if cfg.context.operator != "none":
        row["rollout/context_resets"] = sum(e.meta.context_resets or 0 for e in eps) / len(eps)
    if env_errors:
        row["env/first_exception"] = env_errors[0]
    row = comm.reduce_row(row, sums=("rollout/tokens", "tokens/s", "env/exceptions",
                                     "rollout/tasks"))  # others: mean over ranks
    run.tokens_total += row["rollout/tokens"]
    return row


def env_errors_within_rate(env, eps: list, step: int) -> list[str]:
    """The env errors of a step's episodes (`episode.step_env`), when their share is at most
    `env.max_error_rate`; above it, a one-line `ConfigError` naming the env and the first
    error: a world that fails every episode would train to the end on reward 0."""
    errors = [e.meta.env_error for e in eps if e.finish == "env_error"]
    if eps and len(errors) / len(eps) > env.max_error_rate:
        raise ConfigError(f"env '{env.name}': {len(errors)} of the {len(eps)} episodes of step "
                          f"{step} ended in an env error, above env.max_error_rate="
                          f"{env.max_error_rate:g}; the first: {errors[0]}")
    return errors


def group_metrics(batch, eps: list) -> dict:
    """A step's groups (a GRPO group, a task's tree): the share whose rewards are all equal
    (`rollout/zero_spread_groups`), the share whose rewards differ (`rollout/mixed_groups`:
    those with a learning signal) and the distinct tasks the step learnt from
    (`rollout/tasks`)."""
    flat = zero_spread_groups(batch.rewards, batch.group_index)
    return {"rollout/zero_spread_groups": flat, "rollout/mixed_groups": 1.0 - flat,
            "rollout/tasks": len({e.task_id for e in eps})}


def zero_spread_groups(rewards: torch.Tensor, group_index: torch.Tensor) -> float:
    """The share of groups (episodes of one task: a GRPO group, a FOCUS tree) whose rewards
    are all equal, so their outcome advantages are 0 and they teach nothing (TRL's
    `frac_reward_zero_std`). rewards, group_index: [B] -> a share in [0, 1]."""
    groups = torch.unique(group_index)
    if len(groups) == 0:
        return 0.0
    flat = sum(bool((rewards[group_index == g] == rewards[group_index == g][0]).all())
               for g in groups.tolist())
    return flat / len(groups)


NO_SPREAD_STEPS = 3   # steps from the start with no reward spread in any group before the warning


def warn_no_spread(run: Run, step: int, row: dict) -> None:
    """Log once when each of a run's first NO_SPREAD_STEPS steps had no reward spread in any
    group: every advantage was 0, so the run cannot learn as configured."""
    if step > NO_SPREAD_STEPS or row.get("rollout/zero_spread_groups") != 1.0:
        run.spread_seen = True
        return
    if step == NO_SPREAD_STEPS and not getattr(run, "spread_seen", False):
        rewards = "0" if row.get("reward/mean") == 0 else f"{row.get('reward/mean'):.3g} on average"
        run.log(f"warning: no reward spread in any group: in steps 1-{NO_SPREAD_STEPS} every "
                f"episode of a task got the same reward (mean {rewards}), so every advantage "
                "is 0 and the policy cannot learn; make the tasks easier or harder for this "
                "model, raise rollout.group_size, or check the env's reward (agentrl check-env)")


def warn_env_exception(run: Run, row: dict) -> None:
    """Log the first exception an env's step() raised, once per run; the row keeps its message
    (`env/first_exception`) only in that step (`env/exceptions` counts them every step)."""
    first = row.pop("env/first_exception", None)
    if first is None or run.env_exception_seen:
        return
    run.env_exception_seen = True
    row["env/first_exception"] = first
    run.log(f"warning: env '{run.cfg.env.name}' raised in step(), {first} (such an episode "
            "ends as failed, reward 0; env/exceptions in metrics.jsonl counts them per step)")


def save(run: Run, step: int) -> None:
    """A checkpoint at `step`: weights, optimiser, critic and the run's state (exact resume)."""
    learner = run.learner
    if run.folder is not None:            # claimed before written: a kill mid-save leaves no stray
        run.folder.claim(files=["checkpoints/latest"],
                         checkpoints=[checkpoint.step_dir(run.out, step).name])
    checkpoint.save(run.out, step, run.rt.model, run.rt.tok, {
        "step": step, "optimizer": learner.optimizer.state_dict(),
        "value_head": learner.critic.state_dict() if learner.critic else None,
        "critic_config": critic_config(learner.critic),
        "base_eval": run.base, "last_eval": run.last_eval, "tokens_total": run.tokens_total,
        # rank 0's carry: on several ranks every rank resumes from it (each step's record is
        # its own rank's spend; the ranks' budgets are equal shares)
        "rollout_carry": run.rollout_carry, "method": run.cfg.method,
    })
    if run.folder is not None:
        run.folder.record_sink_files()


def finish(run: Run, t_start: float) -> dict:
    """Close rollouts and logs, check the ranks agree, write summary.json and the curve."""
    cfg, comm = run.cfg, run.comm
    run.rollouts.close()
    comm.check_same(run.learner.params)
    summary = {
        "method": cfg.method, "env": cfg.env.name, "model": cfg.model.name, "seed": cfg.seed,
        "base_success": run.base["mean@1"], "final_success": run.last_eval["mean@1"],
        # task-clustered standard errors (None: one held-out task, or a check from a checkpoint
        # written before checks recorded it)
        "base_success_se": run.base.get("mean@1_se"),
        "final_success_se": run.last_eval.get("mean@1_se"),
        "steps": run.stopped_at or cfg.train.steps, "wall_seconds": time.time() - t_start,
        "tokens_generated": run.tokens_total,
        "base_tokens_per_question": run.base["tokens_per_question"],
        "budget_tokens": run.budget,          # the step cap in force (0: none)
        "tasks_per_step": run.sampler.per_step,   # distinct tasks a step starts from
        "final_tokens_per_question": run.last_eval["tokens_per_question"],
        "eval_tasks": len(run.eval_tasks), "eval_samples": cfg.train.eval_samples,
        "model_path": run.rt.model_path,
    }
    if comm.is_main:
        atomic_write_text(run.out / "summary.json", json.dumps(summary, indent=2))
        png = run.out / f".learning_curve.{os.getpid()}.tmp.png"
        learning_curve(read_metrics(run.out / "metrics.jsonl"), png, method=cfg.method,
                       env=env_label(asdict(cfg.env), asdict(cfg.context)),
                       model=cfg.model.name, seed=cfg.seed,
                       checks=f"{len(run.eval_tasks)} tasks x {cfg.train.eval_samples} samples")
        os.replace(png, run.out / "learning_curve.png")
        run.metrics.close()
    comm.close()
    return summary
