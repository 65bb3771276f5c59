"""Speed of LH-Mix against the bare encoder it sits on, in one run on one device.

    python bench.py    # bert-base sizes (random weights), WOS-like lengths, on the GPU
    python bench.py --size tiny --lengths short --steps 3 --rounds 2    # CPU smoke test

The limit is the GPU-kernel time of the floor: the bare encoder's forward + backward + Adam.
"""
import argparse
import sys
import time

import numpy as np
import torch
from tqdm import tqdm
from transformers import BertConfig, BertForMaskedLM

import evaluate
import lhmix
import train

SIZES = {'base': (768, 12, 12, 30522), 'tiny': (128, 2, 2, 1000)}  # hidden, layers, heads, vocab
LENGTHS = {'wos': (284, 100), 'nyt': (600, 250), 'short': (100, 60)}  # word-pieces: mean, sd
PARENTS = {f'd{i}': None for i in range(7)} | {f'a{j}': f'd{j % 7}' for j in range(134)}  # WOS's
FLOOR = ('input_ids', 'attention_mask')
PROMPT = FLOOR + ('targets', 'mlm_pos', 'mlm_labels')
LHMIX = PROMPT + ('rows', 'partner')

p = argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument('--size', default='base', choices=SIZES)
p.add_argument('--lengths', default='wos', choices=LENGTHS)
p.add_argument('--batch', type=int, default=16)
p.add_argument('--steps', type=int, default=30, help='batches per timed pass')
p.add_argument('--rounds', type=int, default=9, help='timed passes (median reported)')
p.add_argument('--device', help='cpu, cuda or cuda:N (default: cuda when there is one)')
p.add_argument('--epoch', action='store_true', help="instead: a train.py epoch at WOS's size")
args = p.parse_args()
if min(args.batch, args.steps, args.rounds) < 1:
    sys.exit(f'error: --batch {args.batch}, --steps {args.steps}, --rounds {args.rounds}: '
             'each must be >= 1')
device = evaluate.parse_device(p, args.device)
cuda, why_not = device.type == 'cuda', train.cuda_graphs_unavailable(device)
ways = ['eager'] + ([] if why_not else ['graphed'])
table = torch.randn(64, SIZES[args.size][0], device=device)  # LH-Mix's: 64 hierarchies
print(f"{torch.cuda.get_device_name(device) if cuda else 'CPU'}, torch {torch.__version__}, "
      f"CUDA graphs: {why_not or 'on'}")


def make_model():
    torch.manual_seed(0)
    h, layers, heads, vocab = SIZES[args.size]
    mlm = BertForMaskedLM(BertConfig(vocab_size=vocab, hidden_size=h, num_hidden_layers=layers,
                                     num_attention_heads=heads, intermediate_size=4 * h))
    return lhmix.LHMix(mlm, lhmix.Hierarchy(PARENTS), 'prompt', vocab,
                       {'pad': 0, 'cls': 2, 'sep': 3, 'mask': 4}).to(device)


def documents(n, rng):
    """n random documents of --lengths' lengths, and n label sets of WOS's shape."""
    mean, sd = LENGTHS[args.lengths]
    lens = np.clip(rng.normal(mean, sd, n).round().astype(int), 8, model.text_budget(512))
    docs = [rng.integers(5, model.base_vocab, k) for k in lens]
    return docs, [[int(rng.integers(7)), 7 + int(rng.integers(134))] for _ in docs]


def make_step(model, graphs, table=None):
    """train.py's step, with Adam as train.py makes it."""
    d = train.DEFAULTS
    opt = torch.optim.Adam(model.parameters(), lr=d['lr'], fused=cuda, capturable=graphs)
    return train.make_step(model, opt, graphs, table, d['alpha'], d['beta'])


