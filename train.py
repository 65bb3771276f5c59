"""Train LH-Mix (or an ablation), then test the best-dev checkpoint.

    python train.py --data demo      # synthetic data and a tiny BERT: about a minute on a CPU
    python train.py --data wos       # bert-base-uncased on WOS, as the paper (downloads WOS)

The run folder (--out) gets metrics.jsonl (a line an epoch), the checkpoints best/ and last/
(loadable after a kill at any instant: --resume continues), test_metrics.json.
"""
import argparse
import json
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

import data
import evaluate
import lhmix
import runs

DEMO = dict(model='tiny', epochs=12, warmup_epochs=4, lr=1e-3, max_length=128)  # --data demo
MLM_RATE = 0.15  # HPT's MLM loss masks 15% of the text word-pieces
CONTROL = ('out', 'device', 'resume', 'overwrite', 'no_cuda_graphs')  # not part of a run


def within(cast, interval):
    """An argparse type: a finite number in `interval`, such as '(0, 1]' (-h shows it)."""
    lo, hi = (float(x) for x in interval[1:-1].split(','))

    def number(text):
        x = cast(text)
        if not (math.isfinite(x) and (lo <= x if interval[0] == '[' else lo < x)
                and (x <= hi if interval[-1] == ']' else x < hi)):
            raise argparse.ArgumentTypeError(f'must be in {interval}, got {text}')
        return x
    number.__name__, number.interval = cast.__name__, interval  # "invalid int value: 'x'"
    return number


