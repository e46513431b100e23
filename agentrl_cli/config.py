"""One source of truth for configuration: frozen dataclasses, YAML presets, dotted overrides.

Precedence (later wins): dataclass defaults < the method's recipe defaults < a benchmark's
presets (`--benchmark`) < YAML file <
`--set key=value` overrides < explicit CLI flags (`--seed`, `--out`, `--method`, ...).
A field's docstring (the string literal after it) is its help text; `agentrl train --help`
points at `describe()`. Every user mistake raises `ConfigError` with one line.
"""
from __future__ import annotations

import ast
import dataclasses
import math
import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, get_type_hints

from .errors import ConfigError


@dataclass(frozen=True)
class ModelConfig:
    name: str = "tiny"
    """`tiny` (the built-in agent: shipped with the package for `search` and `search-long`, built once and cached for other envs), a local Hugging Face folder, or a hub id."""
    dtype: str = "float32"
    """float32 | bfloat16 | float16."""
    attention: str = "sdpa"
    """Attention passed to transformers: eager | sdpa | flex_attention | flash_attention_2 | sink_sdpa (sink-aware, CPU-trainable) | sink_flex (sink-aware FlexAttention, CUDA)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward (less memory, about 1/3 more compute)."""
    critic: str = "head"
    """Critic form when the method needs one: `head` (value head on the policy backbone, trained with it) | `detached` (the same head, its loss kept out of the backbone) | `separate` (its own model, a copy of the initial policy, + value head, as verl's PPO critic: a second forward/backward and a second model's memory)."""
    critic_path: str = ""
    """`model.critic=separate`: start the critic's model from this model folder or hub id instead of a copy of the policy (verl's critic.model.path); it must use the policy's tokenizer, since it reads the policy's token ids. Its value head starts at 0.5. `agentrl widen` writes a wider copy of the policy that computes the same function (docs/methods.md)."""
    device: str = "auto"
    """auto | cpu | cuda."""
    tiny_warmup_steps: int = 4800
    """Tiny model: maximum supervised warm-up steps on imperfect expert demonstrations."""
    tiny_target_success: float = 0.3
    """Tiny model: stop the warm-up at the first check (steps 800, 1000, ..., on 64 training questions the demonstrations leave out) that reaches this success (RL needs room above); otherwise the build keeps its best checked checkpoint."""
    tiny_error_rate: float = 0.15
    """Tiny model: how often the warm-up's demonstrator opens a wrong search result and follows it (per hop, so imitation succeeds about (1 - rate)^hops of the time)."""
    chat_template: str = ""
    """A Jinja file replacing the tokenizer's chat template (which must render the `tool` role and end an assistant message with a stop token: docs/your-model.md). Empty: the model folder's own."""
    tool_format: str = "text"
    """How the model calls tools: `text` (the built-in envs' `tool(argument)` syntax, described in the system prompt) | `hermes` (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, Qwen2.5/Qwen3/Hermes) | `llama3-json` (`{"name": ..., "parameters": {...}}`, Llama 3.1/3.2). With a JSON format the env's tool schemas are rendered by the chat template (`tools=`) and a malformed call is an error observation (docs/your-model.md)."""
    lora_rank: int = 0
    """LoRA adapter rank (0: off, the whole model trains), at most the model's hidden width. > 0: the policy is wrapped with PEFT (`pip install peft`) and only the adapters train; the reference model is the base with adapters disabled; checkpoints hold the adapters. 0 with a LoRA checkpoint as the model: its adapters merged, the whole model trains."""
    lora_alpha: float = 16.0
    """LoRA scaling numerator: the adapters' update is scaled by lora_alpha / lora_rank."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA adapters' input during the update, in [0, 1)."""
    lora_targets: str = ""
    """Comma list of module names that get adapters (e.g. `q_proj,v_proj`). Empty: every attention and MLP projection the model has (Llama/Qwen/Mistral q/k/v/o_proj and gate/up/down_proj, GPT-2 c_attn/c_proj/c_fc, GPT-NeoX/Falcon query_key_value/dense/dense_h_to_4h/dense_4h_to_h, Phi's: docs/your-model.md)."""


@dataclass(frozen=True)
class EnvConfig:
    name: str = "search"
    """Environment name (see `agentrl rollout --help`)."""
    seed: int = 0
    """Seed of the env's world and its train/eval splits (independent of the run seed)."""
    min_hops: int = 2
    """Fewest hops in a task (search: relations; locate: functions on the call chain; rules: rules needed; math: operations)."""
    max_hops: int = 3
    """Most hops in a task (rules up to 4; search, locate and math up to 5)."""
    max_turns: int = 12
    """Assistant turns before an episode is truncated."""
    n_entities: int = 100
    """search: entities in the generated world (more = harder to memorise, more tasks); locate: files per repository."""
    relations: str = "full"
    """search: `full` (several facts per document; the question's relation picks one) or `single`."""
    repos: str = "per-task"
    """locate: `per-task` (every task its own repository) or `shared` (all tasks in one repository, as many LocBench issues share one; held-out tasks start from other functions)."""
    n_train: int = 595
    """Training tasks."""
    n_eval: int = 60
    """Held-out tasks (disjoint from training: search by start entity and relation path, locate by repository or, with shared repositories, by entry function, rules/math by case/problem)."""
    call_cost: float = 0.0
    """search, locate, rules, math: a correct answer earns 1 less this per message before it (tool calls and malformed messages; at least 0), a wrong one 0; success is unchanged. 0: only correctness counts; above 0 the env gives a reason to answer early (e.g. 0.05: a correct answer after 10 calls earns 0.5)."""
    step_timeout_s: float = 60.0
    """Seconds an env's `reset` or `step` may take during a rollout or `agentrl check-env`; a slower one stops the run with one line naming the env, task and step (0: no timeout). docs/your-env.md."""
    max_observation_chars: int = 1_000_000
    """Most characters in one observation (`reset`'s first message or a step's observation); a longer one stops the run with one line naming the env, task and step. docs/your-env.md."""
    deterministic: bool = True
    """A user env gives the same observations and rewards for the same seed and actions: `agentrl train` checks it before any model loads and refuses an env that does not. false: a stochastic env, trained with a warning instead."""
    options: dict = field(default_factory=dict)
    """A user env's options (`--env file.py:factory`, `module:factory` or an `agentrl.envs` entry point), passed to its factory as keywords: `--set env.NAME=VALUE` for such an env lands here (`env.options.NAME=VALUE` works for any env). Only the keys given are passed, so the factory's own defaults hold for the rest (docs/your-env.md)."""


