"""Speed of LH-Mix against the bare encoder it sits on, in one run on one device.

    python bench.py                      # bert-base sizes (random weights), WOS-like lengths, GPU
    python bench.py --size tiny --lengths short --steps 3    # a CPU smoke test

Measures, on the same batches (same lengths, bucketed as train.py buckets them), each eager and
replayed from CUDA graphs (train.py's default on CUDA):
  1. the floor: the encoder's forward + backward + Adam step in the same precision, nothing else
     (also through torch.compile, for reference); its GPU-kernel time is the limit;
  2. a Prompt training step (--mix none); 3. an LH-Mix training step (cached similarity, Mixup),
     both through train.py's own step (train.make_step);
  4. evaluation throughput (documents/s); 5. the fused ZMLCE autograd Function against the plain
     formula (1e12-masked concatenate-and-logsumexp): forward + backward time and peak memory.
Speed does not depend on the weights, so models are built from a config with random weights.
"""
import argparse
import time

import numpy as np
import torch
from tqdm import tqdm

import lhmix
import train

SIZES = {'base': dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                      vocab_size=30522),
         'tiny': dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
                      vocab_size=1000)}
LENGTHS = {'wos': (284, 100), 'nyt': (600, 250), 'short': (100, 60)}  # word-pieces: mean, sd (cut to 512)
SPECIAL = {'pad': 0, 'cls': 101, 'sep': 102, 'mask': 103}


DOMAINS, AREAS = 7, 134  # WOS's shape: 141 labels, depth 2


def wos_like_hierarchy():
    """DOMAINS domains with AREAS areas between them."""
    parents = {f'd{i}': None for i in range(DOMAINS)}
    parents.update({f'a{j}': f'd{j % DOMAINS}' for j in range(AREAS)})
    return lhmix.Hierarchy(parents)


def random_labels(n, rng):
    """n gold label sets of wos_like_hierarchy's shape: a domain id and an area id (after the domains)."""
    return [[int(rng.integers(DOMAINS)), DOMAINS + int(rng.integers(AREAS))] for _ in range(n)]


def random_table(model, n, rng):
    """Stand-ins for train.py's cached local hierarchies (on the CPU): 64 embeddings, one row per document."""
    return torch.randn(64, model.mlm.config.hidden_size), torch.from_numpy(rng.integers(0, 64, n))


def sync(device):
    if device.type == 'cuda':
        torch.cuda.synchronize()


def make_model(size, arch, device):
    from transformers import BertConfig, BertForMaskedLM
    torch.manual_seed(0)
    mlm = BertForMaskedLM(BertConfig(max_position_embeddings=512, **SIZES[size]))
    special = SPECIAL if size == 'base' else {'pad': 0, 'cls': 2, 'sep': 3, 'mask': 4}
    return lhmix.LHMix(mlm, wos_like_hierarchy(), arch, SIZES[size]['vocab_size'], special).to(device)


def documents(n, lengths, vocab, max_text, rng):
    mean, sd = LENGTHS[lengths]
    lens = np.clip(rng.normal(mean, sd, n).round().astype(int), 8, max_text)
    return [rng.integers(1000 if vocab > 2000 else 5, vocab, k) for k in lens]


def compare(fns, batches, device, rounds):
    """{name: (median ms per call, peak GiB)}: each fn is warmed up over every batch (each shape seen
    once: graphs are captured then), then the fns are timed in turn, `rounds` times, so that drifts
    hit them all alike."""
    for fn in fns.values():
        for b in batches:
            fn(b)
    sync(device)
    if device.type == 'cuda':
        torch.cuda.set_sync_debug_mode('warn')  # any implicit host sync inside a call is reported
    times, peak = {k: [] for k in fns}, {}
    for _ in range(rounds):
        for k, fn in fns.items():
            if device.type == 'cuda':
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            for b in batches:
                fn(b)
            sync(device)
            times[k].append((time.perf_counter() - t0) / len(batches) * 1000)
            peak[k] = torch.cuda.max_memory_allocated() / 2 ** 30 if device.type == 'cuda' else float('nan')
    if device.type == 'cuda':
        torch.cuda.set_sync_debug_mode('default')
    return {k: (float(np.median(times[k])), peak[k]) for k in fns}


