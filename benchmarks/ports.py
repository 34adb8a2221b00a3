"""Real small programs on the CPU: a makemore-style MLP and a nanoGPT-style GPT step, batch 32.

The GPT is ``examples/pytorch_ports/char_gpt`` (flowgraph's port and its PyTorch original side by side) in a
makemore-"transformer"-sized configuration; the MLP is makemore's (Bengio et al. 2003: embedding, concatenated
context, tanh hidden layer, logits). Each step is forward, cross-entropy, backward and AdamW, from the same
weights (torch's, copied) and the same batches, timed three ways in interleaved rounds: flowgraph eager,
flowgraph under ``fg.jit``, torch eager. Prints ms per step (median) and the ratios to torch.

    python benchmarks/ports.py                    # both programs, 2 torch threads
    python benchmarks/ports.py --steps 50 --rounds 5 --threads 1
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from a checkout


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gpt_pair(block: int, vocab: int):
    """(flowgraph model, torch model) of the port, torch's weights copied into flowgraph's."""
    import flowgraph as fg

    fgm = _load("examples/pytorch_ports/char_gpt/train.py", "fg_char_gpt")
    tm = _load("examples/pytorch_ports/char_gpt/train_torch.py", "torch_char_gpt")
    kw = dict(block_size=block, vocab_size=vocab, n_layer=4, n_head=4, n_embd=64, dropout=0.0)
    ref = tm.GPT(tm.GPTConfig(**kw))
    port = fgm.GPT(fgm.GPTConfig(**kw))
    port.load_state_dict({k: fg.tensor(v.detach().numpy()) for k, v in ref.state_dict().items()})
    return port, ref


def _mlp_pair(block: int, vocab: int, n_embd: int = 64, hidden: int = 64):
    import torch

    import flowgraph as fg
    from flowgraph import nn

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab + 1, n_embd)  # the extra token: <BLANK> before the name starts
            self.mlp = nn.Sequential(nn.Linear(block * n_embd, hidden), nn.Tanh(), nn.Linear(hidden, vocab))

        def forward(self, idx, targets):
            logits = self.mlp(self.wte(idx).view(idx.shape[0], -1))
            return logits, nn.functional.cross_entropy(logits, targets)

    class TorchMlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = torch.nn.Embedding(vocab + 1, n_embd)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(block * n_embd, hidden), torch.nn.Tanh(),
                                           torch.nn.Linear(hidden, vocab))

        def forward(self, idx, targets):
            logits = self.mlp(self.wte(idx).view(idx.shape[0], -1))
            return logits, torch.nn.functional.cross_entropy(logits, targets)

    ref = TorchMlp()
    port = Mlp()
    port.load_state_dict({k: fg.tensor(v.detach().numpy()) for k, v in ref.state_dict().items()})
    return port, ref


def _batches(kind: str, n: int, block: int, vocab: int, batch: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    if kind == "gpt":  # next-character prediction over a block
        x = rng.integers(0, vocab, size=(n, batch, block))
        y = rng.integers(0, vocab, size=(n, batch, block))
    else:  # makemore MLP: a context of `block` characters -> the next one
        x = rng.integers(0, vocab + 1, size=(n, batch, block))
        y = rng.integers(0, vocab, size=(n, batch))
    return list(zip(x.astype(np.int64), y.astype(np.int64)))


def _runners(kind: str, args) -> dict:
    import torch

    import flowgraph as fg
    from flowgraph import optim

    block, vocab = (32, 65) if kind == "gpt" else (16, 27)
    pair = _gpt_pair if kind == "gpt" else _mlp_pair
    data = _batches(kind, args.steps, block, vocab, args.batch)
    runs = {}
    for label in ("flowgraph", "flowgraph_jit"):
        port, _ = pair(block, vocab)
        opt = optim.AdamW(port.parameters(), lr=5e-4, weight_decay=0.01)

        def step(x, y, port=port, opt=opt):
            _, loss = port(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss

        fn = fg.jit(step) if label.endswith("jit") else step
        batches = [(fg.tensor(x), fg.tensor(y)) for x, y in data]
        runs[label] = (lambda fn=fn, batches=batches: [fn(x, y) for x, y in batches][-1].item())
    _, ref = pair(block, vocab)
    topt = torch.optim.AdamW(ref.parameters(), lr=5e-4, weight_decay=0.01)
    tbatches = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in data]

    def torch_epoch() -> float:
        for x, y in tbatches:
            _, loss = ref(x, y)
            topt.zero_grad(set_to_none=True)
            loss.backward()
            topt.step()
        return loss.item()

    runs["torch"] = torch_epoch
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", default="mlp,gpt", help="comma-separated: mlp (makemore), gpt (nanoGPT)")
    parser.add_argument("--steps", type=int, default=20, help="steps per timed epoch")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the median is reported")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    print(f"# CPU, batch {args.batch}, {args.steps} steps per epoch, median of {args.rounds} interleaved rounds, "
          f"torch {torch.__version__} with {args.threads} threads")
    print(f"{'program':<10}{'fg eager ms':>13}{'fg jit ms':>11}{'torch ms':>10}{'eager/torch':>13}{'jit/torch':>11}")
    for kind in args.programs.split(","):
        runs = _runners(kind.strip(), args)
        for run in runs.values():
            run()  # warm-up: the jit's eager and recorded calls happen here
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(args.rounds):
            for name, run in runs.items():
                t0 = time.perf_counter()
                run()
                times[name].append((time.perf_counter() - t0) / args.steps * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{kind:<10}{med['flowgraph']:>13.2f}{med['flowgraph_jit']:>11.2f}{med['torch']:>10.2f}"
              f"{med['flowgraph'] / med['torch']:>13.2f}{med['flowgraph_jit'] / med['torch']:>11.2f}", flush=True)


if __name__ == "__main__":
    main()
