"""The tiny built-in agent: a locally trained tokenizer, a small Qwen3-architecture model, and a
supervised warm-up on *imperfect* expert demonstrations of the built-in env.

Everything is built from the recipe below and the seed (no hub access), saved as an ordinary
Hugging Face folder (so `--model tiny` and `--model /path` load through the same code), and
cached under `$AGENTRL_CACHE` (default `~/.cache/agentrl`) keyed by a hash of the recipe.

The warm-up runs a cosine learning-rate schedule over `max_steps` (annealing gave steadier
final models than a constant rate) and checks held-out success (sampled,
temperature 1) from `eval_start`; it stops early if a check reaches `target_success`. The
demonstrator opens a distractor document with probability `error_rate` and follows it, so even
perfect imitation succeeds only about (1 - error_rate)^hops of the time: RL has room above.
Recipe v8: two layers (as good per step as four, 1.9x cheaper), error rate 0.15,
cosine schedule, built on two threads.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

RECIPE_VERSION = 8
LATER_FIELDS = {"repos": "per-task"}  # added after v8: (field, default)
BUILD_THREADS = 2
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinyRecipe:
    env: str = "search"
    env_seed: int = 0
    min_hops: int = 2
    max_hops: int = 3
    max_turns: int = 12
    n_entities: int = 100
    relations: str = "full"
    repos: str = "per-task"
    n_train: int = 595
    n_eval: int = 60
    vocab_size: int = 1024
    hidden_size: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 384
    max_positions: int = 1024
    demos: int = 3000
    error_rate: float = 0.15
    obs_weight: float = 1.0
    batch_size: int = 16
    lr: float = 3e-3
    max_steps: int = 1200
    eval_start: int = 1100
    eval_every: int = 100
    eval_tasks: int = 48
    target_success: float = 0.5
    demo_worlds: int = 1
    lookup_share: float = 0.0
    critic_episodes: int = 256
    lr_schedule: str = "cosine"
    seed: int = 0

    def key(self) -> str:
        # fields added after a recipe version leave the key alone at their defaults, so a new
        # option does not invalidate every cached build
        fields = {k: v for k, v in asdict(self).items() if LATER_FIELDS.get(k, object()) != v}
        blob = json.dumps({"v": RECIPE_VERSION, **fields}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def cache_root() -> Path:
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl"))


def tiny_path(recipe: TinyRecipe) -> Path:
    return cache_root() / f"tiny-{recipe.env}-{recipe.key()}"


BUILD_LOCK = ".building"      # held (flock) by a live builder inside its temp folder
_BUILD_TMP = re.compile(r"^tiny-[^.]+\.[a-z0-9_]{8}$")


def clean_stale_builds(root: Path | None = None, log: Callable[[str], None] = print,
                       max_age_s: float = 86_400.0) -> list[Path]:
    """Remove the temp folders (`tiny-*.xxxxxxxx`) of builds whose builder is gone: its lock is
    free (the kernel releases it when the process dies, however it dies), or, for a folder
    without a lock (older builds), it is older than `max_age_s`. A live build is left alone."""
    import fcntl

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


def ensure_tiny(recipe: TinyRecipe, log: Callable[[str], None] = print) -> Path:
    """Return the folder of the tiny model, building it (once) if absent. The build runs in a
    temp folder that holds a lock while it lives and is renamed into place when done; builds
    killed half-way are removed here (`clean_stale_builds`)."""
    import fcntl

    path = tiny_path(recipe)
    clean_stale_builds(path.parent, log)
    if (path / "recipe.json").is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".", dir=path.parent))
    fd = os.open(tmp / BUILD_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        build_tiny(recipe, tmp, log)
        (tmp / BUILD_LOCK).unlink()       # not part of the model; still held through fd
        try:
            os.replace(tmp, path)  # atomic publish; a concurrent builder may have won
        except OSError:
            if not (path / "recipe.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(fd)
    return path


# ------------------------------------------------------------------------------ building
def _spec(recipe: TinyRecipe, seed: int | None = None):
    from ..envs import ENVS

    return ENVS.get(recipe.env)(seed=recipe.env_seed if seed is None else seed, min_hops=recipe.min_hops,
                                max_hops=recipe.max_hops, max_turns=recipe.max_turns,
                                n_entities=recipe.n_entities, n_train=recipe.n_train,
                                n_eval=recipe.n_eval, relations=recipe.relations,
                                repos=recipe.repos)


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE, digits split singly, with a Qwen-style chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    # Spaces are isolated tokens, so a word is the same token after a space ("d12 Mira Quon"),
    # after "(" ("search(Mira Quon)") or at a line start: copying a name from an observation
    # into an action is then a plain token copy, which a tiny model learns far faster.
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    core.train_from_iterator(texts, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", bos_token=None)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _transcript_weights(batch, attn: torch.Tensor, obs_weight: float) -> torch.Tensor:
    """[B, L]: 1 on policy tokens, `obs_weight` on observation tokens, 0 on prompt / padding."""
    w = torch.zeros(attn.shape)
    for i, e in enumerate(batch):
        first = e.turns[0].start if e.turns else len(e.token_ids)
        row = torch.tensor(e.response_mask, dtype=torch.float)
        row[first:] = torch.where(row[first:] > 0, 1.0, obs_weight)
        w[i, :len(row)] = row
    return w


def make_model(recipe: TinyRecipe, vocab_size: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=vocab_size, hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate, num_hidden_layers=recipe.layers,
        num_attention_heads=recipe.heads, num_key_value_heads=recipe.kv_heads,
        head_dim=recipe.hidden_size // recipe.heads, max_position_embeddings=recipe.max_positions,
        tie_word_embeddings=True, rope_theta=10000.0, pad_token_id=0, eos_token_id=2,
        bos_token_id=None,
    )
    torch.manual_seed(recipe.seed)
    return Qwen3ForCausalLM(cfg)


VALUE_HEAD = "value_head.safetensors"


@torch.no_grad()
def fit_value_head(model, engine, fmt, spec, tasks, n_episodes: int, max_tokens: int,
                   gen: torch.Generator, path: Path) -> dict:
    """A warm critic for the methods that need one (FOCUS above all: its allocator and its
    TD advantages are only as good as V). The warmed-up model samples `n_episodes` on training
    tasks (temperature 1); every turn-start state gets its episode's outcome as target (a
    Monte-Carlo value of the base policy); a ridge regression of those targets on the state's
    last hidden state (the same features the trainer's value head reads) gives the head's
    weight and bias, saved as `path` (safetensors, the `torch.nn.Linear` state dict). The
    trainer starts its value head from it (`train.loop.build_learner`)."""
    from safetensors.torch import save_file

    from ..engines.hf import SamplingParams
    from ..rollout.runner import run_episodes
    from .sequences import hidden_states, pad_episodes

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
    worlds = [(spec, spec.tasks("train"))]
    k = 0
    while len(worlds) < recipe.demo_worlds and k < 4 * recipe.demo_worlds:
        k += 1
        try:
            other = _spec(recipe, seed=recipe.env_seed + 7919 * k)
            worlds.append((other, other.tasks("train")))
        except ValueError:        # a world with too few questions of the asked size: skip it
            continue
    return worlds


def _decay(recipe: TinyRecipe, step: int) -> float:
    if recipe.lr_schedule == "constant":
        return 1.0
    if recipe.lr_schedule == "cosine":   # to 10% of the peak at max_steps
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, step / recipe.max_steps)))
    raise ValueError(f"unknown lr_schedule '{recipe.lr_schedule}' (constant, cosine)")


def build_tiny(recipe: TinyRecipe, out: Path, log: Callable[[str], None] = print) -> dict:
    """Build on `BUILD_THREADS` torch threads: float reductions depend on the thread count, so
    fixing it makes the same recipe give the same model on any machine (a laptop defaults to
    more threads than a 2-core CI box). Two: 1.8x faster than one on an idle 2-core machine
    (`benchmarks/bench_warmup_step.py`); on a busy one the two OpenMP threads can stall each
    other, so `benchmarks/warmup_variants.py` runs its side-by-side builds on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)
    try:
        return _build_tiny(recipe, out, log)
    finally:
        torch.set_num_threads(threads)