def _pad_len(model, n, multiple):
    return -(-(len(model.prefix) + n + 1) // multiple) * multiple


def trainer(model, graphs):
    """train.py's step for `model` (its own Adam): eager, or replayed from CUDA graphs."""
    device = next(model.parameters()).device
    opt = torch.optim.Adam(model.parameters(), lr=train.PAPER['lr'], fused=device.type == 'cuda', capturable=graphs)
    scaler = torch.amp.GradScaler(device.type, enabled=False)
    return train.make_step(model, opt, scaler, graphs)


def lhmix_step(step, device, mix='lhmix'):
    """One training step as train.py's train_epoch runs it (ratios on the CPU, copied with the batch)."""
    def run(item):
        b, (h, partner) = item
        if mix != 'none':
            b = dict(b, partner=partner)
            b['lam'] = lhmix.pair_ratios(mix, partner, h)
        step(**lhmix.to_device(b, device))
    return run


class Floor(torch.nn.Module):
    """The encoder alone, with a loss that reads all of its output: no training step costs less."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, attention_mask):
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state.float().square().mean()


def floor_step(step, device):
    def run(item):
        step(**lhmix.to_device({k: item[0][k] for k in ('input_ids', 'attention_mask')}, device))
    return run


def build_batches(model, docs, labels, order, table, rows, multiple, seed, static):
    rng = np.random.default_rng(seed)  # the same masks whether or not the MLM positions are padded
    batches = [lhmix.make_batch(model, [docs[i] for i in idx], [labels[i] for i in idx], multiple, rng, 0.15,
                                static=static) for idx, _ in order]
    return list(zip(batches, [(table[rows[idx]], partner) for idx, partner in order]))


def padding(batches):
    real = sum(int(b['attention_mask'].sum()) for b, _ in batches)
    return 100 * (sum(b['input_ids'].numel() for b, _ in batches) / real - 1)


def pairing_cost(args, model, step, device, rng):
    """The LH-Mix step on paired batches (train.py's) against unpaired length-bucketed batches
    (partners a random permutation inside each batch), same documents, all length buckets."""
    docs = documents(args.batch * args.steps, args.lengths, SIZES[args.size]['vocab_size'], model.text_budget(512), rng)
    labels = random_labels(len(docs), rng)
    table, rows = random_table(model, len(docs), rng)
    multiple = lhmix.pad_multiple(device)
    lengths = [len(d) for d in docs]
    paired = lhmix.train_batches(lengths, args.batch, np.random.default_rng(1), paired=True)
    r = np.random.default_rng(2)
    unpaired = [(idx, torch.from_numpy(r.permutation(len(idx)))) for idx, _ in
                lhmix.train_batches(lengths, args.batch, r, paired=False)]
    out = {}
    for name, order in (('paired', paired), ('unpaired', unpaired)):
        batches = build_batches(model, docs, labels, order, table, rows, multiple, 3, False)
        out[name] = (padding(batches), compare({name: lhmix_step(step, device)}, batches, device, args.rounds)[name][0])
    return out


def train_steps(args, device, rng, graphs, compiled):
    """ms per step of the floor, Prompt and LH-Mix steps, eager and (when `graphs`) replayed from CUDA
    graphs, and (when `compiled`) the floor through torch.compile, on identical batches of one
    sequence length (the commonest bucket: one graph each). Each way has its own model copy (same
    weights): graphed steps keep their gradients allocated, which an eager step would free."""
    model = make_model(args.size, 'prompt', device)
    multiple = lhmix.pad_multiple(device)
    max_text = model.text_budget(512)
    docs = documents(args.batch * args.steps * 4, args.lengths, SIZES[args.size]['vocab_size'], max_text, rng)
    labels = random_labels(len(docs), rng)
    table, rows = random_table(model, len(docs), rng)
    order = lhmix.train_batches([len(d) for d in docs], args.batch, rng, paired=True)
    T = [_pad_len(model, max(len(docs[i]) for i in idx), multiple) for idx, _ in order]
    common = max(set(T), key=T.count)
    order = [o for o, t in zip(order, T) if t == common and len(o[0]) == args.batch][:args.steps]
    eager_b = build_batches(model, docs, labels, order, table, rows, multiple, 3, False)
    static_b = build_batches(model, docs, labels, order, table, rows, multiple, 3, True)
    step = trainer(model, False)
    fns = {'floor': floor_step(trainer(Floor(model.mlm.base_model), False), device),
           'prompt': lhmix_step(step, device, 'none'), 'lhmix': lhmix_step(step, device)}
    out = compare(fns, eager_b, device, args.rounds)
    setup_s = {}

    def first_call(name, fn):  # the first call captures or compiles its one graph
        t0 = time.perf_counter()
        fn(static_b[0])
        sync(device)
        setup_s[name] = time.perf_counter() - t0
    if graphs:
        step_g = trainer(make_model(args.size, 'prompt', device), True)
        gfns = {'floor_graphed': floor_step(trainer(Floor(make_model(args.size, 'prompt', device).mlm.base_model), True),
                                            device),
                'prompt_graphed': lhmix_step(step_g, device, 'none'), 'lhmix_graphed': lhmix_step(step_g, device)}
        if compiled:
            gfns['floor_compiled'] = floor_step(trainer(torch.compile(Floor(model.mlm.base_model), dynamic=False),
                                                        False), device)
        for k, fn in gfns.items():
            first_call(k, fn)
        out.update(compare(gfns, static_b, device, args.rounds))
    limit = None
    if device.type == 'cuda':
        limit = profile({'floor': fns['floor']}, eager_b[:10], device)['floor'][1]
    return out, setup_s, limit, common, len(order), model, fns, eager_b


def profile(fns, batches, device):
    """Where a step's time goes: CPU time of all ops (launching kernels included) and GPU kernel
    time, per step, under torch.profiler (which slows the CPU side)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == 'cuda' else [])
    out = {}
    for name, fn in fns.items():
        with profile(activities=activities) as prof:
            for b in batches:
                fn(b)
            sync(device)
        events = prof.key_averages()
        cpu = sum(e.self_cpu_time_total for e in events) / len(batches) / 1000
        gpu = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CPU) / len(batches) / 1000
        print(f'profile {name:<7} CPU {cpu:7.2f} ms/step   GPU kernels {gpu:7.2f} ms/step')
        out[name] = (cpu, gpu)
    return out


