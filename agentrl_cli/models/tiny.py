"""The tiny built-in agent's description: its recipe, tokenizer, architecture and cache folder.

A tiny model is a locally trained tokenizer and a small Qwen3-architecture model, warmed up on
*imperfect* expert demonstrations of a built-in env. Everything is built from the recipe below
and the seed (no hub access), saved as an ordinary Hugging Face folder (so `--model tiny` and
`--model /path` load through the same code), and cached under `$AGENTRL_CACHE` (default
`~/.cache/agentrl`) keyed by a hash of the recipe. The builds of every built-in family
(`search` and its long-horizon variant, `math`, `rules`, `locate`, the two `allocation`
settings) ship with the package (`shipped/`, found by the same key; the benchmarks.yaml entry
named like an env sets the world its build was made for): their
start is then the same on every machine, whatever its float kernels and thread count, and the
first command trains at once. Building it (corpus, supervised warm-up,
held-out check, critic fit) is training: `app/tiny_build.py`, which documents the schedule.
Recipe v9: two layers (as good per step as four, 1.9x cheaper), error rate 0.15,
cosine schedule over up to 4800 warm-up steps, built on two threads, stopped at the first
check (training questions the demonstrations leave out) that reaches 0.3 success, else the
best checked one (v8 kept step 1200, whose held-out success was 0.10 on one machine and 0.20 on
another: float rounding moves the warm-up's late jump).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch

from ..config import ENV_BOUNDARY_KEYS, EnvConfig

RECIPE_VERSION = 9
LATER_FIELDS = {"repos": "per-task"}  # added after v8, kept out of the key at its default
# built-in envs whose observations or actions changed after their builds were made: the
# format joins the key, so an old build (shipped or cached) is not loaded for the new world
# locate 2: numbered ls/grep results (open(1), answer(1)), open jumps to a hit;
# rules 2: a rule names its amounts, calc(bag1+heavy*2);
# rules 3: the expert itemises a bag fee bag by bag, calc(bag1+heavy+bag2).
# A change without a bump still shows: a build records its world (`tiny_build.world_fingerprint`)
# and a shipped one must match its env (tests/test_shipped_agent.py)
ENV_FORMATS = {"locate": 2, "rules": 3}
# the recipe's env section under the names its key and recipe.json give them
ENV_KEYS = {"name": "env", "seed": "env_seed"}
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VALUE_HEAD = "value_head.safetensors"   # a build's warm critic: the value head's state dict


@dataclass(frozen=True)
class TinyRecipe:
    env: EnvConfig = EnvConfig()   # the env the model is warmed up on (its world and sizes)
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
    max_steps: int = 4800
    eval_start: int = 800
    eval_every: int = 200
    eval_tasks: int = 48
    dev_tasks: int = 64          # training questions kept out of the demonstrations: the checks
    dev_samples: int = 3
    target_success: float = 0.3
    demo_worlds: int = 1
    lookup_share: float = 0.0
    critic_episodes: int = 256
    lr_schedule: str = "cosine"
    seed: int = 0

    def __post_init__(self):
        # the warm-up imitates the expert: a reward setting is not part of it, so every
        # env.call_cost gets the same build (whose value head learned the plain 0/1 reward)
        if self.env.call_cost:
            object.__setattr__(self, "env", replace(self.env, call_cost=0.0))

    def flat(self) -> dict:
        """One level of fields, the env's under `ENV_KEYS` names (`env`, `env_seed`, `min_hops`,
        ...): what the key hashes and `recipe.json` records."""
        # a user env's options (none for a built-in env) only when there are any; call_cost
        # never (a reward setting, always 0 here); nor the boundary checks of a run
        # (`env.step_timeout_s`, ...): they stop a broken env, they never change the world
        out = {ENV_KEYS.get(k, k): v for k, v in asdict(self.env).items()
               if not (k == "options" and not v) and k != "call_cost"
               and k not in ENV_BOUNDARY_KEYS}
        out.update((f.name, getattr(self, f.name)) for f in fields(self) if f.name != "env")
        return out

    @classmethod
    def from_flat(cls, values: dict) -> "TinyRecipe":
        """The recipe of `flat()` fields (a build's `recipe.json`, a benchmark's overrides);
        fields left out keep their defaults."""
        names = {ENV_KEYS.get(f.name, f.name): f.name for f in fields(EnvConfig)}   # flat -> env
        env = {names[k]: v for k, v in values.items() if k in names}
        rest = {k: v for k, v in values.items() if k not in names}   # `seed` is the recipe's
        return cls(env=EnvConfig(**env), **rest)

    def key(self) -> str:
        # fields added after a recipe version leave the key alone at their defaults, so a new
        # option does not invalidate every cached build
        flat = {k: v for k, v in self.flat().items() if LATER_FIELDS.get(k, object()) != v}
        if self.env.name in ENV_FORMATS:
            flat["env_format"] = ENV_FORMATS[self.env.name]
        blob = json.dumps({"v": RECIPE_VERSION, **flat}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def fitted_env_differences(folder: Path, env: EnvConfig) -> list[str] | None:
    """Where the env a build's value head was fitted on (its `recipe.json`) differs from `env`,
    as "field: built value vs this value" (empty: the same world and tasks); None when the
    folder records no recipe (not a tiny build: nothing to compare)."""
    try:
        built = json.loads((Path(folder) / "recipe.json").read_text())["recipe"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    ours = TinyRecipe(env=env).flat()
    env_keys = {ENV_KEYS.get(f.name, f.name) for f in fields(EnvConfig)}
    keys = sorted((set(built) | {k for k in ours if k in ("env", "options")}) & env_keys)
    return [f"{k}: {built.get(k)!r} vs {ours.get(k)!r}" for k in keys
            if built.get(k, LATER_FIELDS.get(k)) != ours.get(k, LATER_FIELDS.get(k))]


def cache_root() -> Path:
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl"))


SHIPPED = Path(__file__).parent / "shipped"   # builds that ship with the package, one per folder


def shipped_path(recipe: TinyRecipe) -> Path | None:
    """The build of `recipe` that ships with the package (its `recipe.json` holds the same key),
    or None: the recipe is then built once into the cache."""
    key = recipe.key()
    return next((folder for folder, info in shipped_builds() if info.get("key") == key), None)


# the recipe fields a config sets (`models.loading.tiny_recipe`) under their config keys
RECIPE_CONFIG_KEYS = {"max_steps": "model.tiny_warmup_steps",
                      "target_success": "model.tiny_target_success",
                      "error_rate": "model.tiny_error_rate"}


def shipped_builds() -> list[tuple[Path, dict]]:
    """(folder, its recipe.json) of every build that ships with the package."""
    out = []
    for rec in sorted(SHIPPED.glob("*/recipe.json")):
        try:
            out.append((rec.parent, json.loads(rec.read_text())))
        except (OSError, ValueError):
            continue
    return out


def nearest_shipped(recipe: TinyRecipe) -> tuple[Path, list[str]] | None:
    """The shipped build of the same env that the fewest `--set KEY=VALUE` reach from `recipe`
    (folder, those settings), or None: none of the env ships, or only builds that differ in
    what a config does not set."""
    env_keys = {ENV_KEYS.get(f.name, f.name): f"env.{f.name}" for f in fields(EnvConfig)}
    ours, best = recipe.flat(), None
    for folder, info in shipped_builds():
        built = info.get("recipe") or {}
        if built.get("env") != recipe.env.name:
            continue
        keys = sorted(set(built) | set(ours))
        diff = [k for k in keys if built.get(k, LATER_FIELDS.get(k)) != ours.get(k, LATER_FIELDS.get(k))]
        if any(k == "options" or (k not in env_keys and k not in RECIPE_CONFIG_KEYS) for k in diff):
            continue
        sets = [f"{env_keys.get(k) or RECIPE_CONFIG_KEYS[k]}={built[k]}" for k in diff]
        if best is None or len(sets) < len(best[1]):
            best = (folder, sets)
    return best


def cache_path(recipe: TinyRecipe) -> Path:
    """The cache folder a recipe's local build is published at (present once it is complete)."""
    # a user env's name is a spec such as `path/to/env.py:make`: one folder name, no separators
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", recipe.env.name).strip("._")[-40:] or "env"
    return cache_root() / f"tiny-{name}-{recipe.key()}"


def tiny_path(recipe: TinyRecipe) -> Path:
    """The folder `--model tiny` loads for `recipe`: the shipped build, else the cache's."""
    return shipped_path(recipe) or cache_path(recipe)


def is_built(path: Path) -> bool:
    """A finished build: `recipe.json` is written last, and the folder renamed into place after."""
    return (Path(path) / "recipe.json").is_file()


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE, digits split singly, with a Qwen-style chat template."""
    # deferred: transformers takes seconds to import
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


def make_model(recipe: TinyRecipe, vocab_size: int):
    # deferred: transformers takes seconds to import
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
