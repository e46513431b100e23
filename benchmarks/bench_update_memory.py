"""The update's peak memory: `app.preflight.update_bytes`'s estimate against the measured peak
resident memory of one process running the trainer's update, on random Qwen3-shaped models of
increasing size (vocabulary 151,936, as Qwen3's).

Each case runs in its own child process: imports, then the kernel's high-water mark is reset
(`/proc/self/clear_refs`, 5) and the resident memory read (the baseline: interpreter, torch,
transformers); then the model is built with random weights, the learner (AdamW), a GRPO batch
of 8 episodes in 2 groups sharing a 64-token prompt, a third of their tokens policy tokens, and
two updates run (the second with AdamW's moments allocated, as every update after a run's
first). Measured: the high-water mark minus the baseline. Printed per case: the parameters, the
estimate by part, the total, the measured peak and their ratio.

    python benchmarks/bench_update_memory.py                 # every case
    python benchmarks/bench_update_memory.py --cases s,s-ckpt --tokens 1024
    python benchmarks/bench_update_memory.py --cases qwen3-0.6b,qwen3-0.6b-lora --tokens 1024

`qwen3-0.6b` is Qwen3-0.6B's shape (hidden 1,024, 28 layers, 16 heads, 8 KV heads, intermediate
3,072, tied embeddings; about 12 GiB at its peak, full fine-tuning); `qwen3-0.6b-lora` the same
with `model.lora_rank=16` adapters on every projection (needs peft).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 151_936
# name: (hidden, layers, heads, kv heads, head dim, intermediate, gradient checkpointing)
CASES = {
    "xs": (128, 4, 4, 2, 32, 384, False),
    "s": (256, 8, 4, 2, 64, 768, False),
    "m": (512, 12, 8, 4, 64, 1536, False),
    "s-ckpt": (256, 8, 4, 2, 64, 768, True),
    "m-ckpt": (512, 12, 8, 4, 64, 1536, True),
    "qwen3-0.6b": (1024, 28, 16, 8, 128, 3072, False),       # Qwen3-0.6B's shape, random weights
    "qwen3-0.6b-lora": (1024, 28, 16, 8, 128, 3072, False),  # the same with LoRA adapters
}
LORA_RANK = {"qwen3-0.6b-lora": 16}   # model.lora_rank (every linear projection: peft's default)


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def model_config(name: str) -> dict:
    h, layers, heads, kv, hd, inter, _ = CASES[name]
    return {"model_type": "qwen3", "hidden_size": h, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
            "intermediate_size": inter, "vocab_size": VOCAB, "tie_word_embeddings": True,
            "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1e6}


def batch_of(tokens: int, episodes: int = 8, groups: int = 2, prompt: int = 64):
    """A GRPO batch of `episodes` episodes of tokens / episodes tokens each; the episodes of a
    group share their first `prompt` tokens; every third token after the prompt is a policy
    token."""
    import torch

    from agentrl_cli.train.batch import Batch

    length = tokens // episodes
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, VOCAB, (episodes, length), generator=g)
    group = torch.arange(episodes) * groups // episodes
    for k in range(groups):
        ids[group == k, :prompt] = ids[(group == k).nonzero()[0, 0], :prompt]
    policy = torch.zeros(episodes, length)
    policy[:, prompt::3] = 1.0
    turn = torch.where(policy > 0, torch.zeros_like(ids), torch.full_like(ids, -1))
    return Batch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=policy,
                 engine_logprobs=torch.full((episodes, length), -2.0) * policy,
                 turn_index=turn, segment_index=turn.clone(), rewards=torch.rand(episodes, generator=g),
                 group_index=group, advantages=torch.randn(episodes, length, generator=g) * policy)


def one(name: str, tokens: int) -> dict:
    """Run case `name` here (the child process) -> its row."""
    import torch
    import transformers

    from agentrl_cli.config import load
    from agentrl_cli.train.learner import build_learner, update
    from agentrl_cli.app.preflight import update_bytes

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    ckpt, rank = CASES[name][-1], LORA_RANK.get(name, 0)
    cfg = load(method="grpo", sets=[f"train.max_tokens_per_microbatch={tokens}",
                                    f"model.gradient_checkpointing={str(ckpt).lower()}",
                                    f"model.lora_rank={rank}"])
    Path("/proc/self/clear_refs").write_text("5")      # the high-water mark from here
    base = _status("VmRSS")
    conf = model_config(name)
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**conf, attn_implementation="sdpa"))
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if rank:
        from agentrl_cli.models.lora import wrap
        model = wrap(model, cfg, name)
    learner = build_learner(cfg, model, log=lambda s: None)
    for step in (1, 2):
        update(learner, batch_of(tokens), cfg, step)
    peak = _status("VmHWM") - base
    batch = batch_of(tokens)
    parts = update_bytes(conf, tokens, int(batch.response_mask.sum()), cfg.train.logprob_chunk, 4,
                         lora_rank=rank, checkpointing=ckpt, tree_mask=cfg.train.tree_pack)
    return {"case": name, "params": sum(p.numel() for p in model.parameters()), "tokens": tokens,
            "checkpointing": ckpt, "lora_rank": rank, "parts": parts, "estimate": sum(parts.values()), "measured": peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="xs,s,m,s-ckpt,m-ckpt")
    ap.add_argument("--tokens", type=int, default=2048, help="tokens of the update's micro-batch")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.tokens)))
        return
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    gb = lambda b: f"{b / 2**30:.2f}"  # noqa: E731
    print("| case | parameters | tokens | gradient checkpointing | estimate GiB (weights + optimiser "
          "+ activations + LM head + tree mask) | measured GiB | estimate / measured |")
    print("|---|---|---|---|---|---|---|")
    for name in args.cases.split(","):
        res = subprocess.run([sys.executable, __file__, "--one", name, "--tokens", str(args.tokens)],
                             capture_output=True, text=True, env=env)
        if res.returncode != 0:
            print(f"| {name} | failed: {res.stderr.strip().splitlines()[-1:]} |")
            continue
        r = json.loads(res.stdout.strip().splitlines()[-1])
        p = r["parts"]
        ckpt = f"{r['checkpointing']}" + (f", LoRA rank {r['lora_rank']}" if r["lora_rank"] else "")
        print(f"| {name} | {r['params'] / 1e6:.1f} M | {r['tokens']} | {ckpt} | "
              f"{gb(r['estimate'])} ({' + '.join(gb(v) for v in p.values())}) | {gb(r['measured'])} | "
              f"{r['estimate'] / r['measured']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