@dataclass(frozen=True)
class RolloutConfig:
    engine: str = "hf"
    """Generation engine: hf | vllm."""
    tasks_per_step: int = 8
    """Distinct tasks per training step (tasks x group_size x max_tokens: at most 2^31)."""
    group_size: int = 8
    """Episodes per task (G)."""
    temperature: float = 1.0
    """Sampling temperature (the trainer's log-probs use the same)."""
    top_p: float = 1.0
    """Nucleus sampling threshold."""
    max_new_tokens: int = 40
    """Most tokens in one assistant message."""
    max_tokens: int = 768
    """Most tokens in a whole episode (prompt + turns + observations)."""
    batch_size: int = 64
    """Episodes decoded concurrently by the engine."""
    budget_tokens: int = 0
    """Generated tokens per step, extra continuations included, averaged over the run (0: no cap): each step's limit is this plus what earlier steps left unspent, less what they overspent (docs/methods.md, budgets); the same for every controller (a linear step whose tasks fall short draws more training tasks)."""
    budget_match: bool = False
    """With budget_tokens 0: cap each step at what a linear (GRPO) step of the base policy generates, measured at step 0 on step 1's tasks (tasks_per_step x group_size episodes; agentrl ablate measures the same) and kept on resume (the focus recipe sets it)."""
    workers: int = 0
    """Ray rollout workers, each with its own engine and envs (0: generate in the trainer process). May change on --resume."""
    ray_address: str = ""
    """Ray cluster to join with rollout.workers > 0 (empty: start a local Ray). May change on --resume."""
    worker_gpus: float = 0.0
    """GPUs per Ray rollout worker (0: CPU workers)."""
    vllm_gpu_memory: float = 0.4
    """vllm engine: fraction of the GPU's memory it may take (weights + KV cache)."""
    vllm_sleep: bool = True
    """vllm engine: sleep (weights to CPU, KV cache freed) during each update, wake to sync weights."""


