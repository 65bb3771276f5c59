"""Speed of LH-Mix against the bare encoder it sits on, in one run on one device.

    python -m tools.bench            # on a GPU: bert-base sizes, WOS-like lengths (minutes)
    python -m tools.bench --family roberta    # another family of lhmix.FAMILIES, at those sizes
    python -m tools.bench --epoch    # two graphed train.py epochs at WOS's size, Mixup on
    python -m tools.bench            # on a CPU: a smoke test at tiny sizes (about 20 s)

The limit is the GPU-kernel time of the floor: the family's bare encoder's forward + backward +
Adam. Weights are random: speed does not depend on them.
"""
import argparse
import functools
import time
from types import SimpleNamespace

import numpy as np
import torch
from tqdm import tqdm

import lhmix
import runs
import speed
import train

# hidden, layers, heads, vocabulary; text word-pieces: mean, sd (base: WOS's)
SIZES = {'base': (768, 12, 12, 30522, 284, 100), 'tiny': (128, 2, 2, 1000, 100, 60)}
PARENTS = {f'd{i}': None for i in range(7)} | {f'a{j}': f'd{j % 7}' for j in range(134)}  # WOS's
FLOOR = ('input_ids', 'attention_mask')


# Beside SIZES, what each family's config needs to build at them (transformers' defaults
# otherwise): DeBERTa-v3's attention (deberta-v3-base's: relative positions only), and
# ModernBERT's special ids, beyond a vocabulary of SIZES', as BERT's.
CONFIGS = {'deberta-v2': dict(relative_attention=True, position_buckets=256, share_att_key=True,
                              norm_rel_ebd='layer_norm', pos_att_type=['p2c', 'c2p'],
                              position_biased_input=False),
           'modernbert': dict(pad_token_id=0, bos_token_id=2, cls_token_id=2, eos_token_id=3,
                              sep_token_id=3)}
SPECIAL = {'pad': 0, 'cls': 2, 'sep': 3, 'mask': 4}  # BERT's, where the config has none


def make_model(args, table):
    """An LHMix of a masked LM of `args.family` at `args.size` with random weights, on the device
    of `table` (the local hierarchies' [CLS] states), LH-Mix at train.py's defaults."""
    # Imported here: importing transformers' models sets an environment variable (torch's).
    from transformers import AutoConfig, AutoModelForMaskedLM
    torch.manual_seed(0)
    h, layers, heads, vocab, _, _ = SIZES[args.size]
    sizes = dict(vocab_size=vocab, hidden_size=h, num_hidden_layers=layers,
                 num_attention_heads=heads, intermediate_size=4 * h)
    if args.family == 'distilbert':  # its own name for the feed-forward width
        sizes['hidden_dim'] = sizes.pop('intermediate_size')
    config = AutoConfig.for_model(args.family, **sizes, **CONFIGS.get(args.family, {}))
    if lhmix.FAMILIES[args.family][2]:  # positions from the padding id + 1: 512 tokens after it
        config.max_position_embeddings = config.pad_token_id + 1 + 512
    # <s> and </s> (RoBERTa's) are [CLS] and [SEP]; [MASK] is no config's.
    given = {'pad': config.pad_token_id, 'cls': config.bos_token_id, 'sep': config.eos_token_id}
    special = SPECIAL | {k: v for k, v in given.items() if v is not None}
    model = lhmix.LHMix(AutoModelForMaskedLM.from_config(config), lhmix.Hierarchy(PARENTS), vocab,
                        special).to(table.device)
    d, _ = train.parse(['--data', 'wos'])  # LH-Mix at train.py's defaults
    lhmix.use_local_hierarchies(model, table, d.alpha, d.beta)
    return model


def documents(n, rng, size, model):
    """n random documents of `size`'s lengths for `model`, and n label sets of WOS's shape."""
    mean, sd = SIZES[size][4:]
    lens = np.clip(rng.normal(mean, sd, n).round().astype(int), 8, model.text_budget(512))
    docs = [rng.integers(5, model.base_vocab, k) for k in lens]
    return docs, [[int(rng.integers(7)), 7 + int(rng.integers(134))] for _ in docs]


