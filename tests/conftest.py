"""Shared fixtures: an isolated model cache and a micro tiny model (no warm-up) for fast tests."""
from __future__ import annotations

import os

import pytest
from agentrl_cli.app.train import train as checked_train

# The suite is a CPU suite, also on a machine with a GPU (where model.device=auto would pick
# it): CUDA is hidden unless AGENTRL_TEST_CUDA=1, which runs the `gpu`-marked tests on the GPU
# (README: Tests). Set before anything imports torch.
if os.environ.get("AGENTRL_TEST_CUDA") != "1":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# Fast settings: an untrained tiny model (random weights), short turns, few tasks.
MICRO = [
    "model.tiny_warmup_steps=0",
    "env.max_turns=3",
    "rollout.max_new_tokens=8",
    "rollout.tasks_per_step=2",
    "rollout.group_size=2",
    "train.eval_tasks=3",
    "train.eval_samples=1",
    "train.critic_warmup=0",    # ppo's recipe warms its critic for 10 steps; tests run 1-3
]


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    """The micro model's matmuls are tiny: one intra-op thread is as fast as two and immune to
    OpenMP oversubscription stalls on a busy 2-core machine (measured 9 s vs 96 s)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session", autouse=True)
def _cache(tmp_path_factory):
    os.environ["AGENTRL_CACHE"] = str(tmp_path_factory.mktemp("agentrl-cache"))
    yield


@pytest.fixture(scope="session")
def micro_policy(_cache):
    """(model, tokenizer, fmt, spec) of the micro tiny model on the search env."""
    from agentrl_cli import config
    from agentrl_cli.context import make_spec
    from agentrl_cli.app.tiny_build import load_policy

    cfg = config.load(sets=MICRO)
    model, tok, fmt, _ = load_policy(cfg, log=lambda s: None)
    return model, tok, fmt, make_spec(cfg)


@pytest.fixture(scope="session")
def model_dir(_cache):
    """The micro tiny model's folder (the search env's, no warm-up): a policy for any env, as
    its byte-level tokenizer encodes any text."""
    from agentrl_cli import config
    from agentrl_cli.app.tiny_build import ensure_model

    return ensure_model(config.load(sets=MICRO), log=lambda s: None)


def random_value_head(model, seed: int = 0):
    """A seeded critic head for FOCUS tests: values near 0.5 (distinct per state), away from the
    0/1 outcomes of the untrained micro model, so its trees always branch (std 0.3 clamped some
    values to 0 = cbar: no gain, no branching)."""
    import torch

    from agentrl_cli.models.critic import ValueHead

    torch.manual_seed(seed)
    head = ValueHead(model.config.hidden_size)
    torch.nn.init.normal_(head.weight, std=0.02)
    torch.nn.init.constant_(head.bias, 0.5)
    return head


def random_batch(lengths, vocab, seed=0):
    """A batch of random episodes of the given lengths (policy tokens after the first 6, about
    70% of them; turns of 16 tokens; groups of 2), for forward/update comparisons."""
    import torch

    from agentrl_cli.train.batch import Batch

    g = torch.Generator().manual_seed(seed)
    B, L = len(lengths), max(lengths)
    ids = torch.zeros(B, L, dtype=torch.long)
    attn = torch.zeros(B, L, dtype=torch.long)
    resp = torch.zeros(B, L)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(5, vocab, (n,), generator=g)
        attn[i, :n] = 1
        resp[i, min(n, 6):n] = (torch.rand(max(n - 6, 0), generator=g) < 0.7).float()
    turn = torch.where(resp > 0, torch.arange(L).expand(B, L) // 16, torch.full((B, L), -1))
    return Batch(input_ids=ids, attention_mask=attn, response_mask=resp,
                 engine_logprobs=torch.zeros(B, L), turn_index=turn, segment_index=turn.clone(),
                 rewards=torch.rand(B, generator=g), group_index=torch.arange(B) // 2)


def train_until_interrupted(monkeypatch, cfg, out, step: int = 2) -> None:
    """Train `cfg` into `out` and stop it right after its checkpoint of `step` is saved (as an
    interruption there would), for exact-resume tests."""
    import pytest

    from agentrl_cli.train import checkpoint, loop

    real_save = checkpoint.save

    def save_then_stop(out_, step_, *a, **k):
        path = real_save(out_, step_, *a, **k)
        if step_ == step:
            raise KeyboardInterrupt
        return path

    monkeypatch.setattr(checkpoint, "save", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        checked_train(cfg, out, log=lambda s: None)
    monkeypatch.setattr(checkpoint, "save", real_save)


def complete_tree(tree: dict) -> dict:
    """A hand-written trace tree with every node field the trace schema requires: `parent`
    (from the node's own field, else from `paths`: consecutive ids), `depth` and `children`."""
    nodes = {nd["id"]: nd for nd in tree["nodes"]}
    for ids in tree.get("paths", {}).values():
        for a, b in zip(ids, ids[1:]):
            nodes[b].setdefault("parent", a)
    for nd in tree["nodes"]:
        nd.setdefault("parent", -1)
        nd["children"] = [c["id"] for c in tree["nodes"] if c.get("parent") == nd["id"]]
    for nd in tree["nodes"]:                  # parents come before their children
        nd.setdefault("depth", 0 if nd["parent"] < 0 else nodes[nd["parent"]]["depth"] + 1)
    return tree


def set_args(extra=()) -> list[str]:
    """`--set` options of the micro model's settings (MICRO) and `extra`, for a CLI call."""
    return [arg for s in [*MICRO, *extra] for arg in ("--set", s)]
