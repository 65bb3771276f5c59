"""Speed of LH-Mix against the bare encoder it sits on, in one run on one device.

    python bench.py                  # bert-base sizes, WOS-like lengths, on the GPU
    python bench.py --size tiny --lengths short --steps 3 --rounds 2    # a CPU smoke test

The limit is the floor's GPU-kernel time: the bare encoder's forward + backward + Adam in the same
precision. Every step is train.make_step's, eager and replayed from CUDA graphs; the ways take
turns over the rounds (drifts hit all alike) and the median is reported. Models have random
weights: speed does not depend on them.
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
from train import DEFAULTS

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
p.add_argument('--steps', type=int, default=30, help='distinct batches per timed pass')
p.add_argument('--rounds', type=int, default=9, help='timed passes of each (median reported)')
p.add_argument('--device', help='cpu, cuda or cuda:N (default: cuda when there is one)')
p.add_argument('--epoch', action='store_true',
               help="instead: train.py's epoch (LH-Mix) and dev evaluation at WOS's size")
args = p.parse_args()
if min(args.batch, args.steps, args.rounds) < 1:
    sys.exit(f'error: --batch {args.batch}, --steps {args.steps}, --rounds {args.rounds}: '
             'each must be >= 1')
device = evaluate.parse_device(p, args.device)
cuda = device.type == 'cuda'
why_not = train.cuda_graphs_unavailable(device)
ways = ['eager'] + ([] if why_not else ['graphed'])
print(f"{torch.cuda.get_device_name(device) if cuda else 'CPU'}, torch {torch.__version__}; "
      f'size {args.size}, lengths {args.lengths}, batch {args.batch}, '
      f'{args.steps} steps x {args.rounds} rounds; CUDA graphs: {why_not or "yes"}')


def make_model():
    torch.manual_seed(0)
    h, layers, heads, vocab = SIZES[args.size]
    mlm = BertForMaskedLM(BertConfig(vocab_size=vocab, hidden_size=h, num_hidden_layers=layers,
                                     num_attention_heads=heads, intermediate_size=4 * h))
    special = {'pad': 0, 'cls': 2, 'sep': 3, 'mask': 4}
    return lhmix.LHMix(mlm, lhmix.Hierarchy(PARENTS), 'prompt', vocab, special).to(device)


def documents(n, rng):
    """n random documents of --lengths' lengths, and n label sets of WOS's shape."""
    mean, sd = LENGTHS[args.lengths]
    lens = np.clip(rng.normal(mean, sd, n).round().astype(int), 8, model.text_budget(512))
    docs = [rng.integers(5, model.base_vocab, k) for k in lens]
    return docs, [[int(rng.integers(7)), 7 + int(rng.integers(134))] for _ in docs]


def make_batches(order, static):
    """train.py's batches, on the CPU, with partners and rows of a 64-row table."""
    rng = np.random.default_rng(3)  # the same masks whether or not the MLM positions are padded
    return [dict(lhmix.make_batch(model, [docs[i] for i in idx], [labels[i] for i in idx],
                                  lhmix.pad_multiple(device), rng, train.MLM_RATE, static),
                 rows=torch.from_numpy(idx % 64), partner=torch.from_numpy(partner))
            for idx, partner in order]


def make_step(model, graphs, table=None):
    """train.py's step for `model`, with its own Adam made as train.py makes it."""
    opt = torch.optim.Adam(model.parameters(), lr=DEFAULTS['lr'], fused=cuda, capturable=graphs)
    return train.make_step(model, opt, graphs, table, DEFAULTS['alpha'], DEFAULTS['beta'])


def timed(step, keys):
    """batch -> the step on the batch's `keys`, moved to the device per call as train.py does."""
    return lambda b: step(**lhmix.to_device({k: b[k] for k in keys}, device))


class Floor(torch.nn.Module):
    """The encoder alone, with a loss that reads all of its output."""

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
    """{name: median ms per call} of runs {name: (fn, batches)}: each fn first runs over all of its
    batches (graphs are captured then), then the fns take turns, --rounds times."""
    for fn, batches in runs.values():
        for b in batches:
            fn(b)
    sync()
    if cuda:
        torch.cuda.set_sync_debug_mode('warn')  # a host sync inside a step is reported
    times = {k: [] for k in runs}
    for _ in range(args.rounds):
        for k, (fn, batches) in runs.items():
            t0 = time.perf_counter()
            for b in batches:
                fn(b)
            sync()
            times[k].append((time.perf_counter() - t0) / len(batches) * 1000)
    if cuda:
        torch.cuda.set_sync_debug_mode('default')
    return {k: float(np.median(v)) for k, v in times.items()}