@dataclass(frozen=True)
class AlgoConfig:
    estimator: str = "grpo"
    """Advantage estimator (set by --method)."""
    loss: str = "ppo_clip"
    """Policy loss: ppo_clip | gspo | turn_ratio."""
    controller: str = "linear"
    """Rollout controller: linear | vine | focus."""
    eps_low: float = 0.2
    """Lower clip range of the importance ratio."""
    eps_high: float = 0.2
    """Upper clip range of the importance ratio (DAPO clip-higher: 0.28)."""
    agg: str = "token-mean"
    """Loss aggregation: token-mean | seq-mean | token-sum-norm (Dr. GRPO: masked sum / (episodes x agg_norm))."""
    agg_norm: int = 0
    """token-sum-norm: the constant divisor per episode (0: the run's per-episode generation cap, min(env.max_turns x rollout.max_new_tokens, rollout.max_tokens))."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the frozen reference model (a loss term, verl's use_kl_loss; its estimator: algo.kl_estimator)."""
    kl_estimator: str = "k3"
    """Per-token estimator of KL(policy || reference) in the algo.kl_coef penalty, with d = log pi_ref - log pi: k1 (-d, the plain log ratio: unbiased, can be negative) | k2 (d^2 / 2) | k3 (exp(d) - d - 1: unbiased, never negative; verl's low_var_kl, TRL's)."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus in the policy loss: the loss subtracts entropy_coef x the policy's mean entropy over response tokens (aggregated as algo.agg). 0: no bonus (the metric policy/entropy is logged either way)."""
    rewards: list = field(default_factory=list)
    """Reward functions of the episode, each `file.py:fn`, `module:fn` or `{fn: file.py:fn, weight: 0.5, name: ...}` (weight 1, name the function's): added to (or with algo.reward_mode=replace, instead of) the env's outcome reward at every episode's end, so every method's credit sees them; logged per step as reward/<name>. `agentrl train --reward FILE.py:fn[:WEIGHT]` (docs/rewards.md)."""
    reward_mode: str = "add"
    """How algo.rewards combine with the env's reward: add (env reward + sum of weight x fn) | replace (sum of weight x fn only; success stays the env's verdict)."""
    std_normalize: bool = True
    """GRPO: divide by the group's standard deviation (False is Dr. GRPO)."""
    gamma: float = 1.0
    """Discount."""
    lam: float = 0.95
    """GAE / TD(lambda) lambda."""
    lam_intra: float = 0.95
    """MPO intra-turn trace lambda."""
    beta: float = 1.0
    """MPO weight of the centred intra-turn term."""
    kappa: float = 1.0
    """FOCUS prior strength of the critic."""
    vf_coef: float = 0.5
    """Weight of the critic loss."""
    value_clip: float = 0.0
    """Critic value clipping range (0: off)."""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal and refill with more tasks (linear controller)."""
    dynamic_rounds: int = 3
    """DAPO dynamic sampling: most refill rounds per step (each samples as many new tasks as groups are missing)."""
    overlong_shaping: bool = False
    """DAPO: add a length penalty to the reward (linear over the last `overlong_cache` tokens before rollout.max_tokens, -1 if cut by it)."""
    overlong_cache: int = 128
    """DAPO overlong shaping: width L_cache of the soft-penalty window, in episode tokens."""
    whiten: bool = False
    """Normalise advantages over the batch's policy tokens (gae, vine and mpo estimators)."""
    vine_k: int = 3
    """VinePPO: continuations per segment-boundary state (the paper uses 9; 3 keeps CPU runs short)."""
    trace_eps: float = 0.1
    """TRACE: eps in d_k = -l_k + eps."""
    trace_k: int = 3
    """TRACE: look-ahead turns K of the normalised turn credit."""
    gamma_td: float = 0.8
    """TRACE: discount of the look-ahead and of the terminal bonus."""
    lambda_term: float = 2.0
    """TRACE: weight of the outcome advantage in the turn reward of the last tool-call turns."""
    alpha_out: float = 1.0
    """TRACE: weight of the GRPO outcome advantage in every token's advantage."""
    alpha_turn: float = 0.2
    """TRACE: weight of the turn credit r_k in a tool-call turn's token advantage."""
    trace_answer: str = "answer({answer})"
    """TRACE: how the gold answer is teacher-forced after each boundary ({answer} = the gold text)."""
    focus_roots: int = 2
    """FOCUS: root episodes per task before any branching (capped at group_size without a token budget)."""
    focus_allocator: str = "focus"
    """FOCUS: continuation allocator: focus (largest gain) | uniform | random | raw-residual (|v - cbar|), or your own: FILE.py:NAME (its path recorded absolute), module:NAME or an installed `agentrl.allocators` entry point, a function `fn(candidates, ctx) -> node or None` with `ctx.algo`, `ctx.rng`, `ctx.trees` (docs/methods.md, "Your own allocator")."""
    focus_gain: str = "plugin"
    """FOCUS: gain of one more continuation: plugin (MSE drop at p = cbar) | bayes (posterior-variance drop)."""
    focus_baseline: str = "refined"
    """FOCUS: the values a path's advantages use: refined (V~, the paper's) | loo (V~ recomputed without the path's own leaf, so its outcome is not in its own baseline)."""
    focus_prior: str = "critic"
    """FOCUS: what a node's refined value shrinks its evidence toward (Eq. 1's V(s)): critic (the critic's value, the paper's) | tree (the mean reward of the task's tree this step, the same for every node: a critic-free prior, GRPO's group mean refined by the tree's own evidence at its branch points; the allocator still reads the critic)."""
    focus_evidence: str = "own"
    """FOCUS: a node's evidence n, cbar: own (its own samples: the path that created it and the continuations launched from it, as in the paper) | subtree (every completed leaf below it; ablation)."""
    focus_norm: str = "none"
    """FOCUS: normalisation of the segment advantages: tree (centred on the task tree's policy tokens and divided by the std of its paths' rewards; 0 in a tree whose paths all got the same reward, as GRPO's group) | none (raw TD residuals of refined values, as in the paper)."""
    focus_max_inflight: int = 2
    """FOCUS: most continuations launched from one node running at once."""
    focus_min_depth: int = 0
    """FOCUS: continuations launch only from states at least this many segments below the root (0: from any state, as in the paper). `benchmarks/tree_outcome_info.py` measures at which depths a run's states say something about their outcome beyond the task."""
    focus_lam: float = 0.0
    """FOCUS: TD(lambda) lambda of the segment advantages on refined values (0: one-step TD residual)."""
    focus_return: str = "path"
    """FOCUS: what a segment's advantage measures its state against: path (the TD(lambda) return of the path that generated it: with lambda 1 its own reward R, as in the paper) | subtree (the evidence-only value of the state the segment leads to, the recursive mean outcome of every sample below it, which is R on a stretch with no branch below; with lambda < 1 mixed with that state's refined value as (1 - lambda) V~ + lambda G). A segment several paths share is trained once, on the path that generated it: subtree gives it every outcome below it instead of that path's one."""
    focus_segment_weight: str = "one"
    """FOCUS: the weight of a trained segment in the policy loss: one (every segment, as in the paper: a state that got many continuations contributes a gradient term per continuation) | visit (the on-policy share of the segment's start state split among the samples drawn there: the root weighs 1, each child of a state its share over the state's children with a finished path, so every state's actions weigh what an on-policy draw would give it; rescaled per tree to the tree's token count, so the loss keeps its size)."""
    focus_critic_backup: str = "refined"
    """FOCUS: what the critic's node targets G_bar back up: refined (each child's V~, the critic's own value mixed in with weight kappa, as in the paper's Eq. 1) | evidence (the same one-step backup with kappa = 0: only the tree's outcomes, so on an unbranched stretch every node's target is the path's reward R and at a branch point the mean over its children; the critic is not regressed toward itself). The policy's credit is unchanged."""
    focus_critic_targets: str = "nodes"
    """FOCUS: where the critic is regressed: nodes (G_bar at each tree node's boundary, as in the paper) | tokens (also every policy token of a segment, on the refined value the segment leads to: V~(s_{k+1}), or R for the last one; PPO's per-token targets on the tree's evidence)."""


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 100
    """Training steps (one rollout batch + update each). May change on --resume."""
    lr: float = 2e-4
    """Adam learning rate."""
    lr_schedule: str = "constant"
    """Learning-rate schedule over train.steps, after the warm-up, applied to the policy's and the critic's rates alike: constant | linear (down to lr / (steps - warmup) at the last step) | cosine (half a cosine toward 0). Logged per step as lr (the policy's)."""
    warmup_steps: int = 0
    """Linear warm-up from 0: step s <= warmup_steps trains at lr x s / warmup_steps (0: none)."""
    critic_lr: float = 0.0
    """Learning rate of the critic's own parameters (the value head, or the whole separate critic model) when the method has a critic; 0 = train.lr. verl and OpenRLHF give PPO critics their own, often larger, rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient-norm clip (0: off), applied to the policy's gradient and to the critic's own parameters' gradient apart (verl's actor and critic grad_clip): a critic's gradient does not shrink the policy's step. Logged before clipping as grad_norm and critic/grad_norm."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    minibatches: int = 1
    """Optimiser steps per pass."""
    critic_warmup: int = 0
    """Methods with a critic: the first N steps update only the value head (the policy, backbone included, stays the base model); they count toward train.steps and spend rollout tokens like any step."""
    max_tokens_per_microbatch: int = 4096
    """Token budget of one forward/backward micro-batch (gradient accumulation above it). Activations grow with it: 4096 keeps a CPU step's peak memory at 0.6x of 16384's and is faster there (docs/performance.md); on a GPU raise it (16384-65536) until memory binds."""
    logprob_chunk: int = 512
    """Tokens per log-prob chunk: logits exist for one chunk at a time and are recomputed in backward (0: whole sequence at once)."""
    old_logprobs: str = "auto"
    """Where a single-pass update (train.ppo_epochs=1, train.minibatches=1: the on-policy default) takes its old log-probs, with no scoring forward: engine (the rollout engine's, for each micro-batch whose mean |engine - trainer| gap over policy tokens, measured in the update's own forward at the rollout's weights, is within train.logprob_tolerance; the trainer's own log-probs from that forward otherwise) | score (a scoring forward before the update, as every multi-pass update does) | auto (engine with the hf engine, score with any other). Metric old_logprobs/engine: the share of policy tokens whose old log-probs were the engine's."""
    logprob_tolerance: float = 1e-3
    """train.old_logprobs=engine: the largest mean |engine - trainer| log-prob gap over a micro-batch's policy tokens at which the engine's log-probs are the old ones."""
    pack: bool = False
    """Packed forward passes: a micro-batch's episodes run as one row without padding (position ids restart per episode, attention stays within each episode), train.max_tokens_per_microbatch then counts real tokens; false: right-padded rows of similar length. Needs sdpa or sink_sdpa attention without activation checkpointing (otherwise, and for episodes with context resets, the padded pass runs)."""
    tree_pack: bool = True
    """Tree-packed forward passes: the episodes of a micro-batch that share a prefix (a FOCUS tree's paths, which copy their source path up to the node; a GRPO group's prompt) run as one row in which each shared token appears once, under a tree attention mask (a token attends to its own path's earlier tokens, at its path's positions), so a prefix is forwarded once, not once per episode; the log-probs, values and gradients are the per-episode ones. train.max_tokens_per_microbatch then counts distinct tokens. Needs sdpa, eager or sink_sdpa attention without sliding-window layers and train.max_tokens_per_microbatch <= 8192 (the tree mask is dense: tokens x tokens); otherwise, and for episodes with context resets, train.pack decides. false: each episode forwards its own copy."""
    eval_every: int = 10
    """Evaluate on held-out tasks every N steps (0: only at the start and the end). May change on --resume."""
    eval_tasks: int = 60
    """Held-out tasks per evaluation."""
    eval_samples: int = 4
    """Samples per held-out task in training-time evaluations."""
    save_every: int = 10
    """Checkpoint every N steps (0: only at the end). May change on --resume."""
    trace_every: int = 10
    """Keep a sample of the step's episodes and FOCUS trees every N steps, at step 1 and at the last step, in <run>/traces/step-NNNNNN.json, for `agentrl view` (at most 300 KB a step: the first 4 trees and up to 12 of their episodes, every token with its response mask and advantage; docs/traces.md); 0: off. May change on --resume."""
    log: str = ""
    """Metric sinks besides metrics.jsonl, comma-separated: tensorboard (<run>/tensorboard/, needs the `tensorboard` extra) | wandb (mode from WANDB_MODE, e.g. offline); empty: none. May change on --resume."""