def _build_tiny(recipe: TinyRecipe, out: Path, log: Callable[[str], None] = print) -> dict:
    from ..engines.hf import HFEngine, SamplingParams
    from ..rollout.runner import run_episodes, run_expert
    from .chat import ChatFormat
    from .sequences import pad_episodes, token_logprobs

    t0 = time.time()
    spec = _spec(recipe)
    rng = random.Random(recipe.seed)
    train_tasks = spec.tasks("train")
    eval_tasks = spec.tasks("eval", recipe.eval_tasks)
    worlds = _demo_worlds(recipe, spec)

    # 1. tokenizer, trained on expert transcripts (perfect and imperfect) of training tasks
    texts: list[str] = []
    probe_env = spec.make()
    texts.append(probe_env.system_prompt)
    per_world = max(1, len(train_tasks) // len(worlds))
    for i, (w, task) in enumerate((w, t) for w, ts in worlds for t in ts[:per_world]):
        env = w.make()
        texts.append(env.reset(task))
        for _ in range(recipe.max_turns):
            action = w.expert(env, rng, recipe.error_rate if i % 2 else 0.0)
            res = env.step(action)
            texts.append(action)
            if res.observation:
                texts.append(res.observation)
            if res.terminated or res.truncated:
                break
    texts += ["user", "assistant", "tool", "system", "error"]
    tok = train_tokenizer(texts, recipe.vocab_size)
    fmt = ChatFormat.from_tokenizer(tok)
    log(f"tiny: tokenizer trained ({len(tok)} tokens) in {time.time() - t0:.1f}s")

    # 2. model
    model = make_model(recipe, len(tok))
    n_params = sum(p.numel() for p in model.parameters())
    log(f"tiny: Qwen3 model with {n_params / 1e6:.2f}M parameters")

    # 3. warm-up on imperfect demonstrations (policy tokens only carry loss)
    demos = []
    for k, (w, ts) in enumerate(worlds):
        n = recipe.demos // len(worlds) + (k < recipe.demos % len(worlds))
        looks = w.tasks("lookup") if recipe.lookup_share > 0 else []
        picks = [((looks[rng.randrange(len(looks))] if looks and rng.random() < recipe.lookup_share
                   else ts[rng.randrange(len(ts))]), 0) for _ in range(n)]
        demos += run_expert(fmt, w, picks, max_tokens=recipe.max_positions,
                            seed=recipe.seed + k, error_rate=recipe.error_rate)
    demo_success = sum(e.success for e in demos) / len(demos)
    demos.sort(key=lambda e: len(e.token_ids))
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0)
    engine = HFEngine(model, fmt.pad_id)
    params = SamplingParams(temperature=1.0, max_new_tokens=32)
    gen = torch.Generator().manual_seed(recipe.seed)
    history = []
    success = 0.0
    step = 0
    for step in range(1, recipe.max_steps + 1):
        lr = recipe.lr * min(1.0, step / 20) * _decay(recipe, step)
        for g in opt.param_groups:
            g["lr"] = lr
        # demos are sorted by length, so a batch of neighbours wastes little on padding
        start = rng.randrange(len(demos) - recipe.batch_size + 1)
        batch = demos[start:start + recipe.batch_size]
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
        if step == recipe.max_steps or step >= recipe.eval_start and step % recipe.eval_every == 0:
            model.eval()
            eps = run_episodes(engine, fmt, spec, [(t, 0) for t in eval_tasks for _ in range(2)],
                               params, max_tokens=recipe.max_positions, batch_size=96,
                               generator=gen)
            success = sum(e.success for e in eps) / len(eps)
            history.append({"step": step, "loss": float(loss.detach()), "success": success})
            log(f"tiny: warm-up step {step} loss {float(loss.detach()):.3f} held-out success {success:.2f}")
            if success >= recipe.target_success:
                break
    model.eval()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    critic = {}
    if recipe.critic_episodes > 0 and recipe.max_steps > 0:   # no warm-up, no warm critic
        critic = fit_value_head(model, engine, fmt, spec, train_tasks, recipe.critic_episodes,
                                recipe.max_positions, gen, out / VALUE_HEAD)
        log(f"tiny: value head fitted on {critic['states']} states of {recipe.critic_episodes} "
            f"own episodes (success {critic['success']:.2f}, MSE {critic['mse']:.3f} vs "
            f"{critic['mse_const']:.3f} for a constant)")
    info = {"recipe": asdict(recipe), "key": recipe.key(), "params": n_params,
            "warmup_steps": step, "base_success": success, "demo_success": demo_success,
            "history": history, "critic": critic, "build_seconds": time.time() - t0}
    (out / "recipe.json").write_text(json.dumps(info, indent=2))
    log(f"tiny: built in {time.time() - t0:.0f}s (demonstrator success {demo_success:.2f}, "
        f"held-out success {success:.2f})")
    return info
