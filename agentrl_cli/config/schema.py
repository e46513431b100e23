"""The config's schema: frozen dataclasses, one per section, each field with its default and,
in the string literal after it, its help text: a sentence or two (`describe()` reads it for
docs/config.md, where a longer explanation goes); the flat dotted view of a config (`flatten`, `LEAF_TYPES`, `SECTIONS`).
Nothing here reads files or checks values: `loading` builds a `RunConfig`, `validation`
checks it."""
from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from dataclasses import dataclass, field, fields
from typing import Any, get_type_hints


@dataclass(frozen=True)
class ModelConfig:
    name: str = "tiny"
    """`tiny` (the built-in agent), a local Hugging Face folder, or a hub id. Details:
    docs/config.md."""
    dtype: str = "float32"
    """float32 | bfloat16 | float16."""
    attention: str = "sdpa"
    """Attention passed to transformers: eager | sdpa | flex_attention | flash_attention_2 |
    sink_sdpa (sink-aware, CPU-trainable) | sink_flex (sink-aware FlexAttention, CUDA)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward (less memory, about 1/3 more
    compute)."""
    critic: str = "head"
    """Critic form when the method needs one: head (value head on the policy backbone) | detached
    (its loss kept out of the backbone) | separate (its own model). Details: docs/config.md."""
    critic_path: str = ""
    """`model.critic=separate`: the model folder or hub id the critic's model starts from (empty: a
    copy of the policy); it must share the policy's tokenizer. Details: docs/config.md."""
    device: str = "auto"
    """auto | cpu | cuda."""
    tiny_warmup_steps: int = 4800
    """Tiny model: maximum supervised warm-up steps on imperfect expert demonstrations."""
    tiny_target_success: float = 0.3
    """Tiny model: the dev success at which the warm-up stops (RL needs room above); otherwise the
    build keeps its best checked checkpoint. Details: docs/config.md."""
    tiny_error_rate: float = 0.15
    """Tiny model: how often the warm-up's demonstrator opens a wrong search result and follows it
    (per hop, so imitation succeeds about (1 - rate)^hops of the time)."""
    chat_template: str = ""
    """A Jinja file replacing the tokenizer's chat template (which must render the `tool` role and
    end an assistant message with a stop token: docs/your-model.md). Empty: the model folder's
    own."""
    tool_format: str = "text"
    """How the model calls tools: text (the built-in envs' `tool(argument)` syntax) | hermes
    (Qwen2.5/Qwen3/Hermes) | llama3-json (Llama 3.1/3.2). Details: docs/config.md."""
    lora_rank: int = 0
    """LoRA adapter rank (0: off, the whole model trains); > 0: only the adapters train (`pip
    install peft`). Details: docs/config.md."""
    lora_alpha: float = 16.0
    """LoRA scaling numerator: the adapters' update is scaled by lora_alpha / lora_rank."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA adapters' input during the update, in [0, 1)."""
    lora_targets: str = ""
    """Comma list of module names that get adapters (e.g. `q_proj,v_proj`). Empty: every attention
    and MLP projection the model has. Details: docs/config.md."""