@dataclass(frozen=True)
class ContextConfig:
    operator: str = "none"
    """Context operator: none | compaction (the policy summarises at the threshold; the summary replaces the history) | workspace (put/get/scan/delete tools; the context is reset at the threshold)."""
    threshold_tokens: int = 384
    """Visible context length (prompt + current window + the next observation) that triggers a compaction or a workspace reset."""
    style: str = "free"
    """compaction: free (one free-form request) | structured (four sections: Goal, Facts found, Open leads, Next step)."""


@dataclass(frozen=True)
class RunConfig:
    method: str = "focus"
    """Training recipe (see the README's method table)."""
    seed: int = 0
    """Run seed: sampling, task order, initial critic."""
    out: str = ""
    """Output folder (default runs/<time>-<method>-<env>)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    context: ContextConfig = field(default_factory=ContextConfig)

    @property
    def episodes_per_step(self) -> int:
        return self.rollout.tasks_per_step * self.rollout.group_size

    @property
    def agg_norm(self) -> int:
        """token-sum-norm's divisor per episode: algo.agg_norm, else the most tokens one
        episode can generate (TRL's max_completion_length for a multi-turn episode)."""
        return self.algo.agg_norm or min(self.env.max_turns * self.rollout.max_new_tokens,
                                         self.rollout.max_tokens)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------- validation
_POSITIVE = {
    "rollout.tasks_per_step", "rollout.group_size", "rollout.max_new_tokens", "rollout.max_tokens",
    "rollout.batch_size", "train.lr", "train.ppo_epochs", "train.minibatches",
    "train.max_tokens_per_microbatch", "train.eval_tasks", "train.eval_samples",
    "env.max_turns", "env.min_hops", "algo.vine_k", "algo.trace_eps", "algo.trace_k",
    "algo.overlong_cache", "env.n_train", "env.n_eval", "env.max_observation_chars",
}
_NON_NEGATIVE = {
    "train.steps", "train.eval_every", "train.save_every", "train.trace_every", "train.grad_clip", "train.weight_decay",
    "rollout.budget_tokens", "rollout.temperature", "algo.kl_coef", "algo.eps_low", "algo.eps_high",
    "algo.vf_coef", "algo.value_clip", "algo.kappa", "algo.beta", "model.tiny_warmup_steps", "algo.agg_norm",
    "algo.dynamic_rounds", "algo.lambda_term", "algo.alpha_out", "algo.alpha_turn",
    "train.logprob_chunk", "train.logprob_tolerance", "rollout.workers", "rollout.worker_gpus", "train.critic_lr",
    "train.critic_warmup", "seed", "env.seed", "algo.focus_min_depth", "train.warmup_steps",
    "env.step_timeout_s",
    "algo.entropy_coef",
}
# Upper bounds on sizes that can only be mistakes (`--set rollout.group_size=1e9` would fail
# much later with MemoryError); `describe()` (the config reference) lists each with its field.
_CAPS = {
    "rollout.group_size": 1024, "rollout.tasks_per_step": 65_536, "rollout.batch_size": 65_536,
    "rollout.max_new_tokens": 2**20, "rollout.max_tokens": 2**20, "rollout.workers": 4096,
    "rollout.budget_tokens": 10**12, "train.steps": 10**7, "train.eval_tasks": 10**6,
    "train.eval_samples": 4096, "train.ppo_epochs": 1000, "train.minibatches": 65_536,
    "train.max_tokens_per_microbatch": 2**24, "train.logprob_chunk": 2**24,
    "train.critic_warmup": 10**7, "train.warmup_steps": 10**7, "algo.vine_k": 1024, "algo.trace_k": 1024,
    "algo.dynamic_rounds": 1000, "algo.focus_roots": 1024, "algo.focus_max_inflight": 1024, "algo.focus_min_depth": 10_000,
    "env.max_turns": 10_000, "env.n_entities": 10**6, "env.n_train": 10**7, "env.n_eval": 10**6,
    "env.min_hops": 100, "env.max_hops": 100, "model.tiny_warmup_steps": 10**7,
    "context.threshold_tokens": 2**20,
    "seed": 2**63 - 1, "env.seed": 2**63 - 1,   # what torch's and Python's generators take
}
# episodes x tokens of one step's batch tensors ([episodes, max_tokens] per field)
BATCH_CELLS_CAP = 2**31
_UNIT = {"algo.gamma", "algo.lam", "algo.lam_intra", "model.tiny_target_success", "algo.gamma_td",
         "model.tiny_error_rate"}
_CHOICES = {
    "context.style": ("free", "structured"),
    "algo.agg": ("token-mean", "seq-mean", "token-sum-norm"),
    "model.dtype": ("float32", "bfloat16", "float16"),
    "model.critic": ("head", "detached", "separate"),
    "model.device": ("auto", "cpu", "cuda"),
    "model.tool_format": ("text", "hermes", "llama3-json"),
    "model.attention": ("eager", "sdpa", "flex_attention", "flash_attention_2", "sink_sdpa", "sink_flex"),
    "env.relations": ("single", "full"),
    "env.repos": ("per-task", "shared"),
    "algo.focus_baseline": ("refined", "loo"),
    "algo.focus_prior": ("critic", "tree"),
    "algo.focus_evidence": ("own", "subtree"),
    "algo.focus_norm": ("tree", "none"),
    "algo.focus_critic_targets": ("nodes", "tokens"),
    "algo.focus_critic_backup": ("refined", "evidence"),
    "algo.focus_return": ("path", "subtree"),
    "algo.focus_segment_weight": ("one", "visit"),
    "train.old_logprobs": ("auto", "engine", "score"),
    "train.lr_schedule": ("constant", "linear", "cosine"),
    "algo.kl_estimator": ("k1", "k2", "k3"),
    "algo.reward_mode": ("add", "replace"),
}


def _validate(cfg: RunConfig) -> None:
    flat = flatten(cfg)
    for key in _POSITIVE:
        if not flat[key] > 0:
            raise ConfigError(f"{key} must be > 0, got {flat[key]}")
    for key in _NON_NEGATIVE:
        if flat[key] < 0:
            raise ConfigError(f"{key} must be >= 0, got {flat[key]}")
    for key, cap in _CAPS.items():
        if flat[key] > cap:
            raise ConfigError(f"{key} must be <= {cap:,} (its documented cap), got {flat[key]:,}")
    cells = cfg.episodes_per_step * cfg.rollout.max_tokens
    if cells > BATCH_CELLS_CAP:
        raise ConfigError(f"rollout.tasks_per_step x rollout.group_size x rollout.max_tokens = "
                          f"{cells:,} exceeds 2^31 (one step's batch would not fit in memory)")
    from .reporting.sinks import parse as parse_sinks

    try:
        parse_sinks(cfg.train.log)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for key in _UNIT:
        if not 0.0 <= flat[key] <= 1.0:
            raise ConfigError(f"{key} must be in [0, 1], got {flat[key]}")
    for key, choices in _CHOICES.items():
        if flat[key] not in choices:
            raise ConfigError(f"{key} must be one of {', '.join(choices)}, got '{flat[key]}'")
    if not 0.0 < cfg.rollout.vllm_gpu_memory <= 1.0:
        raise ConfigError(f"rollout.vllm_gpu_memory must be in (0, 1], got {cfg.rollout.vllm_gpu_memory}")
    if not 0.0 < cfg.rollout.top_p <= 1.0:
        raise ConfigError(f"rollout.top_p must be in (0, 1], got {cfg.rollout.top_p}")
    if cfg.rollout.max_new_tokens > cfg.rollout.max_tokens:
        raise ConfigError(f"rollout.max_new_tokens ({cfg.rollout.max_new_tokens}) must be <= "
                          f"rollout.max_tokens ({cfg.rollout.max_tokens}): one turn cannot "
                          "outgrow the whole episode")
    if cfg.algo.overlong_shaping and cfg.algo.overlong_cache > cfg.rollout.max_tokens:
        raise ConfigError(f"algo.overlong_cache ({cfg.algo.overlong_cache}) must be <= "
                          f"rollout.max_tokens ({cfg.rollout.max_tokens})")
    if "{answer}" not in cfg.algo.trace_answer:
        raise ConfigError(f"algo.trace_answer must contain '{{answer}}', got '{cfg.algo.trace_answer}'")
    if cfg.model.attention == "sink_flex" and cfg.model.device == "cpu":
        raise ConfigError("model.attention=sink_flex needs CUDA (FlexAttention has no CPU backward); "
                          "use sink_sdpa on CPU")
    if cfg.context.operator != "none":
        _validate_context(cfg)
    if cfg.algo.reward_mode == "replace" and not cfg.algo.rewards:
        raise ConfigError("algo.reward_mode=replace needs at least one reward function "
                          "(--reward FILE.py:fn or algo.rewards)")
    if cfg.env.max_hops < cfg.env.min_hops:
        raise ConfigError(f"env.max_hops ({cfg.env.max_hops}) < env.min_hops ({cfg.env.min_hops})")
    for key in ("rollout.temperature",):
        if flat[key] == 0:
            raise ConfigError(f"{key} must be > 0 for training (use eval --greedy for argmax)")


def _validate_context(cfg: RunConfig) -> None:
    """An operator needs a threshold it can reach and the in-process token-level engine."""
    c = cfg.context
    if not 0 < c.threshold_tokens < cfg.rollout.max_tokens:
        raise ConfigError(f"context.threshold_tokens must be in (0, rollout.max_tokens="
                          f"{cfg.rollout.max_tokens}), got {c.threshold_tokens}")
    if cfg.rollout.workers > 0 or cfg.rollout.engine != "hf":
        raise ConfigError(f"context.operator={c.operator} runs with the in-process hf engine only "
                          "(rollout.engine=hf, rollout.workers=0)")
    if cfg.model.attention not in ("sdpa", "eager", "sink_sdpa"):
        raise ConfigError(f"context.operator={c.operator} trains with a dense window mask: "
                          f"model.attention must be sdpa, eager or sink_sdpa, got {cfg.model.attention}")


def step_seed(seed: int, step: int, salt: int = 0) -> int:
    """A per-step seed derived from the run's seed: resuming at step s regenerates exactly the
    same randomness."""
    return (seed * 1_000_003 + step * 7919 + salt * 104_729) % (2**63 - 1)


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """{'train.lr': 2e-4, ...} for every leaf field."""
    out: dict[str, Any] = {}
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(v):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _leaf_types(cls: type = RunConfig, prefix: str = "") -> dict[str, type]:
    hints = get_type_hints(cls)
    out: dict[str, type] = {}
    for f in fields(cls):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            out.update(_leaf_types(t, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = t
    return out


LEAF_TYPES = _leaf_types()
SECTIONS = {k.split(".")[0] for k in LEAF_TYPES if "." in k}


def _coerce(key: str, value: Any) -> Any:
    """Convert a YAML or `--set` value to the field's type, or raise ConfigError."""
    t = LEAF_TYPES[key]
    if isinstance(value, str) and t is not str:
        text = value.strip()
        if t is bool:
            low = text.lower()
            if low in ("true", "1", "yes", "on"):
                return True
            if low in ("false", "0", "no", "off"):
                return False
            raise ConfigError(f"{key} expects true/false, got '{value}'")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise ConfigError(f"{key} expects {t.__name__}, got '{value}'") from None
    if t is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} expects true/false, got {value!r}")
        return value
    if t is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not value.is_integer()
        ):
            raise ConfigError(f"{key} expects an integer, got {value!r}")
        return int(value)
    if t is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} expects a number, got {value!r}")
        if not math.isfinite(float(value)):
            raise ConfigError(f"{key} must be finite, got {value!r}")
        return float(value)
    if t is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key} expects a string, got {value!r}")
        return str(value)
    return value


