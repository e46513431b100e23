"""The config's schema: frozen dataclasses, one per section, each field with its default and,
in the string literal after it, its help text (`describe()` reads it for `--help` and
docs/config.md); the flat dotted view of a config (`flatten`, `LEAF_TYPES`, `SECTIONS`).
Nothing here reads files or checks values: `loading` builds a `RunConfig`, `validation`
checks it."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, get_type_hints


@dataclass(frozen=True)
class ModelConfig:
    name: str = "tiny"
    """`tiny` (the built-in agent: shipped with the package for `search`, `math`, `rules`, `locate` and the `search-long` and `allocation-*` benchmarks, each for the world its benchmarks.yaml entry sets; built once and cached for other envs and worlds), a local Hugging Face folder, or a hub id."""
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
    """Seconds an env's `reset`, `step`, `snapshot` or `restore`, a reward function (`algo.rewards`) or a FOCUS allocator may take per call during a rollout or `agentrl check-env`; a slower one stops the run with one line naming the env or function, the task and the step (0: no timeout). docs/your-env.md."""
    max_observation_chars: int = 1_000_000
    """Most characters in one observation (`reset`'s first message or a step's observation); a longer one stops the run with one line naming the env, task and step. docs/your-env.md."""
    max_error_rate: float = 0.99
    """The largest share of one training step's episodes that may end in an env error (an exception raised in `step`: the episode fails with reward 0, counted as `env/exceptions`); a higher share stops the run before the update, with one line naming the env and the first error. The default stops a run whose env fails (nearly) every episode; 1: never stop. docs/your-env.md."""
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
    focus_tasks: str = "tasks_per_step"
    """Distinct tasks a tree (FOCUS) step grows trees on: `tasks_per_step`, or `match`: as many as one linear (GRPO) step of the base policy draws under the run's budget (it draws fresh tasks until the budget is spent), measured at step 0 as the budget is and kept on resume; roots (algo.focus_roots per task) and continuations share the rest of the budget. Other controllers ignore it."""
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
    """FOCUS: continuation allocator: focus (largest gain) | uniform | random | raw-residual (|v - cbar|) | entropy (the state whose next turn the policy sampled with the most surprise, TreeRL / ARPO's branching rule), or your own: FILE.py:NAME (its path recorded absolute), module:NAME or an installed `agentrl.allocators` entry point, a function `fn(candidates, ctx) -> node or None` with `ctx.algo`, `ctx.rng`, `ctx.trees` (docs/methods.md, "Your own allocator")."""
    focus_critic: str = "learned"
    """FOCUS: the node values V(s) the allocator and credit read (the critic ladder, docs/methods.md): learned (the trainer's critic, as in the paper: warm from the tiny build's fitted head where it has one, trained with RL) | cold (the same critic started cold: a fitted head in the model folder is left out) | pretrained (as learned, but a model folder without a head fitted on the base policy's Monte-Carlo returns on this env is a one-line error instead of a cold start) | oracle (the env's own success probability of the state, `env.oracle_value()`, for an env that can compute it, e.g. `allocation`: the critic ladder's top rung, docs/methods.md)."""
    focus_gain: str = "plugin"
    """FOCUS: gain of one more continuation: plugin (MSE drop at p = cbar) | bayes (posterior-variance drop)."""
    focus_baseline: str = "refined"
    """FOCUS: the values a path's advantages use: refined (V~, the paper's) | loo (V~ recomputed without the path's own leaf, so its outcome is not in its own baseline)."""
    focus_prior: str = "critic"
    """FOCUS: what a node's refined value shrinks its evidence toward (Eq. 1's V(s)): critic (the critic's value, the paper's) | tree (the mean reward of the task's tree this step, the same for every node: a critic-free prior, GRPO's group mean refined by the tree's own evidence at its branch points; the allocator still reads the critic)."""
    focus_evidence: str = "own"
    """FOCUS: a node's evidence n, cbar: own (its own samples: the path that created it and the continuations launched from it, as in the paper) | subtree (every completed leaf below it; ablation)."""
    focus_norm: str = "none"
    """FOCUS: normalisation of the segment advantages: tree (centred on the task tree's policy tokens and divided by the std of its paths' rewards; 0 in a tree whose paths all got the same reward, as GRPO's group) | contrast (the raw residuals, but 0 in a tree whose paths all got the same reward: only GRPO's zero for a group without outcome contrast) | none (raw TD residuals of refined values, as in the paper)."""
    focus_max_inflight: int = 2
    """FOCUS: most continuations launched from one node running at once."""
    focus_min_depth: int = 0
    """FOCUS: continuations launch only from states at least this many segments below the root (0: from any state, as in the paper). `agentrl diagnose tree-info` measures at which depths a run's states say something about their outcome beyond the task."""
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
    """Linear warm-up from 0: step s <= warmup_steps trains at lr x s / warmup_steps (0: none). Must be < train.steps (a warm-up as long as the run is a one-line error)."""
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
    on_step_timeout_s: float = 600.0
    """The Python API's step callback (`on_step`) must return within this many seconds, else the run stops with one line naming it (0: no limit). May change on --resume."""
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
ENV_FIELDS = tuple(f.name for f in fields(EnvConfig))

# the env section's keys the rollout reads at the env boundary (envs/guard.py), never an
# option of the env's factory
ENV_BOUNDARY_KEYS = ("step_timeout_s", "max_observation_chars", "max_error_rate", "deterministic")

# Upper bounds on sizes that can only be mistakes (`--set rollout.group_size=1e9` would fail
# much later with MemoryError): part of each field's documentation (`describe()`, the config
# reference, lists each with its field), enforced by `validation`.
CAPS = {
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
                if key in CAPS:
                    text += f" At most {CAPS[key]:,}."
                rows.append((key, repr(v), text))

    walk(RunConfig, "")
    return rows