def make_step(model, graphs):
    """train.py's step at its default settings, replayed from CUDA graphs with `graphs`, as
    train.fit makes it."""
    opt, scaler = speed.make_optimizer(model, train.parse(['--data', 'wos'])[0].lr, graphs)
    step = functools.partial(train.train_step, model, opt, scaler)
    if not graphs:
        return step
    if isinstance(model, lhmix.LHMix):  # train.fit's graphed steps pack Mixup's random batches
        speed.use_packed_rows(model)
    return speed.CUDAGraphs(step)


class Floor(torch.nn.Module):
    """The bare encoder, with a loss that reads all of its output."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask):
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask)
        return out.last_hidden_state.float().square().mean(), None  # (loss, lambda), as LHMix


def timed(step, keys, device, b):
    """step on batch b's `keys`, moved to the device per call as in train.py."""
    return step(speed.to_device({k: b[k] for k in keys}, device))


def sync(device):
    if device.type == 'cuda':
        torch.cuda.synchronize()


def compare(runs, rounds, device):
    """{name: median ms per call} of runs {name: (fn, batches)}: a first pass (it captures the
    graphs), then the runs take turns, `rounds` times (drifts hit them all alike)."""
    times = {k: [] for k in runs}
    for r in range(rounds + 1):
        for k, (fn, batches) in runs.items():
            sync(device)
            t0 = time.perf_counter()
            for b in batches:
                fn(b)
            sync(device)
            times[k] += [(time.perf_counter() - t0) / len(batches) * 1000] if r else []
    return {k: float(np.median(v)) for k, v in times.items()}


def memory(device):
    cuda = device.type == 'cuda'
    return f', peak memory {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB' * cuda


def epochs(args, model, graphs):
    """--epoch: two train.py epochs at WOS's size, Mixup from the first (which captures most
    graphs)."""
    device = args.device
    docs, labels = documents(30070, np.random.default_rng(0), args.size, model)
    targs, _ = train.parse(['--data', 'wos', '--warmup-epochs', '0', '--batch', str(args.batch),
                            '--device', str(device)])
    step = make_step(model, graphs)
    run = SimpleNamespace(args=targs, model=model, tokens={'train': docs}, gold={'train': labels},
                          extra={'hierarchy_ids': torch.arange(len(docs)) % 64})
    for epoch in (0, 1):
        t0 = time.perf_counter()
        train.train_epoch(run, step, graphs, epoch, tqdm(disable=True))
        print(f"{'graphed' if graphs else 'eager'} LH-Mix epoch {epoch} of {len(docs)} documents: "
              f'{time.perf_counter() - t0:.1f} s'
              + (f', {len(step.graphs)} graphs captured so far' if graphs else '')
              + memory(device))