def _check_key(key: str) -> None:
    if key in LEAF_TYPES:
        return
    from .registry import suggest

    head = key.partition(".")[0]
    if head not in SECTIONS and head not in LEAF_TYPES:
        _check_section(head, key)
    close = suggest(key, list(LEAF_TYPES))
    hint = f" (did you mean '{close}'?)" if close else ""
    raise ConfigError(f"unknown config key '{key}'{hint}")


def _check_section(name: str, key: str | None = None) -> None:
    """A one-line error for unknown section `name` (of `key`, a dotted key), naming the
    nearest section when it is a mistyped one (`trian`), or the nearest key of that section
    (`trian.stesp`: `train.steps`). With `key`, returns when no section is near (the caller's
    error for the key follows)."""
    from .registry import suggest

    close = suggest(name, sorted(SECTIONS))
    if close is None and key is not None:
        return
    rest = key.partition(".")[2] if key else ""
    if close and rest:
        near = suggest(rest, [k.partition(".")[2] for k in LEAF_TYPES if k.startswith(f"{close}.")])
        if near:
            raise ConfigError(f"unknown config key '{key}' (did you mean '{close}.{near}'?)")
    given = f" in '{key}'" if key and key != name else ""
    hint = f"did you mean '{close}'? " if close else ""
    raise ConfigError(f"unknown config section '{name}'{given} ({hint}sections: "
                      f"{', '.join(sorted(SECTIONS))})")