def parse(argv=None):
    """(the arguments, those given on the command line)."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)

    def add(*flag, **kw):
        interval = getattr(kw.get('type'), 'interval', '')
        kw['help'] += f', in {interval}' * bool(interval)
        p.add_argument(*flag, **kw)
    add('--data', required=True, help='wos, nyt, rcv1, a folder, or demo: synthetic, with '
        + ', '.join(f"--{k.replace('_', '-')} {v}" for k, v in DEMO.items()))
    add('--data-dir', help='the folder of wos, nyt or rcv1 (default: data/NAME)')
    add('--model', default='bert-base-uncased', help='a BERT-style masked LM, hub id or folder; '
        "tiny: a 2-layer BERT built from the data (default: the paper's %(default)s, Sec. 5.2)")
    add('--arch', default='prompt', choices=['prompt', 'bert'], help="the paper's prompt, or Table "
        "3's flat BERT: HGCLR's head (linear on [CLS]) and loss (BCE), trained with the settings "
        "below, not HGCLR's (default: %(default)s)")
    add('--mix', default='lhmix', choices=['lhmix', 'mixup', 'none'],
        help='Table 3 (default: %(default)s)')
    add('--lr', type=within(float, '(0, inf)'), default=3e-5,
        help="Adam's learning rate (default: the paper's %(default)s)")
    add('--warmup-epochs', type=within(int, '[0, inf)'), default=5,
        help="first, without Mixup (default: the paper's %(default)s)")
    add('--early-stop', type=within(int, '[1, inf)'), default=5, help='after so many epochs '
        "without a better dev macro-F1 (default: the paper's %(default)s)")
    add('--epochs', type=within(int, '[1, inf)'), default=100,
        help='at most (default: %(default)s, ours; runs stop early before it)')
    add('--alpha', type=within(float, '(0, inf)'), default=1.0,
        help="Eq. 4 (default: %(default)s, the authors' README command for RCV1)")
    add('--beta', type=within(float, '[0.5, 1]'), default=0.75,
        help='Eq. 4; 0.5 mixes every pair at 0.5 (default: %(default)s, as --alpha)')
    add('--mix-alpha', type=within(float, '(0, inf)'), default=1.0, help="vanilla Mixup's "
        "Beta(a, a), drawn per document (default: %(default)s, Zhang et al.'s, drawn per batch)")
    add('--batch', type=within(int, '[1, inf)'), default=16,
        help="documents a step (default: HPT's %(default)s)")
    add('--max-length', type=within(int, '[1, inf)'), default=512,
        help="tokens an input (default: HPT's %(default)s)")
    add('--no-mlm', action='store_true', help="without HPT's MLM loss (the authors' code has it)")
    add('--train-fraction', type=within(float, '(0, 1]'), default=1.0,
        help='a random part of the training split (Fig. 4; default: %(default)s)')
    add('--seed', type=within(int, '[0, 4294967295]'), default=0, help='(default: %(default)s)')
    add('--out', help='the run folder (default: out/DATA-ARCH-MIX-sSEED)')
    add('--device', type=evaluate.device, default='cuda' if torch.cuda.is_available() else 'cpu',
        help='cpu, cuda or cuda:N (default: cuda if there is one)')
    add('--resume', action='store_true',
        help="continue --out's run, its settings kept (a given --epochs extends it)")
    add('--overwrite', action='store_true',
        help="replace the run in --out (its files go when this one's first epoch is saved)")
    add('--no-cuda-graphs', action='store_true', help='run the GPU steps eagerly')
    args = p.parse_args(argv)
    if args.data == 'demo':
        p.set_defaults(**DEMO)
        args = p.parse_args(argv)
    if args.resume and args.overwrite:
        p.error('--resume and --overwrite exclude each other')
    p.set_defaults(**dict.fromkeys(vars(args)))  # None: not on the command line
    given = {k: v for k, v in vars(p.parse_args(argv)).items() if v is not None}
    args.out = os.path.normpath(args.out or os.path.join('out', '-'.join((
        os.path.basename(os.path.normpath(args.data)), args.arch, args.mix, f's{args.seed}'))))
    return args, given


# Prepare: a new run, or the run in --out

@dataclass
class Run:
    args: argparse.Namespace
    folder: runs.RunFolder
    model: lhmix.LHMix
    tokenizer: object
    meta: dict          # settings and data digest, in every checkpoint
    tokens: dict        # {split: each document's word-pieces}
    gold: dict          # {split: each document's label ids}
    train_labels: list  # the whole training split's, for Fig. 7
    history: list = field(default_factory=list)  # metrics.jsonl's lines
    extra: dict = field(default_factory=dict)    # last/'s other tensors
    adam: dict = field(default_factory=dict)     # Adam's state_dict()['state']


def prepare(args, given, folder):
    """--resume: the run's own settings but a given --epochs; a differing given one is said."""
    state = {}
    if args.resume:
        model, tokenizer, last = folder.load_last()
        saved, state = last['args'], {k: last[k] for k in ('history', 'extra', 'adam')}
        for k, v in given.items():
            if k in saved and k != 'epochs' and v != saved[k]:
                print(f'--resume: the run keeps its saved --{k.replace("_", "-")} {saved[k]} '
                      f'(not {v})', file=sys.stderr)
        args = argparse.Namespace(**{**vars(args), **saved,
                                     'epochs': given.get('epochs', saved['epochs'])})
    torch.manual_seed(args.seed)
    hierarchy, splits = data.load_data(args.data, args.data_dir)
    used = dict(splits)  # --train-fraction of the training documents
    if args.train_fraction < 1:
        keep = np.random.default_rng(args.seed).permutation(len(splits['train']))
        used['train'] = [splits['train'][i] for i in
                         sorted(keep[:math.ceil(args.train_fraction * len(keep))])]
    meta = {'args': {k: v for k, v in vars(args).items() if k not in CONTROL},
            'data': runs.digest(hierarchy, used)}
    if args.resume:
        if last['data'] != meta['data']:
            raise ValueError(f'--resume: the labels or documents of --data {args.data} differ '
                             "from the run's; start a new run")
    else:
        mlm, tokenizer = (data.tiny_bert([t for t, _ in used['train']] + hierarchy.names)
                          if args.model == 'tiny' else data.load_pretrained(args.model))
        model = lhmix.build_model(mlm, tokenizer, hierarchy, args.arch, args.max_length)
        state['extra'] = {'labels_at_init': model.label_embeddings().detach().clone()}
    budget = model.text_budget(args.max_length)
    tokens = {k: lhmix.tokenize(tokenizer, [t for t, _ in d], budget) for k, d in used.items()}
    print(f'{len(hierarchy)} labels, depth {hierarchy.num_depths}; documents '
          + ', '.join(f'{k} {len(v[0])}' for k, v in tokens.items()) + f'; cut to --max-length '
          f'{args.max_length}: ' + ', '.join(f'{k} {v[1]}' for k, v in tokens.items()))
    return Run(args, folder, model.to(args.device), tokenizer, meta,
               {k: v[0] for k, v in tokens.items()},
               {k: [ls for _, ls in docs] for k, docs in used.items()},
               [ls for _, ls in splits['train']], **state)


# One step: forward, backward, Adam; on GPUs replayed from a CUDA graph

