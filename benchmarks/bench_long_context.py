"""Peak memory and time of one training step (forward + backward) at long context.

A tiny gpt-oss-style model (learned per-head sinks, one sliding-window and one full-attention
layer, a small MoE, vocabulary 8192) takes one step on a single sequence of 1k-8k tokens:
loss = mean next-token log-prob, computed exactly as the trainer does
(`agentrl_cli.models.sequences`). Compared, side by side in one run:

- attention: `eager` (transformers' gpt-oss default, which keeps the sinks by building the
  [heads, L, L+1] score matrix; stock `sdpa` is refused for gpt-oss as it would drop them) vs
  `sink_sdpa` (CPU and CUDA) and `sink_flex` (CUDA);
- log-probs: `plain` (all L x vocab logits at once) vs `chunked` (512 tokens at a time,
  recomputed in backward: `train.logprob_chunk`).

CPU: every configuration runs in its own forked process; peak memory is that process's peak
RSS during the step (VmHWM, reset just before it), and `--cap-mb` limits the address space the
step may add (RLIMIT_AS, set after the model is built), so a configuration that needs more
fails with an allocation error (OOM) instead of swapping the machine. glibc's mmap threshold
is fixed at 128 KiB first, so freed tensors leave RSS. CUDA: one process,
`torch.cuda.max_memory_allocated`, optional cap through `set_per_process_memory_fraction`.

    OMP_NUM_THREADS=1 python benchmarks/bench_long_context.py
    python benchmarks/bench_long_context.py --device cuda          # experiments/gpu/check_attention.sh
"""
from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import os
import resource
import sys
import time

CHUNK = 512


def build_model(args, attention: str):
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    from agentrl_cli.models.attention import hf_attention_name

    torch.manual_seed(0)
    cfg = GptOssConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden,
                       num_hidden_layers=2 * args.layer_pairs,
                       num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                       head_dim=args.head_dim, sliding_window=args.window,
                       num_local_experts=2, num_experts_per_tok=1,
                       layer_types=["sliding_attention", "full_attention"] * args.layer_pairs,
                       attn_implementation=hf_attention_name(attention))
    model = GptOssForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)
    return model


def train_step(model, ids, chunk: int):
    import torch

    from agentrl_cli.models.sequences import hidden_states, logprobs_from_hidden

    h = hidden_states(model, ids, torch.ones_like(ids))
    loss = -logprobs_from_hidden(model, h, ids, chunk=chunk).mean()
    loss.backward()
    model.zero_grad(set_to_none=True)
    return float(loss.detach())


def _is_oom(e: BaseException) -> bool:
    text = str(e).lower()
    return isinstance(e, MemoryError) or "out of memory" in text or "can't allocate" in text


# ------------------------------------------------------------------------------------- CPU
def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure_cpu(args, length: int, attention: str, logprobs: str) -> dict:
    """One configuration in this (forked) process: its peak RSS during the step, its time."""
    import torch

    model = build_model(args, attention).train()
    chunk = CHUNK if logprobs == "chunked" else 0
    g = torch.Generator().manual_seed(1)
    train_step(model, torch.randint(0, args.vocab, (1, 256), generator=g), chunk)  # warm-up
    ids = torch.randint(0, args.vocab, (1, length), generator=g)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS mark (VmHWM) to the current RSS
    row = {"before_mb": _status_kb("VmRSS") / 1024}
    if args.cap_mb:
        vm = _status_kb("VmSize") * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + args.cap_mb * 2**20, resource.RLIM_INFINITY))
    t0 = time.perf_counter()
    try:
        train_step(model, ids, chunk)
        row["status"] = "ok"
    except (RuntimeError, MemoryError) as e:
        if not _is_oom(e):
            raise
        row["status"] = "OOM"
    row["time_s"] = time.perf_counter() - t0
    row["peak_mb"] = _status_kb("VmHWM") / 1024
    return row


def run_cpu(args, configs):
    """Each configuration in a forked child (imports paid once, memory marks per child)."""
    for name in ("torch", "transformers.models.gpt_oss.modeling_gpt_oss",
                 "agentrl_cli.models.attention", "agentrl_cli.models.sequences"):
        importlib.import_module(name)  # once, before forking (no torch compute happens here)

    try:  # M_MMAP_THRESHOLD = -3: big allocations are mmapped, and unmapped when freed
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)
    except OSError:
        pass
    rows = []
    for length, attention, logprobs in configs:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            os.close(r)
            code = 0
            try:
                row = measure_cpu(args, length, attention, logprobs)
            except BaseException as e:  # noqa: BLE001  (reported to the parent, never raised)
                row, code = {"status": f"error: {type(e).__name__}: {str(e)[:60]}"}, 1
            os.write(w, json.dumps(row).encode())
            os.close(w)
            os._exit(code)
        os.close(w)
        with os.fdopen(r) as f:
            text = f.read()
        _, status = os.waitpid(pid, 0)
        row = json.loads(text) if text else {"status": f"killed (wait status {status})"}
        rows.append({"length": length, "attention": attention, "logprobs": logprobs, **row})
        print_row(rows[-1])
    return rows