if args.epoch:  # train.py's own epochs, Mixup from the first; with graphs the first captures them
    model, rng = make_model(), np.random.default_rng(5)
    (docs, labels), dev = documents(30070, rng), documents(7518, rng)[0]
    step = make_step(model, not why_not, torch.randn(64, SIZES[args.size][0], device=device))
    scorer = None if why_not else train.CUDAGraphs(model.label_scores)
    targs = train.parse(['--data', 'wos', '--warmup-epochs', '0', '--batch', str(args.batch),
                         '--device', str(device)])[0]
    for epoch in range(1 if why_not else 2):
        _, _, seconds = train.train_epoch(model, step, docs, labels, np.arange(len(docs)) % 64,
                                          targs, epoch, tqdm(disable=True))
        t0 = time.perf_counter()
        lhmix.score_documents(model, dev, scorer=scorer)
        print(f'epoch {epoch}, {ways[-1]}: {len(docs)} documents in {seconds:.1f} s '
              f'({1000 * seconds / -(-len(docs) // args.batch):.2f} ms/step), dev evaluation of '
              f'{len(dev)} in {time.perf_counter() - t0:.1f} s'
              + ('' if why_not else f'; graphs: {len(step.graphs)} + {len(scorer.graphs)}'))
    sys.exit()

# Training steps on full batches of the commonest length (one graph each); every way has its own
# model, as graphed steps keep their gradients allocated. Then the LH-Mix step over all lengths, on
# random batches (mixing draws them so, issue 17) against length-bucketed ones.
rng = np.random.default_rng(0)
model = make_model()
docs, labels = documents(args.batch * args.steps * 16, rng)
lengths, multiple = np.array([len(d) for d in docs]), lhmix.pad_multiple(device)
order = lhmix.train_batches(lengths, args.batch, rng, False)
T = [-(-(len(model.prefix) + lengths[idx].max() + 1) // multiple) for idx, _ in order]
same = [(idx, rng.permutation(len(idx))) for (idx, _), t in zip(order, T)
        if t == max(set(T), key=T.count) and len(idx) == args.batch][:args.steps]
some = lengths[:args.batch * args.steps]
mixed = lhmix.train_batches(some, args.batch, rng, True)
bucketed = [(idx, rng.permutation(len(idx))) for idx, _ in
            lhmix.train_batches(some, args.batch, rng, False)]
table = torch.randn(64, SIZES[args.size][0], device=device)
runs = {}
for way in ways:
    floor = make_step(Floor(make_model().mlm.base_model), way == 'graphed')
    model = make_model()
    step, batches = make_step(model, way == 'graphed', table), make_batches(same, way == 'graphed')
    runs |= {f'floor, {way}': (timed(floor, FLOOR), batches),
             f'Prompt, {way}': (timed(step, PROMPT), batches),
             f'LH-Mix, {way}': (timed(step, LHMIX), batches)}
runs |= {f'LH-Mix, {way}, {k} batches': (timed(step, LHMIX), make_batches(o, way == 'graphed'))
         for k, o in (('random', mixed), ('bucketed', bucketed))}
ms = compare(runs)
if cuda:  # the floor's GPU-kernel time, each kernel counted once (by the CPU op launching it)
    with torch.profiler.profile() as prof:
        for b in runs['floor, eager'][1]:
            runs['floor, eager'][0](b)
        sync()
    limit = sum(e.self_device_time_total for e in prof.key_averages()
                if e.device_type == torch.autograd.DeviceType.CPU) / len(same) / 1000
else:
    limit = ms['floor, eager']
print(f'limit: {limit:.2f} ms/step = ' + ("the floor's GPU-kernel time" if cuda else
                                          'the eager floor (no GPU: no kernel-time limit)'))
print(f"{'training step':<32} {'ms/step':>8} {'x limit':>8} {'padding':>8}")
for k in [f'{s}, {w}' for s in ('floor', 'Prompt', 'LH-Mix') for w in ways] + list(runs)[-2:]:
    x = f'{ms[k] / limit:8.3f}' if k.count(',') == 1 else '       -'  # other lengths
    real = sum(int(b['attention_mask'].sum()) for b in runs[k][1])
    pad = 100 - 100 * real / sum(b['input_ids'].numel() for b in runs[k][1])
    print(f'{k:<32} {ms[k]:8.2f} {x} {pad:7.1f}%')

docs = documents(4096 if cuda else 64, rng)[0]
for way in ways:  # the first pass captures the graphs, the second is timed
    scorer = train.CUDAGraphs(model.label_scores) if way == 'graphed' else None
    for _ in range(2):
        t0 = time.perf_counter()
        lhmix.score_documents(model, docs, scorer=scorer)
    print(f'evaluation, {way}: {len(docs) / (time.perf_counter() - t0):.0f} documents/s')

if not cuda:
    print('ZMLCE, fused vs plain: not run (the fused kernel needs CUDA)')
    sys.exit()
print(f"{'ZMLCE fwd+bwd (rows, labels)':<30} {'fused ms':>9} {'plain ms':>9}")
for n, L in (16 * 2, 141), (16 * 8, 166), (4096, 4096):
    scores = (3 * torch.randn(n, L, device=device)).requires_grad_()
    targets = torch.rand(n, L, device=device) < 0.05

    def fwd_bwd(loss):
        def once(_):
            loss(scores, targets).sum().backward()
            scores.grad = None
        return once
    t = compare({k: (fwd_bwd(f), [None] * 20) for k, f in (('fused', lhmix.zmlce),
                                                          ('plain', lhmix.plain_zmlce))})
    print(f"{str((n, L)):<30} {t['fused']:9.3f} {t['plain']:9.3f}")
