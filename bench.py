"""Speed of LH-Mix against the bare encoder it sits on, in one run on one device.

    python bench.py                      # bert-base sizes (random weights), WOS-like lengths, GPU
    python bench.py --size tiny --lengths short --steps 3    # a CPU smoke test

Measures, on the same batches (same lengths, bucketed as train.py buckets them):
  1. the floor: the encoder's forward + backward + Adam step in the same precision, nothing else;
  2. a Prompt training step (--mix none); 3. an LH-Mix training step (cached similarity, Mixup);
  4. evaluation throughput (documents/s); 5. the fused ZMLCE autograd Function against the plain
     formula (1e12-masked concatenate-and-logsumexp): forward + backward time and peak memory.
Speed does not depend on the weights, so models are built from a config with random weights.
"""
import argparse
import time

import numpy as np
import torch

import lhmix

SIZES = {'base': dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                      vocab_size=30522),
         'tiny': dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
                      vocab_size=1000)}
LENGTHS = {'wos': (284, 100), 'nyt': (600, 250), 'short': (100, 60)}  # word-pieces: mean, sd (cut to 512)
SPECIAL = {'pad': 0, 'cls': 101, 'sep': 102, 'mask': 103}


def wos_like_hierarchy():
    """7 domains with 134 areas between them: WOS's shape (141 labels, depth 2)."""
    parents = {f'd{i}': None for i in range(7)}
    parents.update({f'a{j}': f'd{j % 7}' for j in range(134)})
    return lhmix.Hierarchy(parents)


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
    once), then the fns are timed in turn, `rounds` times, so that drifts hit them all alike."""
    def sync():
        if device.type == 'cuda':
            torch.cuda.synchronize()
    for fn in fns.values():
        for b in batches:
            fn(b)
    sync()
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
            sync()
            times[k].append((time.perf_counter() - t0) / len(batches) * 1000)
            peak[k] = torch.cuda.max_memory_allocated() / 2 ** 30 if device.type == 'cuda' else float('nan')
    if device.type == 'cuda':
        torch.cuda.set_sync_debug_mode('default')
    return {k: (float(np.median(times[k])), peak[k]) for k in fns}


def train_steps(args, device, rng):
    """ms per step and peak GiB of the floor, Prompt and LH-Mix steps on identical batches."""
    model = make_model(args.size, 'prompt', device)
    max_text = model.text_budget(512)
    docs = documents(args.batch * args.steps, args.lengths, SIZES[args.size]['vocab_size'], max_text, rng)
    labels = [[int(rng.integers(7)), 7 + int(rng.integers(134))] for _ in docs]
    table = torch.randn(64, model.mlm.config.hidden_size)  # cached local hierarchies (on the CPU, as in train.py)
    rows = torch.from_numpy(rng.integers(0, 64, len(docs)))
    multiple = lhmix.pad_multiple(device)
    order = lhmix.train_batches([len(d) for d in docs], args.batch, rng, paired=True)
    batches = [lhmix.make_batch(model, [docs[i] for i in idx], [labels[i] for i in idx], multiple, rng, 0.15)
               for idx, _ in order]
    hier = [(table[rows[idx]], partner) for idx, partner in order]
    fused = device.type == 'cuda'
    encoder = model.mlm.base_model
    floor_opt = torch.optim.Adam(encoder.parameters(), lr=1e-5, fused=fused)
    opt = torch.optim.Adam(model.parameters(), lr=1e-5, fused=fused)

    def floor(item):
        b = lhmix.to_device({k: item[0][k] for k in ('input_ids', 'attention_mask')}, device)
        with lhmix.autocast(device):
            h = encoder(input_ids=b['input_ids'], attention_mask=b['attention_mask']).last_hidden_state
        h.float().square().mean().backward()
        floor_opt.step()
        floor_opt.zero_grad(set_to_none=True)

    def step(mix):
        def run(item):
            b, (h, partner) = item
            if mix != 'none':  # as train.py: ratios made on the CPU, copied with the batch
                b = dict(b, partner=partner)
                b['lam'] = lhmix.pair_ratios(mix, partner, h)
            b = lhmix.to_device(b, device)
            with lhmix.autocast(device):
                loss = model(**b)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return run

    fns = {'floor': floor, 'prompt': step('none'), 'lhmix': step('lhmix')}
    batches = list(zip(batches, hier))
    out = compare(fns, batches, device, args.rounds)
    tokens = sum(int(b['attention_mask'].sum()) for b, _ in batches) / len(batches)
    padded = sum(b['input_ids'].numel() for b, _ in batches) / len(batches)
    return out, tokens, padded, model, fns, batches


def profile(fns, batches, device):
    """Where a step's time goes: CPU time of all ops (launching kernels included) and GPU kernel
    time, per step, under torch.profiler (which slows the CPU side)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == 'cuda' else [])
    for name, fn in fns.items():
        with profile(activities=activities) as prof:
            for b in batches:
                fn(b)
            if device.type == 'cuda':
                torch.cuda.synchronize()
        events = prof.key_averages()
        cpu = sum(e.self_cpu_time_total for e in events) / len(batches) / 1000
        gpu = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CPU) / len(batches) / 1000
        print(f'profile {name:<7} CPU {cpu:7.2f} ms/step   GPU kernels {gpu:7.2f} ms/step')