class Floor(torch.nn.Module):
    """The bare encoder, with a loss that reads all of its output."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask, lam=None):  # make_step passes lam
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask)
        return out.last_hidden_state.float().square().mean()


def sync():
    if cuda:
        torch.cuda.synchronize()


def compare(runs):
    """{name: median ms per call} of runs {name: (fn, batches)}: a first pass (it captures the
    graphs), then the runs take turns, --rounds times (drifts hit them all alike)."""
    for fn, batches in runs.values():
        for b in batches:
            fn(b)
    sync()
    times = {k: [] for k in runs}
    for _ in range(args.rounds):
        for k, (fn, batches) in runs.items():
            t0 = time.perf_counter()
            for b in batches:
                fn(b)
            sync()
            times[k].append((time.perf_counter() - t0) / len(batches) * 1000)
    return {k: float(np.median(v)) for k, v in times.items()}


if args.epoch:  # graphs captured in it
    model = make_model()
    docs, labels = documents(30070, np.random.default_rng(0))
    step = make_step(model, not why_not, table)
    targs, _ = train.parse(['--data', 'wos', '--warmup-epochs', '0', '--batch', str(args.batch),
                            '--device', str(device)])
    t0 = time.perf_counter()
    train.train_epoch(model, step, docs, labels, np.arange(len(docs)) % 64, targs, 0,
                      tqdm(disable=True))
    print(f'{ways[-1]} epoch of {len(docs)} documents: {time.perf_counter() - t0:.1f} s')
    sys.exit()


def batch(idx, seed, static):
    """train.py's batch of documents idx (on the CPU), with table rows and partners."""
    rng = np.random.default_rng(seed)  # the same eager and graphed
    b = lhmix.make_batch(model, [docs[i] for i in idx], [labels[i] for i in idx],
                         lhmix.pad_multiple(device), rng, train.MLM_RATE, static)
    return dict(b, rows=torch.tensor(idx % 64), partner=torch.tensor(rng.permutation(len(idx))))


def timed(step, keys):
    """batch -> step on its `keys`, moved to the device per call as in train.py."""
    return lambda b: step(**lhmix.to_device({k: b[k] for k in keys}, device))


# The same documents in length-bucketed batches (train.py's without Mixup) and in random ones
# (with Mixup, issue 17); each way has its own model (a graphed step keeps its gradients).
rng = np.random.default_rng(0)
model = make_model()
docs, labels = documents(args.batch * args.steps, rng)
orders = {k: [idx for idx, _ in lhmix.train_batches([len(d) for d in docs], args.batch, rng, mix)]
          for k, mix in (('', False), (', random batches', True))}
runs = {}
for way in ways:
    floor = make_step(Floor(make_model().mlm.base_model), way == 'graphed')
    model = make_model()
    step = make_step(model, way == 'graphed', table)
    for k, order in orders.items():
        bs = [batch(idx, i, way == 'graphed') for i, idx in enumerate(order)]
        if not k:
            runs[f'floor, {way}'] = timed(floor, FLOOR), bs
            runs[f'Prompt, {way}'] = timed(step, PROMPT), bs
        runs[f'LH-Mix, {way}{k}'] = timed(step, LHMIX), bs
ms = compare(runs)
if cuda:  # each kernel counted once, under the CPU op launching it
    fn, bs = runs['floor, eager']
    with torch.profiler.profile(acc_events=True) as prof:
        for b in bs:
            fn(b)
        sync()
    limit = sum(e.self_device_time_total for e in prof.key_averages()
                if e.device_type == torch.autograd.DeviceType.CPU) / len(bs) / 1000
else:
    limit = ms['floor, eager']
print(f"limit: {limit:.2f} ms/step, the floor's {'GPU-kernel' if cuda else 'eager (no GPU)'} time")
print(f"{'training step':<32} {'ms/step':>8} {'x limit':>8} {'padding':>8}")
for k in sorted(runs, key=lambda k: (['f', 'P', 'L'].index(k[0]), len(k))):
    real = sum(int(b['attention_mask'].sum()) for b in runs[k][1])
    pad = 100 - 100 * real / sum(b['input_ids'].numel() for b in runs[k][1])
    print(f'{k:<32} {ms[k]:8.2f} {ms[k] / limit:8.3f} {pad:7.1f}%')

docs = documents(4096 if cuda else 64, rng)[0]
for way in ways:  # the first pass captures the graphs, the second is timed
    scorer = train.CUDAGraphs(model.label_scores) if way == 'graphed' else None
    for _ in range(2):
        t0 = time.perf_counter()
        lhmix.score_documents(model, docs, scorer=scorer)
    print(f'evaluation, {way}: {len(docs) / (time.perf_counter() - t0):.0f} documents/s')

if cuda:
    print('ZMLCE forward + backward, fused vs plain:')
    for n, L in (32, 141), (4096, 4096):  # an LH-Mix step's, a large one
        s = torch.randn(n, L, device=device, requires_grad=True)
        t = torch.rand(n, L, device=device) < 0.05
        ms = compare({k: (lambda _, f=f: f(s, t).sum().backward(), [None] * 20) for k, f
                      in (('fused', lhmix.zmlce), ('plain', lhmix.plain_zmlce))})
        print(f"{n} rows x {L} labels: {ms['fused']:.3f} ms vs {ms['plain']:.3f} ms")
else:
    print('ZMLCE, fused vs plain: not run (no CUDA)')