_ENV_KEY = re.compile(r"env\.(options\.)?[A-Za-z_][A-Za-z0-9_]*$")
ENV_FIELDS = tuple(f.name for f in fields(EnvConfig))


def _check_given_key(key: str) -> None:
    """`_check_key` for a key as given (YAML, --set): an `env.NAME` key may be a user env's
    option, which `build` decides once the env's name is known."""
    if not _ENV_KEY.match(key):
        _check_key(key)


def user_env(name: str) -> bool:
    """Whether env `name` is a user env: `module:attr`, `file.py:attr`, or the name of an
    installed package's `agentrl.envs` entry point (read from package metadata; nothing is
    imported: loading it is the env registry's business)."""
    if ":" in name:
        return True
    from importlib.metadata import entry_points

    try:
        return any(ep.name == name for ep in entry_points(group="agentrl.envs"))
    except Exception:  # noqa: BLE001  (broken metadata of some package)
        return False


def env_name(name: str) -> str:
    """`env.name` as a run records it: a `file.py:attr` env with its file path made absolute
    (so resume, eval, subprocesses and workers find it from any folder), others as given."""
    target, _, attr = name.rpartition(":")
    if target.endswith(".py") and attr:
        return f"{os.path.abspath(os.path.expanduser(target))}:{attr}"
    return name


REWARD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*$")
RESERVED_REWARD_NAMES = ("mean", "env")   # reward/mean and reward/env are the run's own metrics


def _reward_item(item: Any) -> dict[str, Any]:
    """One `algo.rewards` entry -> {"name", "fn", "weight"}: `[NAME=]SPEC[:WEIGHT]` or a mapping
    with `fn` (and optional `weight`, `name`); a `file.py:fn` path made absolute (`env_name`)."""
    if isinstance(item, str):
        name, eq, rest = item.partition("=")
        if not eq or ":" in name:
            name, rest = "", item
        head, _, tail = rest.rpartition(":")
        try:
            weight, spec = (float(tail), head) if ":" in head else (1.0, rest)
        except ValueError:
            weight, spec = 1.0, rest
        item = {"fn": spec.strip(), "weight": weight, **({"name": name.strip()} if name else {})}
    if not isinstance(item, dict) or not isinstance(item.get("fn"), str):
        raise ConfigError(f"algo.rewards: each entry is FILE.py:fn[:WEIGHT], module:fn or "
                          f"{{fn: ..., weight: ...}}, got {item!r}")
    unknown = sorted(set(item) - {"fn", "weight", "name"})
    if unknown:
        raise ConfigError(f"algo.rewards: unknown field '{unknown[0]}' in {item!r} (fields: fn, "
                          "weight, name)")
    target, _, attr = item["fn"].rpartition(":")
    if not target or not attr:
        raise ConfigError(f"algo.rewards: '{item['fn']}' is not FILE.py:fn or module:fn")
    weight = item.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise ConfigError(f"algo.rewards: the weight of {item['fn']} must be a finite number, "
                          f"got {weight!r}")
    name = str(item.get("name") or attr.rsplit(".", 1)[-1])
    if not REWARD_NAME.match(name) or name in RESERVED_REWARD_NAMES:
        raise ConfigError(f"algo.rewards: '{name}' cannot name a reward (its metric is "
                          f"reward/{name}); give the entry another name")
    return {"name": name, "fn": env_name(item["fn"]), "weight": float(weight)}