def make_step(model, lr, graphs, adam=None):
    """(step, Adam): step(**batch) -> (loss, lambda or None), no host sync: forward, backward,
    Adam (from its state `adam`); as CUDA graphs with `graphs`."""
    device = next(model.parameters()).device
    opt = torch.optim.Adam(model.parameters(), lr=lr, fused=device.type == 'cuda',
                           capturable=graphs)
    opt.load_state_dict({'state': adam or {}, 'param_groups': opt.state_dict()['param_groups']})
    # fp16 (GPUs without bf16; no graphs) needs loss scaling; the scale restarts at --resume
    scaler = torch.amp.GradScaler(enabled=device.type == 'cuda'
                                  and not torch.cuda.is_bf16_supported())

    def forward_backward(**batch):
        with lhmix.autocast(device):
            loss, lam = model(**batch)
        scaler.scale(loss).backward()
        return loss.detach(), lam

    params = [p for g in opt.param_groups for p in g['params']]
    for p in params:  # the gradients stay allocated (a graph's memory), zeroed in the step
        p.grad = torch.zeros_like(p)

    def step(**batch):
        torch._foreach_zero_([p.grad for p in params])
        out = forward_backward(**batch)
        scaler.step(opt)  # opt.step() when the scaler is off, as it is with graphs
        scaler.update()
        return out

    if not graphs:
        return step, opt
    # Adam's state made outside the graph by a step on zero gradients (no weight moves), its
    # count undone; the warning says the step is not captured
    if any(not opt.state[p] for p in params):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            opt.step()
        for p in params:
            opt.state[p]['step'].zero_()
    return lhmix.CUDAGraphs(step, warmup=forward_backward), opt


# One epoch, the epochs (fit), the test

def train_epoch(run, step, epoch, bar):
    """An epoch's (mean loss, lambdas or None). Mixing batches are random: graphed steps pack
    them in one row, eager ones pad them (nested tensors' Python dispatch costs more)."""
    args, model, tokens, gold = run.args, run.model, run.tokens['train'], run.gold['train']
    device = next(model.parameters()).device
    rng = np.random.default_rng([args.seed, epoch])  # per-epoch streams make --resume repeatable
    torch.manual_seed(args.seed * 100003 + epoch)
    mixing = args.mix != 'none' and epoch >= args.warmup_epochs
    mlm_rate = 0.0 if args.no_mlm or args.arch == 'bert' else MLM_RATE
    model.train()
    total, lams = torch.zeros((), device=device), []
    batches = lhmix.train_batches([len(t) for t in tokens], args.batch, rng, mixing)
    graphed = isinstance(step, lhmix.CUDAGraphs)
    for idx, partner in batches:
        batch = lhmix.make_batch(model, [tokens[i] for i in idx], [gold[i] for i in idx],
                                 lhmix.pad_multiple(device), rng, mlm_rate, graphed,
                                 pack=mixing and graphed)
        if mixing:
            batch['partner'] = torch.from_numpy(partner)
            if args.mix == 'lhmix':
                batch['hierarchy_ids'] = run.extra['hierarchy_ids'][idx]
            else:  # vanilla Mixup: Beta(a, a) folded to [0.5, 1], as LH-Mix's lambda
                lam = rng.beta(args.mix_alpha, args.mix_alpha, len(idx))
                batch['lam'] = torch.from_numpy(np.maximum(lam, 1 - lam)).float()
        loss, lam = step(**lhmix.to_device(batch, device))
        total += loss  # on the device: no host sync
        if lam is not None:
            lams.append(lam.clone())  # a graph's next replay overwrites its output
        bar.update(1)
    loss = total.item() / len(batches)
    if not math.isfinite(loss):
        raise FloatingPointError(f'the training loss became {loss} in epoch {epoch} (try a lower '
                                 '--lr); this epoch is not saved')
    return loss, torch.cat(lams).double().cpu().numpy() if lams else None


def since_best(history):
    """Epochs since the best dev macro-F1 (the first of equal ones)."""
    f1 = [h['dev_macro_f1'] for h in history]
    return len(f1) - 1 - int(np.argmax(f1)) if f1 else 0