def eval_throughput(model, args, device, rng, graphs):
    """documents/s of lhmix.score_documents over WOS-like lengths (every bucket), eager and replayed
    from CUDA graphs, each after a first pass (which captures the graphs: its time is reported)."""
    def speed(scorer):  # (documents/s of the second pass, seconds of the first)
        seconds = []
        for _ in range(2):
            t0 = time.perf_counter()
            lhmix.score_documents(model, docs, scorer=scorer)
            sync(device)
            seconds.append(time.perf_counter() - t0)
        return len(docs) / seconds[1], seconds[0]
    docs = documents(args.eval_docs, args.lengths, SIZES[args.size]['vocab_size'], model.text_budget(512), rng)
    out = {'eager': speed(None)}
    if graphs:
        scorer = train.CUDAGraphs(model.label_scores)
        out['graphed'] = speed(scorer)
        out['graphs'] = len(scorer.graphs)
    return out


def epoch_run(args, device, graphs):
    """Training epochs (LH-Mix, MLM on) each with its dev evaluation at WOS's size, through train.py's
    own train_epoch (lhmix.train_batches, make_batch, train.make_step, lhmix.score_documents). With
    `graphs`, two epochs: the first captures the graphs, the second replays them (and any new shape)."""
    rng = np.random.default_rng(5)
    model = make_model(args.size, 'prompt', device)
    n_train, n_dev = max(32, int(30070 * args.epoch_scale)), max(16, int(7518 * args.epoch_scale))
    vocab, max_text = SIZES[args.size]['vocab_size'], model.text_budget(512)
    tokens = {'train': documents(n_train, args.lengths, vocab, max_text, rng),
              'dev': documents(n_dev, args.lengths, vocab, max_text, rng)}
    labels, dev_gold = random_labels(n_train, rng), random_labels(n_dev, rng)
    table, rows = random_table(model, n_train, rng)
    targs = argparse.Namespace(**{**train.PAPER, 'warmup_epochs': 0, 'no_mlm': False})
    step = trainer(model, graphs)
    run = argparse.Namespace(args=targs, device=device, hierarchy=model.hierarchy, model=model, tokens=tokens,
                             labels=labels, dev_gold=dev_gold, table=table, rows=rows, graphs=graphs, step=step,
                             score_graphs=train.CUDAGraphs(model.label_scores) if graphs else None)
    times, counts = [], []
    for epoch in range(2 if graphs else 1):
        t0 = time.perf_counter()
        line = train.train_epoch(run, epoch, tqdm(disable=True))  # no progress bar
        total = time.perf_counter() - t0
        times.append((total, line['seconds'], total - line['seconds']))
        counts.append((len(step.graphs), len(run.score_graphs.graphs)) if graphs else None)
    return n_train, n_dev, times, counts