def eval_throughput(model, args, device, rng):
    docs = documents(args.eval_docs, args.lengths, SIZES[args.size]['vocab_size'], model.text_budget(512), rng)
    lhmix.score_documents(model, docs)  # warm-up: every bucket once
    if device.type == 'cuda':
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    lhmix.score_documents(model, docs)
    return len(docs) / (time.perf_counter() - t0)


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
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == 'cpu':
        args.eval_docs = min(args.eval_docs, 64)
    name = torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'
    import transformers
    print(f'device: {name}; torch {torch.__version__}, transformers {transformers.__version__}; '
          f'size {args.size}, lengths {args.lengths}, batch {args.batch}, {args.steps} steps x {args.rounds} rounds')
    rng = np.random.default_rng(0)
    steps, tokens, padded, model, fns, batches = train_steps(args, device, rng)
    print(f'mean tokens per batch {tokens:.0f} real, {padded:.0f} padded ({100 * (padded / tokens - 1):.1f}% padding)')
    floor = steps['floor'][0]
    print(f"{'training step':<34} {'ms/step':>9} {'x floor':>8} {'peak GiB':>9}  (peak: weights, both Adam states, activations)")
    labels = {'floor': 'floor (encoder fwd+bwd+Adam)', 'prompt': 'Prompt step (--mix none)', 'lhmix': 'LH-Mix step'}
    for k, (ms, peak) in steps.items():
        print(f'{labels[k]:<34} {ms:9.2f} {ms / floor:8.3f} {peak:9.2f}')
    print(f"LH-Mix / Prompt: {steps['lhmix'][0] / steps['prompt'][0]:.3f}")
    if args.profile:
        profile(fns, batches[:10], device)
    del fns, batches
    print(f'evaluation: {eval_throughput(model, args, device, rng):.0f} documents/s')
    del model
    shapes = [(16 * 2, 141), (16 * 8, 166), (4096, 4096)] if device.type == 'cuda' else [(16 * 2, 141), (16 * 8, 166)]
    print(f"{'ZMLCE fwd+bwd (rows, labels)':<30} {'fused ms':>9} {'plain ms':>9} {'speedup':>8} "
          f"{'fused MiB':>10} {'plain MiB':>10} {'max |diff|':>11}")
    for shape, res, diff in zmlce_bench(device, shapes, args.rounds):
        (fm, fp), (pm, pp) = res['fused'], res['plain']
        print(f'{str(shape):<30} {fm:9.3f} {pm:9.3f} {pm / fm:8.2f} {fp:10.1f} {pp:10.1f} {diff:11.2e}')


if __name__ == '__main__':
    main()
