"""Train LH-Mix (or one of the paper's ablations) and test the best-dev checkpoint.

    python train.py --data demo                      # synthetic data + tiny BERT, about a minute on a CPU
    python train.py --data wos --data-dir data/wos   # the paper's setting (bert-base-uncased)

Writes OUT/metrics.jsonl (a line per epoch), OUT/best/ and OUT/last/ (safetensors + JSON, written
atomically) and OUT/test_metrics.json, and prints the test figures of the best-dev checkpoint.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
from tqdm import tqdm

import lhmix

# defaults that depend on the data set; every other default is in parse() below
DEFAULTS = dict(model='bert-base-uncased', epochs=100, warmup_epochs=5, lr=3e-5, max_length=512)
DEMO_DEFAULTS = dict(model='tiny', epochs=12, warmup_epochs=4, lr=1e-3, max_length=128)
MLM_RATE = 0.15  # HPT's auxiliary MLM loss masks 15% of the text word-pieces


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--data', required=True, help='wos | nyt | rcv1 | demo | PATH to a HiAGM-format folder')
    p.add_argument('--data-dir', help='where the data set lies (default data/wos, data/nyt, data/rcv1)')
    p.add_argument('--model', help=f"HF id or local folder, or 'tiny' (default {DEFAULTS['model']}; "
                                   f"demo: {DEMO_DEFAULTS['model']})")
    p.add_argument('--arch', default='prompt', choices=['prompt', 'bert'],
                   help='hierarchical prompt (the paper) or the flat [CLS] ablation')
    p.add_argument('--mix', default='lhmix', choices=['none', 'mixup', 'lhmix'],
                   help='no Mixup, vanilla Mixup (Beta ratio) or LH-Mix (hierarchy-similarity ratio)')
    p.add_argument('--alpha', type=float, default=1.0, help='alpha of Eq. 4 (> 0)')
    p.add_argument('--beta', type=float, default=0.75, help='beta of Eq. 4, in (0.5, 1]')
    p.add_argument('--mix-alpha', type=float, default=1.0, help='a of Beta(a, a) for vanilla Mixup')
    p.add_argument('--warmup-epochs', type=int, help='epochs without Mixup first (default 5; demo 4)')
    p.add_argument('--epochs', type=int, help='at most this many epochs (default 100; demo 12)')
    p.add_argument('--early-stop', type=int, default=5, help='patience in epochs on dev macro-F1')
    p.add_argument('--batch', type=int, default=16)
    p.add_argument('--lr', type=float, help='Adam learning rate (default 3e-5; demo 1e-3)')
    p.add_argument('--max-length', type=int, help='tokens per input, template included (default 512; demo 128)')
    p.add_argument('--no-mlm', action='store_true', help="drop HPT's auxiliary MLM loss (prompt arch)")
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--train-fraction', type=float, default=1.0, help='train on this seeded share (Fig. 3)')
    p.add_argument('--out', help='output folder (default out/DATA-ARCH-MIX-sSEED)')
    p.add_argument('--resume', action='store_true', help='continue from OUT/last after a crash')
    p.add_argument('--device', help='cuda or cpu (default: cuda when there is one)')
    args = p.parse_args(argv)
    for k, v in (DEMO_DEFAULTS if args.data == 'demo' else DEFAULTS).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.alpha <= 0:
        p.error(f'--alpha must be > 0, got {args.alpha}')
    if not 0.5 < args.beta <= 1:
        p.error(f'--beta must lie in (0.5, 1], got {args.beta}')
    if args.mix_alpha <= 0:
        p.error(f'--mix-alpha must be > 0, got {args.mix_alpha}')
    if not 0 < args.train_fraction <= 1:
        p.error(f'--train-fraction must lie in (0, 1], got {args.train_fraction}')
    if args.device is None:
        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if args.device.startswith('cuda') and not torch.cuda.is_available():
        p.error(f'--device {args.device}: no CUDA GPU is available here')
    args.out = args.out or os.path.join('out', f'{os.path.basename(args.data.rstrip("/"))}-{args.arch}-{args.mix}-s{args.seed}')
    return args


def main(argv=None):
    args = parse(argv)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    last = os.path.join(args.out, 'last')
    if args.resume:  # the run continues as it was started; only --epochs and --device may change
        if not os.path.exists(os.path.join(last, 'lhmix.json')):
            sys.exit(f'error: --resume: no checkpoint at {last}')
        with open(os.path.join(last, 'lhmix.json')) as f:
            saved_args = json.load(f)['args']
        vars(args).update({k: v for k, v in saved_args.items() if k not in ('epochs', 'device', 'out', 'resume')})
    try:  # everything a user can get wrong is checked before anything is written
        hierarchy, splits = lhmix.load_data(args.data, args.data_dir)
        train = splits['train']
        if args.train_fraction < 1:
            keep = np.random.default_rng(args.seed).permutation(len(train))[:math.ceil(args.train_fraction * len(train))]
            train = [train[i] for i in sorted(keep)]
        if args.resume:
            model, tokenizer, meta = lhmix.load_checkpoint(last, hierarchy=hierarchy)
        else:
            model, tokenizer = lhmix.build_model(args.model, hierarchy, args.arch, [t for t, _ in train])
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f'error: {e}')
    model.to(device)
    max_text = model.text_budget(args.max_length)
    if not 0 < max_text <= model.text_budget(model.mlm.config.max_position_embeddings):
        sys.exit(f'error: --max-length {args.max_length} leaves {max_text} text tokens for this model')
    tokens, cut = {}, {}
    for name, docs in (('train', train), ('dev', splits['dev']), ('test', splits['test'])):
        tokens[name], cut[name] = lhmix.tokenize(tokenizer, [t for t, _ in docs], max_text)
    print(f'{len(hierarchy)} labels, depth {hierarchy.num_depths}; documents '
          + ', '.join(f'{k} {len(v)}' for k, v in tokens.items()) + f'; truncated to --max-length {args.max_length}: '
          + ', '.join(f'{k} {cut[k]}/{len(tokens[k])}' for k in tokens))
    labels = [ls for _, ls in train]
    dev_gold, test_gold = [ls for _, ls in splits['dev']], [ls for _, ls in splits['test']]

    opt = torch.optim.Adam(model.parameters(), lr=args.lr, fused=device.type == 'cuda')
    fp16 = device.type == 'cuda' and not torch.cuda.is_bf16_supported()
    scaler = torch.amp.GradScaler(device.type, enabled=fp16)
    state = {'epoch': 0, 'best': -1.0, 'bad_epochs': 0}
    table = rows = None
    if args.resume:
        saved = torch.load(os.path.join(last, 'train_state.pt'), map_location='cpu', weights_only=True)
        opt.load_state_dict(saved['optimizer'])
        scaler.load_state_dict(saved['scaler'])
        table, rows = saved.get('table'), saved.get('rows')
        state = meta['state']
    elif args.mix == 'lhmix':  # the initial encoder, frozen: encode every local hierarchy once
        table, rows = lhmix.local_hierarchy_table(model, tokenizer, labels)
        print(f'{len(table)} distinct local hierarchies encoded')
    os.makedirs(args.out, exist_ok=True)
    metrics_path = os.path.join(args.out, 'metrics.jsonl')
    history = []
    if args.resume and os.path.exists(metrics_path):
        with open(metrics_path) as f:
            history = [json.loads(line) for line in f if line.strip()]
        history = [h for h in history if h['epoch'] < state['epoch']]
    info = {'args': vars(args)}
    multiple = lhmix.pad_multiple(device)
    mlm_rate = 0.0 if args.no_mlm or args.arch == 'bert' else MLM_RATE

    for epoch in range(state['epoch'], args.epochs):
        if state['bad_epochs'] >= args.early_stop:
            print(f'early stop: dev macro-F1 has not improved for {args.early_stop} epochs')
            break
        rng = np.random.default_rng([args.seed, epoch])  # per-epoch streams make --resume repeatable
        torch.manual_seed(args.seed * 100003 + epoch)
        mixing = args.mix != 'none' and epoch >= args.warmup_epochs
        model.train()
        t0, total = time.time(), torch.zeros((), device=device)
        order = lhmix.train_order([len(t) for t in tokens['train']], args.batch, rng)
        for idx in tqdm(order, desc=f'epoch {epoch}' + (f' ({args.mix})' if mixing else ''), leave=False):
            batch = lhmix.make_batch(model, [tokens['train'][i] for i in idx], [labels[i] for i in idx],
                                     multiple, rng, mlm_rate)
            if mixing:  # partners and ratios ride with the batch to the GPU
                hier = table[rows[idx]] if args.mix == 'lhmix' else None  # cached local hierarchies
                batch['perm'], batch['lam'] = lhmix.pair_and_ratio(args.mix, len(idx), hier, args.alpha,
                                                                   args.beta, args.mix_alpha)
            batch = lhmix.to_device(batch, device)
            with lhmix.autocast(device):
                loss = model(**batch)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            total += loss.detach()  # summed on the device: no host sync inside the loop
        seconds = time.time() - t0
        dev = lhmix.f1_scores(lhmix.predict(model, tokens['dev']), dev_gold, len(hierarchy))
        line = {'epoch': epoch, 'mix': mixing, 'train_loss': total.item() / len(order),
                'dev_micro_f1': dev['micro_f1'], 'dev_macro_f1': dev['macro_f1'],
                'seconds': round(seconds, 2), 'samples_per_s': round(len(tokens['train']) / seconds, 1)}
        history.append(line)
        print(json.dumps(line))
        if dev['macro_f1'] > state['best']:
            state['best'], state['bad_epochs'] = dev['macro_f1'], 0
            lhmix.save_checkpoint(os.path.join(args.out, 'best'), model, tokenizer, {**info, 'epoch': epoch, 'dev': line})
        else:
            state['bad_epochs'] += 1
        # metrics first: a crash before `last` is written re-runs this epoch and drops its old line
        with open(metrics_path + '.tmp', 'w') as f:
            f.writelines(json.dumps(h) + '\n' for h in history)
        os.replace(metrics_path + '.tmp', metrics_path)
        state['epoch'] = epoch + 1
        extra = {'optimizer': opt.state_dict(), 'scaler': scaler.state_dict()}
        if table is not None:
            extra.update(table=table, rows=rows)
        lhmix.save_checkpoint(last, model, tokenizer, {**info, 'state': state}, extra)

    best, _, meta = lhmix.load_checkpoint(os.path.join(args.out, 'best'), device)
    result = lhmix.report(lhmix.predict(best, tokens['test']), test_gold, hierarchy, [ls for _, ls in splits['train']])
    result.update(best_epoch=meta['epoch'], checkpoint=os.path.join(args.out, 'best'))
    with open(os.path.join(args.out, 'test_metrics.json'), 'w') as f:
        json.dump(result, f, indent=1)
    print(f"test micro-F1 {100 * result['micro_f1']:.2f}  macro-F1 {100 * result['macro_f1']:.2f}  "
          f"(best dev epoch {meta['epoch']}, {args.out})")


if __name__ == '__main__':
    main()