def plain_zmlce(scores, targets):
    """The authors' formula: flip signs, mask with 1e12, concatenate a 0 logit, logsumexp twice."""
    y = targets.to(scores.dtype)
    s = (1 - 2 * y) * scores
    s_neg, s_pos = s - y * 1e12, s - (1 - y) * 1e12
    zeros = torch.zeros_like(s[..., :1])
    return torch.logsumexp(torch.cat([s_neg, zeros], -1), -1) + torch.logsumexp(torch.cat([s_pos, zeros], -1), -1)


def zmlce_bench(device, shapes, rounds):
    rows = []
    for n, L in shapes:
        g = torch.Generator(device='cpu').manual_seed(n + L)
        scores = (3 * torch.randn(n, L, generator=g)).to(device).requires_grad_()
        targets = (torch.rand(n, L, generator=g) < 0.05).to(device)

        def fwd_bwd(loss_fn):
            def once(_):
                loss_fn(scores, targets).sum().backward()
                scores.grad = None
            return once

        base = torch.cuda.memory_allocated() / 2 ** 30 if device.type == 'cuda' else 0.0
        res = compare({'fused': fwd_bwd(lhmix.zmlce), 'plain': fwd_bwd(plain_zmlce)}, [None] * 20, device, rounds)
        res = {k: (ms, (peak - base) * 1024) for k, (ms, peak) in res.items()}  # MiB above the inputs
        diff = (lhmix.zmlce(scores, targets) - plain_zmlce(scores, targets)).abs().max().item()
        rows.append(((n, L), res, diff))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--size', default='base', choices=list(SIZES))
    p.add_argument('--lengths', default='wos', choices=list(LENGTHS))
    p.add_argument('--batch', type=int, default=16)
    p.add_argument('--steps', type=int, default=30, help='distinct batches per timed pass')
    p.add_argument('--rounds', type=int, default=9, help='timed passes of each step, interleaved (the median is reported)')
    p.add_argument('--profile', action='store_true', help='also profile 10 steps of each (CPU and GPU time)')
    p.add_argument('--eval-docs', type=int, default=4096)
    p.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    p.add_argument('--graphs', choices=['auto', 'on', 'off'], default='auto',
                   help='also time the steps and evaluation replayed from CUDA graphs (auto: when the device can)')
    p.add_argument('--compile', choices=['auto', 'on', 'off'], default='auto',
                   help="also time the floor through torch.compile, for reference (auto: on for CUDA)")
    p.add_argument('--epoch', action='store_true',
                   help="instead: training epochs + dev evaluation at WOS's size through train.py, eager and graphed")
    p.add_argument('--epoch-scale', type=float, default=1.0, help='--epoch with this share of the documents')
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == 'cpu':
        args.eval_docs = min(args.eval_docs, 64)
    name = torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'
    import transformers
    print(f'device: {name}; torch {torch.__version__}, transformers {transformers.__version__}; '
          f'size {args.size}, lengths {args.lengths}, batch {args.batch}, {args.steps} steps x {args.rounds} rounds')
    why_not = train.cuda_graphs_unavailable(device)
    graphs = args.graphs == 'on' or (args.graphs == 'auto' and why_not is None)
    compiled = graphs and (args.compile == 'on' or (args.compile == 'auto' and device.type == 'cuda'))
    if not graphs:
        print(f'CUDA graphs: not run ({why_not or "--graphs off"})')
    if args.epoch:
        for g in ([False, True] if graphs else [False]):
            n_train, n_dev, times, counts = epoch_run(args, device, g)
            for e, (total, tr, ev) in enumerate(times):
                print(f"epoch {'graphed' if g else 'eager  '} #{e}: {n_train} train + {n_dev} dev documents: "
                      f"{total:.1f} s ({tr:.1f} s training, {tr / -(-n_train // args.batch) * 1000:.2f} ms/step; "
                      f"{ev:.1f} s dev evaluation)"
                      + (f'; graphs so far: {counts[e][0]} training, {counts[e][1]} evaluation' if g else ''))
            if g:
                print(f'capture time (epoch #0 - epoch #1): {times[0][0] - times[1][0]:.1f} s = '
                      f'{100 * (times[0][0] - times[1][0]) / times[1][0]:.1f}% of a graphed epoch')
        return
    rng = np.random.default_rng(0)
    steps, setup_s, limit, common, n, model, fns, batches = train_steps(args, device, rng, graphs, compiled)
    pad = padding(batches)
    print(f'timed batches: {n} of {args.batch} documents, all of sequence length {common} (the commonest bucket; '
          f'one graph each), {pad:.1f}% padding')
    if limit is None:
        limit, what = steps['floor'][0], 'the eager floor (no GPU: no kernel-time limit)'
    else:
        what = "the eager floor's GPU-kernel time (profiled)"
    print(f'limit: {limit:.2f} ms/step = {what}')
    print(f"{'training step':<40} {'ms/step':>9} {'x limit':>8}")
    labels = {'floor': 'floor (encoder fwd+bwd+Adam)', 'prompt': 'Prompt step (--mix none)', 'lhmix': 'LH-Mix step'}
    ways = {'': 'eager', '_graphed': 'CUDA graphs', '_compiled': 'torch.compile'}
    for k in ('floor', 'prompt', 'lhmix'):
        for suffix, way in ways.items():
            if k + suffix in steps:
                ms = steps[k + suffix][0]
                print(f'{labels[k] + ", " + way:<40} {ms:9.2f} {ms / limit:8.3f}')
    if setup_s:
        print('first call (capture or compile of one graph): ' + ', '.join(f'{k} {v:.2f} s' for k, v in setup_s.items()))
    for suffix, way in list(ways.items())[:2]:
        if 'lhmix' + suffix in steps:
            print(f"LH-Mix / Prompt ({way}): {steps['lhmix' + suffix][0] / steps['prompt' + suffix][0]:.3f}")
    if args.profile:
        profile(fns, batches[:10], device)
    del fns, batches
    way = 'CUDA graphs' if graphs else 'eager'
    cost = pairing_cost(args, model, trainer(model, graphs), device, rng)
    for k, (pct, ms) in cost.items():
        print(f'LH-Mix step, {way}, {k + " batches":<18} (all buckets, {args.steps} steps): {pct:5.1f}% padding, '
              f'{ms:8.2f} ms/step')
    ev = eval_throughput(model, args, device, rng, graphs)
    print(f"evaluation eager, {args.eval_docs} documents of {args.lengths}-like lengths: {ev['eager'][0]:.0f} documents/s")
    if 'graphed' in ev:
        print(f"evaluation CUDA graphs, same documents: {ev['graphed'][0]:.0f} documents/s "
              f"(first pass, {ev['graphs']} graphs captured: {ev['graphed'][1]:.1f} s)")
    del model
    shapes = [(16 * 2, 141), (16 * 8, 166), (4096, 4096)] if device.type == 'cuda' else [(16 * 2, 141), (16 * 8, 166)]
    print(f"{'ZMLCE fwd+bwd (rows, labels)':<30} {'fused ms':>9} {'plain ms':>9} {'speedup':>8} "
          f"{'fused MiB':>10} {'plain MiB':>10} {'max |diff|':>11}")
    for shape, res, diff in zmlce_bench(device, shapes, args.rounds):
        (fm, fp), (pm, pp) = res['fused'], res['plain']
        print(f'{str(shape):<30} {fm:9.3f} {pm:9.3f} {pm / fm:8.2f} {fp:10.1f} {pp:10.1f} {diff:11.2e}')


if __name__ == '__main__':
    main()