def epoch_line(run, epoch, loss, lam, seconds):
    """metrics.jsonl's line for an epoch (dev F1; the ratios used, as quantiles), printed."""
    dev = evaluate.f1_scores(lhmix.score_documents(run.model, run.tokens['dev']) > 0,
                             run.gold['dev'], len(run.model.hierarchy))
    line = {'epoch': epoch, 'mix': lam is not None, 'train_loss': loss,
            'dev_micro_f1': dev['micro_f1'], 'dev_macro_f1': dev['macro_f1'],
            'seconds': round(seconds, 2),
            'samples_per_s': round(len(run.tokens['train']) / seconds, 1)}
    if lam is not None:
        q = [0, 5, 25, 50, 75, 95, 100]
        line['lambda'] = {'mean': float(lam.mean()), 'quantiles': dict(
            zip(map(str, q), np.quantile(lam, np.array(q) / 100).tolist()))}
    tqdm.write(f"epoch {epoch:3d}  loss {loss:.4f}  dev micro-F1 {100 * dev['micro_f1']:.2f}  "
               f"macro-F1 {100 * dev['macro_f1']:.2f}  {seconds:.1f} s"
               + (f'  mixup, mean lambda {lam.mean():.3f}' if lam is not None else ''))
    return line


def fit(run):
    """Epochs until --epochs or early stopping, each saved; first, LH-Mix's local hierarchies
    encoded once by the initial encoder (Sec. 4.1)."""
    args, model = run.args, run.model
    if args.mix == 'lhmix':
        if 'table' not in run.extra:
            run.extra['table'], run.extra['hierarchy_ids'] = lhmix.local_hierarchy_table(
                model, run.tokenizer, run.gold['train'])
            print(f"{len(run.extra['table'])} distinct local hierarchies encoded")
        model.use_local_hierarchies(run.extra['table'].to(args.device), args.alpha, args.beta)
    why_not = lhmix.cuda_graphs_unavailable(args.device)
    if why_not and args.device.type == 'cuda' and not args.no_cuda_graphs:
        print(f'CUDA graphs off: {why_not}', file=sys.stderr)
    step, opt = make_step(model, args.lr, not (why_not or args.no_cuda_graphs), run.adam)
    steps = -(-len(run.tokens['train']) // args.batch)
    with tqdm(total=steps * max(args.epochs - len(run.history), 0), disable=None) as bar:
        for epoch in range(len(run.history), args.epochs):
            if since_best(run.history) >= args.early_stop:
                tqdm.write(f'early stop: dev macro-F1 not improved for {args.early_stop} epochs')
                break
            t0 = time.time()
            loss, lam = train_epoch(run, step, epoch, bar)
            run.history.append(epoch_line(run, epoch, loss, lam, time.time() - t0))
            if not all(torch.isfinite(p).all() for p in model.parameters()):
                raise FloatingPointError(f'the weights became infinite or NaN in epoch {epoch} '
                                         '(try a lower --lr); this epoch is not saved')
            run.folder.save(model, run.tokenizer, run.meta, run.history, run.extra, opt,
                            improved=since_best(run.history) == 0)


def test(run):
    """The best-dev checkpoint's test figures, as evaluate.py computes them."""
    best, _, meta = runs.load_checkpoint(os.path.join(run.folder.path, 'best'), run.args.device)
    result = evaluate.report(lhmix.score_documents(best, run.tokens['test']) > 0,
                             run.gold['test'], best.hierarchy, run.train_labels)
    result.update(best_epoch=meta['epoch'], checkpoint=os.path.join(run.args.out, 'best'),
                  args=run.meta['args'])
    data.write_whole(os.path.join(run.folder.path, runs.TEST_METRICS),
                     json.dumps(result, indent=1))
    print(f"test micro-F1 {100 * result['micro_f1']:.2f}  macro-F1 {100 * result['macro_f1']:.2f}"
          f"  (best dev epoch {meta['epoch']}, {run.args.out})")


def train(args, given):
    with runs.RunFolder(args.out, args.resume, args.overwrite) as folder:
        run = prepare(args, given, folder)
        args = run.args
        if ((len(run.history) >= args.epochs or since_best(run.history) >= args.early_stop)
                and os.path.exists(os.path.join(folder.path, runs.TEST_METRICS))):
            return print(f'--resume: {args.out} is finished ({len(run.history)} epochs); '
                         'nothing to do', file=sys.stderr)
        if args.mix != 'none' and args.epochs <= args.warmup_epochs:
            print(f'warning: --epochs {args.epochs} <= --warmup-epochs {args.warmup_epochs}: '
                  'Mixup never starts', file=sys.stderr)
        try:
            fit(run)
            test(run)
        except KeyboardInterrupt:
            sys.exit('interrupted: continue with --resume' if folder.saved else
                     'interrupted before the first epoch was saved; nothing of it is kept')


def main(argv=None):
    args, given = parse(argv)
    runs.exit_on_error(train, args, given)


if __name__ == '__main__':
    main()