# ------------------------------------------------------------------------------------ CUDA
def run_cuda(args, configs):
    import torch

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    total = torch.cuda.get_device_properties(0).total_memory
    models = {}
    rows = []
    for length, attention, logprobs in configs:
        if attention not in models:
            models[attention] = build_model(args, attention).to("cuda", dtype).train()
        model = models[attention]
        chunk = CHUNK if logprobs == "chunked" else 0
        ids = torch.randint(0, args.vocab, (1, length), device="cuda",
                            generator=torch.Generator("cuda").manual_seed(1))
        torch.cuda.empty_cache()
        if args.cap_mb:
            base = torch.cuda.memory_allocated()
            torch.cuda.set_per_process_memory_fraction(min(1.0, (base + args.cap_mb * 2**20) / total))
        torch.cuda.reset_peak_memory_stats()
        row = {"before_mb": torch.cuda.memory_allocated() / 2**20}
        try:
            train_step(model, ids, chunk)  # warm-up (FlexAttention compiles per shape)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            train_step(model, ids, chunk)
            torch.cuda.synchronize()
            row.update(status="ok", time_s=time.perf_counter() - t0)
        except torch.OutOfMemoryError:
            row.update(status="OOM", time_s=float("nan"))
        except Exception as e:  # noqa: BLE001  (a broken configuration must not hide the others)
            first = (str(e).splitlines() or [""])[0]
            row.update(status=f"error: {type(e).__name__}: {first[:80]}", time_s=float("nan"))
        row["peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
        torch.cuda.set_per_process_memory_fraction(1.0)
        rows.append({"length": length, "attention": attention, "logprobs": logprobs, **row})
        print_row(rows[-1])
    return rows


# ----------------------------------------------------------------------------------- table
def print_row(r) -> None:
    if r.get("status") == "ok":
        step = r["peak_mb"] - r["before_mb"]
        print(f"| {r['length']:>5} | {r['attention']:<9} | {r['logprobs']:<7} | {r['peak_mb']:>8.0f} "
              f"| {step:>8.0f} | {r['time_s']:>6.2f} | ok |", flush=True)
    else:
        print(f"| {r['length']:>5} | {r['attention']:<9} | {r['logprobs']:<7} | {'-':>8} | {'-':>8} "
              f"| {'-':>6} | {r.get('status')} |", flush=True)


def summary(rows, sink: str) -> None:
    def peak(length, attention, logprobs):
        for r in rows:
            if (r["length"], r["attention"], r["logprobs"]) == (length, attention, logprobs):
                return r
        return None

    print()
    for length in sorted({r["length"] for r in rows}):
        for lp in ("chunked", "plain"):
            e, s = peak(length, "eager", lp), peak(length, sink, lp)
            if not (e and s):
                continue
            if e["status"] == "ok" and s["status"] == "ok":
                red = 1 - s["peak_mb"] / e["peak_mb"]
                step_red = 1 - (s["peak_mb"] - s["before_mb"]) / (e["peak_mb"] - e["before_mb"])
                print(f"{length} tokens, {lp} log-probs: {sink} peak {red:.1%} lower than eager "
                      f"(the step's own memory {step_red:.1%} lower)")
            else:
                print(f"{length} tokens, {lp} log-probs: eager {e['status']}, {sink} {s['status']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--lengths", default="1024,2048,4096,8192")
    p.add_argument("--attentions", default="", help="default: eager,sink_sdpa (cpu); eager,sink_flex,sink_sdpa (cuda)")
    p.add_argument("--logprob-modes", default="plain,chunked")
    p.add_argument("--cap-mb", type=int, default=None,
                   help="memory the step may add (default 2500 on cpu, none on cuda; 0: no cap)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"], help="cuda only")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--layer-pairs", type=int, default=1, help="(sliding, full) layer pairs")
    args = p.parse_args()
    if args.cap_mb is None:
        args.cap_mb = 2500 if args.device == "cpu" else 0

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda but no CUDA device is available")
    sink = "sink_sdpa" if args.device == "cpu" else "sink_flex"
    attentions = args.attentions.split(",") if args.attentions else (
        ["eager", "sink_sdpa"] if args.device == "cpu" else ["eager", "sink_flex", "sink_sdpa"])
    configs = [(int(n), a, lp) for n in args.lengths.split(",") for a in attentions
               for lp in args.logprob_modes.split(",")]
    where = (f"{args.device}, {torch.get_num_threads()} thread(s)" if args.device == "cpu"
             else f"{torch.cuda.get_device_name(0)}, {args.dtype}")
    cap = f"step may add at most {args.cap_mb} MB" if args.cap_mb else "no memory cap"
    print(f"One training step of a tiny gpt-oss-style model ({2 * args.layer_pairs} layers: sliding "
          f"window {args.window} + full; {args.heads} heads x {args.head_dim}, vocab {args.vocab}) "
          f"on {where}; {cap}.")
    print("peak: process peak RSS (cpu) / max allocated (cuda); step: peak minus memory before the step\n")
    print("| tokens | attention | log-probs | peak MB | step MB | step s | status |")
    print("|---:|---|---|---:|---:|---:|---|")
    t0 = time.time()
    rows = run_cpu(args, configs) if args.device == "cpu" else run_cuda(args, configs)
    summary(rows, sink)
    print(f"\n(total {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