def steps(args, model, table, graphs):
    """The training step of each way (eager, and graphed where CUDA graphs run) against the
    floor's; evaluation; on a GPU the fused ZMLCE against the plain one."""
    device, cuda, ways = args.device, args.device.type == 'cuda', ['eager'] + ['graphed'] * graphs
    # The same documents in length-bucketed batches (train.py's without Mixup) and in random ones,
    # packed in one row when graphed (with Mixup); each way has its own model (a graphed step keeps
    # its gradients).
    rng = np.random.default_rng(0)
    docs, labels = documents(args.batch * args.steps, rng, args.size, model)
    ids, cpu = torch.arange(len(docs)) % 64, torch.device('cpu')
    runs, by_way = {}, {}
    for way in ways:
        graphed = way == 'graphed'
        floor = make_step(Floor(make_model(args, table).mlm.base_model), graphed)
        model = make_model(args, table)
        by_way[way] = step = make_step(model, graphed)
        for mixing in (False, True):
            # train.py's batches, the same for each way, on the CPU (timed() moves them); those
            # without Mixup given partners too, for LH-Mix's step on them
            r = np.random.default_rng(1)
            bs = [b if mixing else dict(b, hierarchy_ids=ids[:len(b['targets'])], partner=(
                torch.from_numpy(r.permutation(len(b['targets']))))) for b in speed.epoch_batches(
                model, docs, labels, args.batch, np.random.default_rng(0), cpu, train.MLM_RATE,
                mixing, graphed, hierarchy_ids=ids)]
            keys = [k for k in bs[0] if k not in ('hierarchy_ids', 'partner')]
            named = [('floor', floor, FLOOR), ('Prompt', step, keys),
                     ('LH-Mix', step, keys + ['hierarchy_ids', 'partner'])]
            for name, fn, keys in named[2 * mixing:]:  # random batches: LH-Mix only
                runs[f'{name}, {way}' + (', random batches' if mixing else '')] = (
                    functools.partial(timed, fn, keys, device), bs)
    ms = compare(runs, args.rounds, device)
    if cuda:  # each kernel counted once, under the CPU op launching it
        fn, bs = runs['floor, eager']
        with torch.profiler.profile(acc_events=True) as prof:
            for b in bs:
                fn(b)
            sync(device)
        limit = sum(e.self_device_time_total for e in prof.key_averages()
                    if e.device_type == torch.autograd.DeviceType.CPU) / len(bs) / 1000
    else:
        limit = ms['floor, eager']
    print(f"limit: {limit:.2f} ms/step, the floor's {'GPU-kernel' if cuda else 'eager (no GPU)'} "
          'time')
    print(f"{'training step':<32} {'ms/step':>8} {'x limit':>8} {'padding':>8}")
    real = sum(len(d) + len(model.prefix) + 1 for d in docs)  # each way batches all the documents
    for k, (_, bs) in runs.items():
        pad = 100 - 100 * real / sum(b['input_ids'].numel() for b in bs)
        print(f'{k:<32} {ms[k]:8.2f} {ms[k] / limit:8.3f} {pad:7.1f}%')
    if graphs:
        print(f"LH-Mix graphs captured: {len(by_way['graphed'].graphs)}" + memory(device))

    docs = documents(4096 if cuda else 64, rng, args.size, model)[0]
    ms = compare({'evaluation': (lambda _: lhmix.score_documents(model, docs), [None])},
                 args.rounds, device)
    print(f"evaluation: {len(docs) / ms['evaluation'] * 1000:.0f} documents/s")
    if cuda:
        print('ZMLCE forward + backward, fused vs plain:')
        for n, L in (32, 141), (4096, 4096):  # an LH-Mix step's, a large one
            s = torch.randn(n, L, device=device, requires_grad=True)
            t = torch.rand(n, L, device=device) < 0.05
            ms = compare({k: (lambda _, f=f: f(s, t).sum().backward(), [None] * 20) for k, f
                          in (('fused', lhmix.zmlce), ('plain', lhmix.plain_zmlce))},
                         args.rounds, device)
            print(f"{n} score vectors x {L} labels: {ms['fused']:.3f} ms vs {ms['plain']:.3f} ms")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--family', choices=lhmix.FAMILIES, default='bert',
                   help="the masked LM's family (default: %(default)s)")
    p.add_argument('--size', choices=SIZES,
                   help="bert-base's sizes or a tiny model's (default: base on a GPU, tiny on a "
                        'CPU)')
    p.add_argument('--batch', type=int, default=16,
                   help="documents a step (default: %(default)s, train.py's)")
    p.add_argument('--steps', type=int,
                   help='batches per timed pass (default: 30 on a GPU, 3 on a CPU)')
    p.add_argument('--rounds', type=int,
                   help='timed passes, the median reported (default: 9 on a GPU, 2 on a CPU)')
    runs.add_device(p)
    p.add_argument('--epoch', action='store_true',
                   help="instead: two train.py epochs at WOS's size with Mixup (LH-Mix)")
    args = p.parse_args(argv)
    cuda = args.device.type == 'cuda'
    args.size, args.steps, args.rounds = (args.size or ('base' if cuda else 'tiny'),
                                          args.steps or (30 if cuda else 3),
                                          args.rounds or (9 if cuda else 2))
    if min(args.batch, args.steps, args.rounds) < 1:
        p.error('--batch, --steps and --rounds must be >= 1')
    table = torch.randn(64, SIZES[args.size][0], device=args.device)  # LH-Mix's: 64 hierarchies
    model = make_model(args, table)
    graphs = speed.use_cuda_graphs(args.device, model)  # where off on a GPU, it says why
    print(f"{torch.cuda.get_device_name(args.device) if cuda else 'CPU'}, torch "
          f"{torch.__version__}, CUDA graphs: {'on' if graphs else 'off'}")
    if args.epoch:
        epochs(args, model, graphs)
    else:
        steps(args, model, table, graphs)


if __name__ == '__main__':
    main()