@dataclass(frozen=True)
class EnvConfig:
    name: str = "search"
    """Environment name (see `agentrl rollout --help`)."""
    seed: int = 0
    """Seed of the env's world and its train/eval splits (independent of the run seed)."""
    min_hops: int = 2
    """Fewest hops in a task (search: relations; locate: functions on the call chain; rules: rules
    needed; math: operations)."""
    max_hops: int = 3
    """Most hops in a task (rules up to 4; search, locate and math up to 5)."""
    max_turns: int = 12
    """Assistant turns before an episode is truncated."""
    n_entities: int = 100
    """search: entities in the generated world (more = harder to memorise, more tasks); locate:
    files per repository."""
    relations: str = "full"
    """search: `full` (several facts per document; the question's relation picks one) or
    `single`."""
    repos: str = "per-task"
    """locate: `per-task` (every task its own repository) or `shared` (all tasks in one repository,
    as many LocBench issues share one; held-out tasks start from other functions)."""
    n_train: int = 595
    """Training tasks."""
    n_eval: int = 60
    """Held-out tasks (disjoint from training: search by start entity and relation path, locate by
    repository or, with shared repositories, by entry function, rules/math by case/problem)."""
    call_cost: float = 0.0
    """search, locate, rules, math: a correct answer earns 1 less this per message before it (at
    least 0), a wrong one 0. 0: only correctness counts. Details: docs/config.md."""
    step_timeout_s: float = 60.0
    """Seconds an env call, a reward function or a FOCUS allocator may take during a rollout or
    `agentrl check-env` (0: no timeout). Details: docs/config.md."""
    max_observation_chars: int = 1_000_000
    """Most characters in one observation (`reset`'s first message or a step's observation); a
    longer one stops the run with one line naming the env, task and step. docs/your-env.md."""
    max_error_rate: float = 0.99
    """The largest share of a step's episodes that may end in an env error before the run stops (1:
    never stop). Details: docs/config.md."""
    deterministic: bool = True
    """A user env gives the same observations and rewards for the same seed and actions (checked
    before training). false: trained with a warning. Details: docs/config.md."""
    options: dict = field(default_factory=dict)
    """A user env's options, passed to its factory as keywords (`--set env.NAME=VALUE`); only the
    keys given are passed. Details: docs/config.md."""


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
    """Generated tokens per step, extra continuations included, averaged over the run (0: no cap);
    the same for every controller. Details: docs/config.md."""
    budget_match: bool = False
    """With budget_tokens 0: cap each step at what a linear (GRPO) step of the base policy
    generates, measured at step 0 (the focus recipe sets it). Details: docs/config.md."""
    focus_tasks: str = "tasks_per_step"
    """Distinct tasks a tree (FOCUS) step grows trees on: `tasks_per_step`, or `match` (as many as a
    linear step draws under the budget). Other controllers ignore it. Details: docs/config.md."""
    workers: int = 0
    """Ray rollout workers, each with its own engine and envs (0: generate in the trainer process).
    May change on --resume."""
    ray_address: str = ""
    """Ray cluster to join with rollout.workers > 0 (empty: start a local Ray). May change on
    --resume."""
    worker_gpus: float = 0.0
    """GPUs per Ray rollout worker (0: CPU workers)."""
    vllm_gpu_memory: float = 0.4
    """vllm engine: fraction of the GPU's memory it may take (weights + KV cache)."""
    vllm_sleep: bool = True
    """vllm engine: sleep (weights to CPU, KV cache freed) during each update, wake to sync
    weights."""


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
    """Loss aggregation: token-mean | seq-mean | token-sum-norm (Dr. GRPO: masked sum / (episodes x
    agg_norm))."""
    agg_norm: int = 0
    """token-sum-norm: the constant divisor per episode (0: the run's per-episode generation cap,
    min(env.max_turns x rollout.max_new_tokens, rollout.max_tokens))."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the frozen reference model (a loss term, verl's use_kl_loss; its
    estimator: algo.kl_estimator)."""
    kl_estimator: str = "k3"
    """Per-token estimator of KL(policy || reference) in the algo.kl_coef penalty: k1 (the log
    ratio) | k2 (its square / 2) | k3 (verl's low_var_kl). Details: docs/config.md."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus in the policy loss (0: no bonus; policy/entropy is logged either
    way). Details: docs/config.md."""
    rewards: list = field(default_factory=list)
    """Reward functions of the episode (`file.py:fn`, `module:fn` or `{fn, weight, name}`), added to
    (or replacing) the env's outcome reward (docs/rewards.md). Details: docs/config.md."""
    reward_mode: str = "add"
    """How algo.rewards combine with the env's reward: add (env reward + sum of weight x fn) |
    replace (sum of weight x fn only; success stays the env's verdict)."""
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
    """DAPO: drop groups whose rewards are all equal and refill with more tasks (linear
    controller)."""
    dynamic_rounds: int = 3
    """DAPO dynamic sampling: most refill rounds per step (each samples as many new tasks as groups
    are missing)."""
    overlong_shaping: bool = False
    """DAPO: add a length penalty to the reward (linear over the last `overlong_cache` tokens before
    rollout.max_tokens, -1 if cut by it)."""
    overlong_cache: int = 128
    """DAPO overlong shaping: width L_cache of the soft-penalty window, in episode tokens."""
    whiten: bool = False
    """Normalise advantages over the batch's policy tokens (gae, vine and mpo estimators)."""
    vine_k: int = 3
    """VinePPO: continuations per segment-boundary state (the paper uses 9; 3 keeps CPU runs
    short)."""
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
    """TRACE: how the gold answer is teacher-forced after each boundary ({answer} = the gold
    text)."""
    focus_roots: int = 2
    """FOCUS: root episodes per task before any branching (capped at group_size without a token
    budget)."""
    focus_allocator: str = "focus"
    """FOCUS: continuation allocator: focus (largest gain) | uniform | random | raw-residual |
    entropy, or your own (FILE.py:NAME, module:NAME, an entry point). Details: docs/config.md."""
    focus_critic: str = "learned"
    """FOCUS: the node values V(s) the allocator and credit read: learned (the trainer's critic) |
    cold | pretrained | oracle (the env's own value). Details: docs/config.md."""
    focus_gain: str = "plugin"
    """FOCUS: gain of one more continuation: plugin (MSE drop at p = cbar) | bayes
    (posterior-variance drop)."""
    focus_baseline: str = "refined"
    """FOCUS: the values a path's advantages use: refined (V~, the paper's) | loo (V~ recomputed
    without the path's own leaf, so its outcome is not in its own baseline)."""
    focus_prior: str = "critic"
    """FOCUS: what a node's refined value shrinks toward: critic (the critic's value, the paper's) |
    tree (the mean reward of the task's tree this step). Details: docs/config.md."""
    focus_evidence: str = "own"
    """FOCUS: a node's evidence n, cbar: own (its own samples: the path that created it and the
    continuations launched from it, as in the paper) | subtree (every completed leaf below it;
    ablation)."""
    focus_norm: str = "none"
    """FOCUS: normalisation of the segment advantages: tree (centred, divided by the tree's reward
    std) | contrast | none (raw TD residuals, the paper's). Details: docs/config.md."""
    focus_max_inflight: int = 2
    """FOCUS: most continuations launched from one node running at once."""
    focus_min_depth: int = 0
    """FOCUS: continuations launch only from states at least this many segments below the root (0:
    from any state, as in the paper). Details: docs/config.md."""
    focus_lam: float = 0.0
    """FOCUS: TD(lambda) lambda of the segment advantages on refined values (0: one-step TD
    residual)."""
    focus_return: str = "path"
    """FOCUS: what a segment's advantage measures its state against: path (the path's TD(lambda)
    return, the paper's) | subtree (the mean outcome below the state). Details: docs/config.md."""
    focus_segment_weight: str = "one"
    """FOCUS: a trained segment's weight in the policy loss: one (every segment, the paper's) |
    visit (the on-policy share of its start state). Details: docs/config.md."""
    focus_critic_backup: str = "refined"
    """FOCUS: what the critic's node targets back up: refined (each child's V~, the paper's) |
    evidence (only the tree's outcomes, kappa = 0). Details: docs/config.md."""
    focus_critic_targets: str = "nodes"
    """FOCUS: where the critic is regressed: nodes (at each tree node's boundary, the paper's) |
    tokens (also every policy token of a segment). Details: docs/config.md."""


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 100
    """Training steps (one rollout batch + update each). May change on --resume."""
    lr: float = 2e-4
    """Adam learning rate."""
    lr_schedule: str = "constant"
    """Learning-rate schedule after the warm-up, for the policy and the critic alike: constant |
    linear | cosine. Logged per step as lr. Details: docs/config.md."""
    warmup_steps: int = 0
    """Linear warm-up from 0: step s <= warmup_steps trains at lr x s / warmup_steps (0: none). Must
    be < train.steps (a warm-up as long as the run is a one-line error)."""
    critic_lr: float = 0.0
    """Learning rate of the critic's own parameters (value head or separate model); 0 = train.lr.
    Details: docs/config.md."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient-norm clip (0: off), applied to the policy's and the critic's gradients apart. Logged
    before clipping as grad_norm and critic/grad_norm. Details: docs/config.md."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    minibatches: int = 1
    """Optimiser steps per pass."""
    critic_warmup: int = 0
    """Methods with a critic: the first N steps update only the value head (the policy, backbone
    included, stays the base model); they count toward train.steps and spend rollout tokens like any
    step."""
    max_tokens_per_microbatch: int = 4096
    """Token budget of one forward/backward micro-batch (gradient accumulation above it); on a GPU
    raise it until memory binds. Details: docs/config.md."""
    logprob_chunk: int = 512
    """Tokens per log-prob chunk: logits exist for one chunk at a time and are recomputed in
    backward (0: whole sequence at once)."""
    old_logprobs: str = "auto"
    """Where a single-pass update takes its old log-probs: engine (the rollout engine's, within
    train.logprob_tolerance) | score (a scoring forward) | auto. Details: docs/config.md."""
    logprob_tolerance: float = 1e-3
    """train.old_logprobs=engine: the largest mean |engine - trainer| log-prob gap over a
    micro-batch's policy tokens at which the engine's log-probs are the old ones."""
    pack: bool = False
    """Packed forward passes: a micro-batch's episodes run as one row without padding; false:
    right-padded rows of similar length. Details: docs/config.md."""
    tree_pack: bool = True
    """Tree-packed forward passes: episodes that share a prefix (a FOCUS tree's paths, a group's
    prompt) run as one row, each shared token forwarded once. Details: docs/config.md."""
    eval_every: int = 10
    """Evaluate on held-out tasks every N steps (0: only at the start and the end). May change on
    --resume."""
    eval_tasks: int = 60
    """Held-out tasks per evaluation."""
    eval_samples: int = 4
    """Samples per held-out task in training-time evaluations."""
    save_every: int = 10
    """Checkpoint every N steps (0: only at the end). May change on --resume."""
    trace_every: int = 10
    """Keep a sample of the step's episodes and trees every N steps, at step 1 and at the last, for
    `agentrl view` (0: off). Details: docs/config.md."""
    on_step_timeout_s: float = 600.0
    """The Python API's step callback (`on_step`) must return within this many seconds, else the
    run stops with one line naming it (0: no limit). May change on --resume."""
    log: str = ""
    """Metric sinks besides metrics.jsonl, comma-separated: tensorboard (<run>/tensorboard/, needs
    the `tensorboard` extra) | wandb (mode from WANDB_MODE, e.g. offline); empty: none. May change
    on --resume."""


@dataclass(frozen=True)
class ContextConfig:
    operator: str = "none"
    """Context operator: none | compaction (the policy summarises at the threshold; the summary
    replaces the history) | workspace (put/get/scan/delete tools; the context is reset at the
    threshold)."""
    threshold_tokens: int = 384
    """Visible context length (prompt + current window + the next observation) that triggers a
    compaction or a workspace reset."""
    style: str = "free"
    """compaction: free (one free-form request) | structured (four sections: Goal, Facts found, Open
    leads, Next step)."""


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


def field_docs(cls: type) -> dict[str, str]:
    """A dataclass's field docs: the string literal after each field, its lines joined."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def describe() -> list[tuple[str, str, str]]:
    """(key, default, help) for every config key, for the config reference (docs/config.md)."""
    rows = []

    def walk(cls: type, prefix: str) -> None:
        docs = field_docs(cls)
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