def reward_specs(value: Any) -> list[dict[str, Any]]:
    """`algo.rewards` as given (a YAML list, a `--set` literal, or `--set` specs separated by
    commas) -> [{"name", "fn", "weight"}, ...]; names unique."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = [p for p in text.split(",") if p.strip()]
    if isinstance(value, (str, dict)):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"algo.rewards expects a list of reward functions, got {value!r}")
    out = [_reward_item(item) for item in value]
    names = [r["name"] for r in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"algo.rewards: two reward functions are named '{twice[0]}'; name one "
                          f"of them (NAME=FILE.py:fn or name: ...)")
    return out


def _option_value(value: Any) -> Any:
    """A user env option's value: a `--set` string read as true/false or as a Python literal
    when it is one (`3`, `0.5`, `[1, 2]`, `'x'`), else kept as the string (`add`)."""
    if not isinstance(value, str):
        return value
    if value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    try:
        v = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value
    return v if isinstance(v, (int, float, str, list, dict, type(None))) else value


def _env_options(overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` with `env.options.NAME` keys, and a user env's `env.NAME` keys that are not
    `EnvConfig` fields, gathered into one `env.options` dict; `env.name` as `env_name` records
    it, and so `algo.focus_allocator` (a `FILE.py:NAME` allocator's path made absolute). An
    unknown `env.NAME` of a built-in env stays, for `build`'s one-line error."""
    out = dict(overrides)
    for key in ("env.name", "algo.focus_allocator"):
        if key in out:
            out[key] = env_name(str(out[key]))
    options = out.pop("env.options", None)
    options = _option_value(options) if options is not None else {}
    if not isinstance(options, dict):
        raise ConfigError(f"env.options expects a mapping of option names to values, got {options!r}")
    options = dict(options)
    name = str(out.get("env.name", EnvConfig.name))
    extra = [k for k in out if k.startswith("env.") and k not in LEAF_TYPES]
    for key in extra:
        sub = key[len("env."):]
        if sub.startswith("options."):
            sub = sub[len("options."):]
        elif not user_env(name):
            continue
        value = out.pop(key)
        if sub in ("name", "seed", "options"):
            raise ConfigError(f"{key}: give env.{sub} itself")
        options[sub] = _coerce(f"env.{sub}", value) if sub in ENV_FIELDS else _option_value(value)
    if options or "env.options" in overrides:
        out["env.options"] = options
    return out


# the env section's keys the rollout reads at the env boundary (envs/guard.py), never an
# option of the env's factory
ENV_BOUNDARY_KEYS = ("step_timeout_s", "max_observation_chars", "deterministic")


def _user_env_fields(values: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """For a user env, each `EnvConfig` field the user set (`env.max_turns`, ...) is also one
    of its options (`env.options.max_turns`): the factory gets exactly the keys given."""
    name = str(values.get("env.name", name or EnvConfig.name))
    given = [k for k in values if k.startswith("env.") and k[4:] in ENV_FIELDS
             and k[4:] not in ("name", "seed", "options", *ENV_BOUNDARY_KEYS)]
    if not given or not user_env(name):
        return values
    return {**values, **{f"env.options.{k[4:]}": values[k] for k in given}}


def parse_sets(items: list[str] | None) -> dict[str, Any]:
    """['train.lr=1e-4', ...] -> {'train.lr': '1e-4'} (values converted later, by type)."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got '{item}'")
        key, value = item.split("=", 1)
        key = key.strip()
        _check_given_key(key)
        out[key] = value
    return out


# What a YAML file may make us read and build, checked before it is parsed: its size, and the
# nodes it holds once every alias is expanded (a few KB of nested aliases, "billion laughs",
# would otherwise expand to gigabytes in whatever walks the result).
YAML_BYTES_CAP = 1 << 20
YAML_NODES_CAP = 100_000


def check_yaml(text: str, where: str) -> None:
    """A one-line error if `text` expands to more than YAML_NODES_CAP nodes (aliases counted
    at their full size); counted on the parser's event stream, which never builds the nodes."""
    import yaml

    sizes: dict[str, int] = {}            # anchor -> expanded size of its node
    stack: list[list] = []                # open collections: [anchor, size so far]
    total = 0

    def done(size: int, anchor: str | None) -> None:
        nonlocal total
        if anchor is not None:
            sizes[anchor] = size
        if stack:
            stack[-1][1] += size
        else:
            total += size
        if total + sum(c[1] for c in stack) > YAML_NODES_CAP:
            raise ConfigError(f"{where} expands to more than {YAML_NODES_CAP:,} YAML nodes "
                              "(nested aliases?); refused before parsing")

    try:
        for ev in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(ev, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                stack.append([ev.anchor, 1])
            elif isinstance(ev, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                anchor, size = stack.pop()
                done(size, anchor)
            elif isinstance(ev, yaml.ScalarEvent):
                done(1, ev.anchor)
            elif isinstance(ev, yaml.AliasEvent):
                done(sizes.get(ev.anchor, 1), None)
    except yaml.YAMLError:
        return                            # the loader reports it, with its line


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML preset into flat dotted keys (nested sections or dotted keys both work).
    At most YAML_BYTES_CAP bytes and YAML_NODES_CAP nodes (`check_yaml`)."""
    import yaml

    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {p} is a folder; give a YAML file")
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    if p.stat().st_size > YAML_BYTES_CAP:
        raise ConfigError(f"config file {p} has {p.stat().st_size:,} bytes; a config is at most "
                          f"{YAML_BYTES_CAP:,}")
    with p.open("rb") as f:
        raw = f.read(YAML_BYTES_CAP + 1)
    if len(raw) > YAML_BYTES_CAP:         # grew since the stat (or a pipe)
        raise ConfigError(f"config file {p} has more than {YAML_BYTES_CAP:,} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ConfigError(f"{p} is not UTF-8 text (byte 0x{raw[e.start]:02x} on line {line})") from None
    check_yaml(text, str(p))
    try:
        data = yaml.load(text, Loader=_unique_key_loader()) or {}
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"malformed YAML in {p}{where}: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a mapping of config keys, got {type(data).__name__}")
    flat: dict[str, Any] = {}

    def walk(d: dict, prefix: str) -> None:
        for k, v in d.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict) and key in SECTIONS:
                walk(v, key + ".")
            elif isinstance(v, dict) and not prefix and key not in LEAF_TYPES:
                _check_section(key)       # `trian:` holding keys: the nearest section
            else:
                _check_given_key(key)
                if key in flat:           # `train.lr: x` and `train: {lr: y}` in one file
                    raise ConfigError(f"{p}: key '{key}' is given twice")
                flat[key] = v

    walk(data, "")
    return flat


def _unique_key_loader():
    """yaml's SafeLoader, except that a key given twice in one mapping is a one-line error
    (plain YAML keeps the last one silently)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def mapping(loader, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise ConfigError(f"line {key_node.start_mark.line + 1}: a key must be a name, "
                                  f"got {type(key).__name__}")
            if key in seen:
                raise ConfigError(f"key '{key}' is given twice (lines {seen[key]} and "
                                  f"{key_node.start_mark.line + 1})")
            seen[key] = key_node.start_mark.line + 1
        return loader.construct_mapping(node, deep=deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return Loader


def build(overrides: dict[str, Any]) -> RunConfig:
    """RunConfig from flat dotted overrides (already ordered by precedence)."""
    grouped: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for key, value in _env_options(overrides).items():
        _check_key(key)
        v = reward_specs(value) if key == "algo.rewards" else _coerce(key, value)
        if "." in key:
            sec, name = key.split(".", 1)
            grouped.setdefault(sec, {})[name] = v
        else:
            top[key] = v
    base = RunConfig()
    kwargs = {sec: replace(getattr(base, sec), **vals) for sec, vals in grouped.items()}
    cfg = replace(base, **kwargs, **top)
    _validate(cfg)
    return cfg


def load(
    config_file: str | None = None,
    sets: list[str] | None = None,
    method: str | None = None,
    presets: dict[str, Any] | None = None,
    **flags: Any,
) -> RunConfig:
    """The one loader every command uses. `flags` are explicit CLI options (None = not given);
    `presets` (a benchmark's settings, dotted keys) rank above the recipe, below the YAML file."""
    from .methods import METHODS

    file_values = read_yaml(config_file) if config_file else {}
    set_values = parse_sets(sets)
    chosen = method or set_values.get("method") or file_values.get("method") or RunConfig.method
    recipe = METHODS.get(str(chosen))  # raises a one-line RegistryError for unknown names
    merged: dict[str, Any] = {}
    merged.update(recipe.defaults)
    for key in presets or {}:
        _check_key(key)
    merged.update(presets or {})
    merged.update(file_values)
    merged.update(set_values)
    merged["method"] = chosen
    for key, value in flags.items():
        if value is not None:
            merged[key] = value
    cfg = build(_user_env_fields(merged))
    check_model(cfg)
    return cfg


def check_model(cfg: RunConfig) -> None:
    """`model.name` is 'tiny', a local model folder or a hub id; a local folder given as a
    model or critic is a model, not a run folder. (Plugin names are checked where things are
    built: `train.preflight.check_names`.)"""
    m = cfg.model.name
    if m != "tiny" and not Path(m).expanduser().is_dir():
        hub_like = m.count("/") == 1 and not m.startswith((".", "/", "~"))
        if Path(m).expanduser().exists() or not hub_like:
            raise ConfigError(f"model not found: '{m}' is neither 'tiny', a local folder, nor a hub id")
    for key, path in (("model.name", m), ("model.critic_path", cfg.model.critic_path)):
        check_model_folder(key, path)


def check_model_folder(key: str, path: str) -> None:
    """A local folder given as a model must be one (a Hugging Face folder with config.json)."""
    p = Path(path).expanduser()
    if not path or path == "tiny" or not p.is_dir():
        return
    if (p / "checkpoints").is_dir() or (p / "metrics.jsonl").is_file():
        steps = sorted((p / "checkpoints").glob("step-*"))
        raise ConfigError(f"{key}: {path} is a run folder, not a model; give one of its "
                          f"checkpoints, e.g. {steps[-1] if steps else p / 'checkpoints' / 'step-N'}")
    if not (p / "config.json").is_file() and not (p / "adapter_config.json").is_file():
        raise ConfigError(f"{key}: {path} is a folder but not a model (no Hugging Face config.json)")


def describe() -> list[tuple[str, str, str]]:
    """(key, default, help) for every config key, for the README and `--help`."""
    import inspect

    rows = []

    def walk(cls: type, prefix: str) -> None:
        src = inspect.getsource(cls).splitlines()
        docs: dict[str, str] = {}
        for i, line in enumerate(src):
            s = line.strip()
            if ":" in s and not s.startswith(("\"", "#", "@", "class", "def")) and i + 1 < len(src):
                nxt = src[i + 1].strip()
                if nxt.startswith('"""'):
                    docs[s.split(":")[0]] = nxt.strip('"')
        default = cls()
        for f in fields(cls):
            v = getattr(default, f.name)
            if dataclasses.is_dataclass(v):
                walk(type(v), f"{prefix}{f.name}.")
            else:
                key, text = f"{prefix}{f.name}", docs.get(f.name, "")
                if key in _CAPS:
                    text += f" At most {_CAPS[key]:,}."
                rows.append((key, repr(v), text))

    walk(RunConfig, "")
    return rows


# What `train --resume` may change (how long, how often to check and save, where metrics and
# rollouts go): none of them changes what the run computes. Any other key, and the options
# --method/--env/--seed/--config/--model/--benchmark/--engine, would make the resumed run a
# different run, so a resume refuses them (`resume_changes`).
RESUME_KEYS = ("train.steps", "train.eval_every", "train.save_every", "train.trace_every",
               "train.log", "rollout.workers", "rollout.ray_address")


def resume_changes(saved: RunConfig, resumed: RunConfig) -> dict[str, list]:
    """{key: [saved value, new value]} for the keys a resume changes; a key outside
    RESUME_KEYS is a one-line error naming it."""
    a, b = flatten(saved), flatten(resumed)
    changed = {k: [a[k], b[k]] for k in a if k != "out" and a[k] != b[k]}
    for key in changed:
        if key not in RESUME_KEYS:
            raise ConfigError(f"--set {key}={b[key]} would change the resumed run (it ran with "
                              f"{key}={a[key]}); a resume may change only "
                              f"{', '.join(RESUME_KEYS)}; start a new run with --out instead")
    return changed


def load_saved(run_dir: str | Path, sets: list[str] | None = None) -> RunConfig:
    """The config a run folder was started with (its config.json), plus `--set` overrides."""
    import json

    p = Path(run_dir) / "config.json"
    if not p.is_file():
        raise ConfigError(f"no run found at {run_dir} (missing config.json)")
    flat: dict[str, Any] = {}

    def walk(d: dict, prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict) and f"{prefix}{k}" != "env.options":
                walk(v, f"{prefix}{k}.")
            else:
                flat[f"{prefix}{k}"] = v

    try:
        saved = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p} is damaged ({type(e).__name__}); it cannot be resumed") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"{p} is damaged (not a JSON object); it cannot be resumed")
    walk(saved, "")
    flat.update(_user_env_fields(parse_sets(sets), flat.get("env.name")))
    return build(flat)
