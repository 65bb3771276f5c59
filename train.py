"""Train LH-Mix (or an ablation), then test the best-dev checkpoint.

    python train.py --data demo      # synthetic data and a tiny BERT: about a minute on a CPU
    python train.py --data wos       # bert-base-uncased on WOS, as the paper (downloads WOS)

The run folder (--out) gets metrics.jsonl (a line an epoch), the checkpoints best/ and last/
(loadable after a kill at any instant: --resume continues) and test_metrics.json.
"""
import argparse
import hashlib
import json
import math
import os
import re
import sys
import time
import warnings

import numpy as np
import torch
from tqdm import tqdm

import data
import evaluate
import lhmix

DEMO = dict(model='tiny', epochs=12, warmup_epochs=4, lr=1e-3, max_length=128)  # --data demo
MLM_RATE = 0.15  # HPT's MLM loss masks 15% of the text word-pieces
CONTROL = ('out', 'device', 'resume', 'overwrite', 'no_cuda_graphs')  # not part of a run


def within(cast, lo, hi=math.inf):
    """An argparse type: a finite number x with lo < x <= hi."""
    def number(text):
        x = cast(text)
        if not (lo < x <= hi and math.isfinite(x)):
            raise argparse.ArgumentTypeError(
                f'must be in ({lo}, {hi}{"]" if hi < math.inf else ")"}, got {text}')
        return x
    number.__name__ = cast.__name__  # argparse: "invalid int value: 'x'"
    return number


def parse(argv=None):
    """(the arguments, those given on the command line); -h shows each default and its source."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add('--data', required=True, help='wos, nyt, rcv1, a folder, or demo: synthetic, with '
        + ', '.join(f"--{k.replace('_', '-')} {v}" for k, v in DEMO.items()))
    add('--data-dir', help='the folder of wos, nyt or rcv1 (default: data/NAME)')
    add('--model', default='bert-base-uncased', help='a BERT-style masked LM, hub id or folder; '
        "tiny: a 2-layer BERT built from the data (default: the paper's %(default)s, Sec. 5.2)")
    add('--arch', default='prompt', choices=['prompt', 'bert'], help="the paper's hierarchical "
        "prompt, or Table 3's flat BERT (HGCLR's: linear on [CLS], BCE) (default: %(default)s)")
    add('--mix', default='lhmix', choices=['lhmix', 'mixup', 'none'],
        help='Table 3 (default: %(default)s)')
    add('--lr', type=within(float, 0), default=3e-5,
        help="Adam's learning rate (default: the paper's %(default)s)")
    add('--warmup-epochs', type=within(int, -1), default=5,
        help="first, without Mixup (default: the paper's %(default)s)")
    add('--early-stop', type=within(int, 0), default=5, help='after so many epochs without a '
        "better dev macro-F1 (default: the paper's %(default)s)")
    add('--epochs', type=within(int, 0), default=100,
        help='at most (default: %(default)s, ours; early stopping ends runs before it)')
    add('--alpha', type=within(float, 0), default=1.0,
        help="Eq. 4 (default: %(default)s, the authors' README command for RCV1)")
    add('--beta', type=within(float, 0.5, 1), default=0.75, help='Eq. 4 (default: %(default)s, '
        'as --alpha)')
    add('--mix-alpha', type=within(float, 0), default=1.0,
        help="vanilla Mixup's Beta(a, a) (default: %(default)s, Zhang et al.'s code)")
    add('--batch', type=within(int, 0), default=16,
        help="documents a step (default: HPT's %(default)s)")
    add('--max-length', type=within(int, 0), default=512,
        help="tokens an input (default: HPT's %(default)s)")
    add('--no-mlm', action='store_true', help="without HPT's MLM loss (the authors' code has it)")
    add('--train-fraction', type=within(float, 0, 1), default=1.0,
        help='train on this random part of the training split (Fig. 4; default: %(default)s)')
    add('--seed', type=within(int, -1, 2**32 - 1), default=0, help='(default: %(default)s)')
    add('--out', help='the run folder (default: out/DATA-ARCH-MIX-sSEED)')
    add('--device', type=evaluate.device, default='cuda' if torch.cuda.is_available() else 'cpu',
        help='cpu, cuda or cuda:N (default: cuda if there is one)')
    add('--resume', action='store_true',
        help='continue the run in --out with its settings (a given --epochs extends it)')
    add('--overwrite', action='store_true',
        help='replace the run in --out once this one has an epoch')
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


# -----------------------------------------------------------------------------
# The run folder: train.py writes RUN there (while saving, .NAME.tmp files too), and a new run's
# first epoch in .OUT.new beside it; it deletes nothing else, and only by these exact names

RUN = (evaluate.METRICS, evaluate.TEST_METRICS,
       *(f'{c}/{f}' for c in ('best', 'last') for f in data.CHECKPOINT))
TMP = tuple(re.sub(r'([^/]+)$', r'.\1.tmp', f) for f in RUN)  # data.write_atomically's


def is_run(folder):  # recognised by the metadata train.py puts in last/model.safetensors
    try:
        return 'history' in data.checkpoint_meta(os.path.join(folder, 'last'))
    except Exception:  # missing, unreadable, not ours: not a run
        return False


def foreign(folder):
    """The first path in `folder` that train.py did not write, or None."""
    for root, dirs, files in os.walk(folder):
        for name in sorted(dirs + files):
            rel = os.path.relpath(os.path.join(root, name), folder)
            if rel not in RUN + TMP + ('best', 'last'):
                return os.path.join(folder, rel)
    return None


def remove(folder):
    """Deletes a run folder train.py wrote (if there): RUN and TMP by name, then the folders, which
    the OS refuses to delete while they hold another file."""
    for name in RUN + TMP:
        if os.path.lexists(os.path.join(folder, name)):
            os.remove(os.path.join(folder, name))
    for sub in ('best', 'last', ''):
        if os.path.isdir(os.path.join(folder, sub)):
            os.rmdir(os.path.join(folder, sub))


def beside(out, what):  # .OUT.new: a new run's first epoch; .OUT.old: the run it replaces
    return os.path.join(os.path.dirname(out), f'.{os.path.basename(out)}.{what}')


def check_out(args):
    """--out's problems, refused before anything is computed; then what killed saves left is
    deleted. Returns the folder's real path (where a link points)."""
    out = os.path.realpath(args.out)
    if os.path.islink(args.out) and not os.path.exists(args.out):
        raise ValueError(f'--out {args.out}: a symbolic link to nothing ({out})')
    if evaluate.unwritable(out):
        raise ValueError(f'--out {args.out}: {evaluate.unwritable(out)}')
    run = is_run(out)  # at --resume, a damaged last/ is load_checkpoint's to describe
    if args.resume and not (run or os.path.isdir(os.path.join(out, 'last'))):
        raise ValueError(f'--resume: {args.out} holds no run to continue; start one without it')
    if not (run or args.resume) and os.path.isdir(out) and os.listdir(out):
        raise ValueError(f'--out {args.out}: holds no train.py run (it holds '
                         f'{", ".join(sorted(os.listdir(out))[:3])}...); choose another --out')
    if run and not (args.resume or args.overwrite):
        raise ValueError(f'--out {args.out}: holds an earlier run; continue it with --resume, '
                         'replace it with --overwrite, or choose another --out')
    other = run and args.overwrite and foreign(out)
    if other:
        raise ValueError(f'--overwrite: {other} is not a file train.py writes; nothing is deleted '
                         'while it is there')
    for folder in (beside(out, 'new'), beside(out, 'old')):
        remove(folder)
    for name in TMP if run else ():  # what killed saves left in the run
        if os.path.lexists(os.path.join(out, name)):
            os.remove(os.path.join(out, name))
    return out


def put_in_place(new, out, args):
    """The run written whole in `new` becomes `out`. An earlier run there (--overwrite) is renamed
    aside first and deleted last: a kill in between leaves both whole."""
    if os.path.isdir(out) and os.listdir(out):
        if not (args.overwrite and is_run(out) and not foreign(out)):
            raise ValueError(f'--out {args.out}: another run has written there since this one '
                             'started; left as it is (choose another --out)')
        os.rename(out, beside(out, 'old'))
        os.replace(new, out)
        remove(beside(out, 'old'))
    else:
        os.replace(new, out)  # onto nothing or an empty folder


def save(out, first, args, model, tokenizer, info, history, extra):
    """best/ when dev macro-F1 improved, metrics.jsonl, then last/, each file replaced whole: a
    kill between them re-runs the epoch at --resume. A new run's first epoch is written whole
    beside --out, then put in place."""
    folder = beside(out, 'new') if first else out
    try:
        if since_best(history) == 0:
            data.save_checkpoint(os.path.join(folder, 'best'), model, tokenizer,
                                 {**info, 'epoch': len(history) - 1, 'dev': history[-1]},
                                 {'labels_at_init': extra['labels_at_init']})
        data.write_atomically(os.path.join(folder, evaluate.METRICS),
                              ''.join(json.dumps(h) + '\n' for h in history))
        data.save_checkpoint(os.path.join(folder, 'last'), model, tokenizer,
                             {**info, 'history': history}, extra)
        if first:
            put_in_place(folder, out, args)
    except BaseException:  # a new run's first epoch, half-written or refused
        if first:
            remove(folder)
        raise


# -----------------------------------------------------------------------------
# CUDA graphs: a training step replayed from a graph costs the GPU's own kernel time

def cuda_graphs_unavailable(device):
    """Why CUDA graphs cannot run the steps on `device`, or None when they can."""
    if device.type != 'cuda':
        return 'not a CUDA device'
    if not torch.cuda.is_bf16_supported():
        return 'no bf16 on this GPU (fp16 needs a loss scaler that syncs)'
    if not lhmix.TRANSFORMERS_5:  # 4.x checks the attention mask on the host
        return 'transformers 4 syncs inside the encoder (5 does not)'
    return None


class CUDAGraphs:
    """fn(**tensors) replayed from a CUDA graph captured once per set of input shapes (no Python
    or launch overhead), warmup(**tensors) run before each capture. A replay overwrites the
    graph's outputs."""

    def __init__(self, fn, warmup):
        self.fn, self.warmup, self.graphs = fn, warmup, {}
        self.pool = torch.cuda.graph_pool_handle()

    def __call__(self, **inputs):
        key = tuple((k, tuple(v.shape), v.dtype) for k, v in inputs.items())
        if key not in self.graphs:
            static = {k: v.clone() for k, v in inputs.items()}
            side = torch.cuda.Stream()  # capture requires a run on a side stream first
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.warmup(**static)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = self.fn(**static)
            self.graphs[key] = graph, static, out
        graph, static, out = self.graphs[key]
        for k, v in inputs.items():
            static[k].copy_(v, non_blocking=True)
        graph.replay()
        return out


def make_step(model, lr, graphs, table=None, alpha=None, beta=None, adam=None):
    """(step, Adam): step(**batch) -> (loss, lambda or None) with no host sync: forward, backward,
    Adam (its state from `adam`, extras adam.<parameter>.<name>); as CUDA graphs with `graphs`.
    Vanilla Mixup's batch carries `lam`; LH-Mix's, `rows` (of `table`) and `partner`."""
    device = next(model.parameters()).device
    opt = torch.optim.Adam(model.parameters(), lr=lr, fused=device.type == 'cuda',
                           capturable=graphs)
    state = {}
    for key, v in (adam or {}).items():
        _, i, name = key.split('.')
        state.setdefault(int(i), {})[name] = v
    opt.load_state_dict({'state': state, 'param_groups': opt.state_dict()['param_groups']})
    # fp16 (GPUs without bf16; no graphs) needs loss scaling; the scale restarts at --resume
    fp16 = device.type == 'cuda' and not torch.cuda.is_bf16_supported()
    scaler = torch.amp.GradScaler(enabled=fp16)

    def forward_backward(rows=None, lam=None, **batch):
        if rows is not None:
            lam = lhmix.pair_ratios(table[rows], batch['partner'], alpha, beta)  # Eqs. 3-4
        with lhmix.autocast(device):
            loss = model(**batch, lam=lam)
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
    # Adam's state made outside the graph: a step on zero gradients moves no weight; its step
    # count is undone (the warning: this step is not captured)
    if any(not opt.state[p] for p in params):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            opt.step()
        for p in params:
            opt.state[p]['step'].zero_()
    return CUDAGraphs(step, warmup=forward_backward), opt


# -----------------------------------------------------------------------------
# The run: prepare, fit (an epoch at a time, each saved), test

def digest(hierarchy, splits):
    """What --resume checks against the run's: the labels and every split's documents."""
    x = json.dumps([hierarchy.labels, hierarchy.parent, splits]).encode()
    return {'sha256': hashlib.sha256(x).hexdigest(), 'documents': {s: len(d) for s, d in
                                                                   splits.items()}}


def prepare(args, given, out):
    """The settings, data, model and state of a new run, or of the run in --out (--resume: its
    own settings, but a given --epochs; each other given one that differs is said)."""
    history, extra = [], {}
    if args.resume:
        model, tokenizer, meta = data.load_checkpoint(os.path.join(out, 'last'))
        saved, history, extra = meta['args'], meta['history'], meta['extra']
        for k, v in given.items():
            if k in saved and k != 'epochs' and v != saved[k]:
                print(f'--resume: the run keeps its saved --{k.replace("_", "-")} {saved[k]} '
                      f'(not {v})', file=sys.stderr)
        args = argparse.Namespace(**{**vars(args), **saved,
                                     'epochs': given.get('epochs', saved['epochs'])})
    torch.manual_seed(args.seed)
    hierarchy, splits = data.load_data(args.data, args.data_dir)
    used = dict(splits)  # the training documents: all, or --train-fraction of them
    if args.train_fraction < 1:
        keep = np.random.default_rng(args.seed).permutation(len(splits['train']))
        keep = sorted(keep[:math.ceil(args.train_fraction * len(keep))])
        used['train'] = [splits['train'][i] for i in keep]
    info = {'args': {k: v for k, v in vars(args).items() if k not in CONTROL},
            'data': digest(hierarchy, used)}
    if args.resume:
        data.check_labels(model.hierarchy, hierarchy, os.path.join(args.out, 'last'))
        if meta['data'] != info['data']:
            raise ValueError(f'--resume: the documents of --data {args.data} differ from the '
                             f"run's ({meta['data']['documents']} then, "
                             f"{info['data']['documents']} now); start a new run")
    else:
        mlm, tokenizer = (data.tiny_bert([t for t, _ in used['train']] + hierarchy.names)
                          if args.model == 'tiny' else data.load_pretrained(args.model))
        model = lhmix.build_model(mlm, tokenizer, hierarchy, args.arch, args.max_length)
        extra['labels_at_init'] = model.label_embeddings().detach().clone()  # for tools/
    budget, most = model.text_budget(args.max_length), model.mlm.config.max_position_embeddings
    if not 0 < budget <= model.text_budget(most):
        raise ValueError(f'--max-length {args.max_length} leaves {budget} text tokens for this '
                         f'model (at most {most} positions)')
    return args, hierarchy, splits, used, model, tokenizer, info, history, extra


def train_epoch(model, step, tokens, labels, rows, args, epoch, bar):
    """One pass over the training set: (mean loss, the lambdas used or None). Mixing batches are
    random (partners: lhmix.train_batches), so graphed steps take their documents in one packed
    row (lhmix.layout); eager ones pad them (nested tensors' Python dispatch costs more)."""
    device = next(model.parameters()).device
    rng = np.random.default_rng([args.seed, epoch])  # per-epoch streams make --resume repeatable
    torch.manual_seed(args.seed * 100003 + epoch)
    mixing = args.mix != 'none' and epoch >= args.warmup_epochs
    mlm_rate = 0.0 if args.no_mlm or args.arch == 'bert' else MLM_RATE
    model.train()
    total, lams = torch.zeros((), device=device), []
    batches = lhmix.train_batches([len(t) for t in tokens], args.batch, rng, mixing)
    graphed = isinstance(step, CUDAGraphs)
    for idx, partner in batches:
        batch = lhmix.make_batch(model, [tokens[i] for i in idx], [labels[i] for i in idx],
                                 lhmix.pad_multiple(device), rng, mlm_rate, graphed,
                                 pack=mixing and graphed)
        if mixing:
            batch['partner'] = torch.from_numpy(partner)
            if args.mix == 'lhmix':
                batch['rows'] = rows[idx]
            else:  # vanilla Mixup: Beta(a, a) folded to [0.5, 1], as LH-Mix's lambda
                lam = rng.beta(args.mix_alpha, args.mix_alpha, len(idx))
                batch['lam'] = torch.from_numpy(np.maximum(lam, 1 - lam)).float()
        loss, lam = step(**lhmix.to_device(batch, device))
        total += loss  # summed on the device: no host sync in the loop
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


def fit(args, out, model, tokenizer, tokens, gold, info, history, extra):
    """Epochs until --epochs or early stopping, each saved; metrics.jsonl's line printed."""
    device = args.device
    model.to(device)
    why_not = not args.no_cuda_graphs and device.type == 'cuda' and cuda_graphs_unavailable(device)
    if why_not:
        print(f'CUDA graphs off: {why_not}', file=sys.stderr)
    graphs = device.type == 'cuda' and not args.no_cuda_graphs and not why_not
    if args.mix == 'lhmix' and 'table' not in extra:  # the initial encoder, frozen (Sec. 4.1)
        extra['table'], extra['rows'] = lhmix.local_hierarchy_table(model, tokenizer, gold['train'])
        print(f"{len(extra['table'])} distinct local hierarchies encoded")
    table, rows = extra.get('table'), extra.get('rows')  # the table on the device, rows on the host
    table, rows = (None, None) if table is None else (table.to(device), rows.cpu())
    step, opt = make_step(model, args.lr, graphs, table, args.alpha, args.beta,
                          {k: v for k, v in extra.items() if k.startswith('adam.')})
    first, steps = not args.resume, -(-len(tokens['train']) // args.batch)
    try:
        with tqdm(total=steps * max(args.epochs - len(history), 0), disable=None) as bar:
            for epoch in range(len(history), args.epochs):
                if since_best(history) >= args.early_stop:
                    tqdm.write(f'early stop: dev macro-F1 not improved for {args.early_stop} '
                               'epochs')
                    break
                t0 = time.time()
                loss, lam = train_epoch(model, step, tokens['train'], gold['train'], rows, args,
                                        epoch, bar)
                seconds = time.time() - t0
                history.append(epoch_line(model, tokens, gold, epoch, loss, lam, seconds))
                if not all(torch.isfinite(p).all() for p in model.parameters()):
                    raise FloatingPointError(f'the weights became infinite or NaN in epoch '
                                             f'{epoch} (try a lower --lr); this epoch is not saved')
                extra.update({f'adam.{i}.{k}': v for i, s in opt.state_dict()['state'].items()
                              for k, v in s.items()})
                save(out, first, args, model, tokenizer, info, history, extra)
                first = False
    except KeyboardInterrupt:  # main's message: whether --out holds this run yet
        raise KeyboardInterrupt(first) from None


def epoch_line(model, tokens, gold, epoch, loss, lam, seconds):
    """metrics.jsonl's line for an epoch (dev F1; the ratios used, as quantiles), printed."""
    dev = evaluate.f1_scores(lhmix.score_documents(model, tokens['dev']) > 0, gold['dev'],
                             len(model.hierarchy))
    line = {'epoch': epoch, 'mix': lam is not None, 'train_loss': loss,
            'dev_micro_f1': dev['micro_f1'], 'dev_macro_f1': dev['macro_f1'],
            'seconds': round(seconds, 2), 'samples_per_s': round(len(tokens['train']) / seconds, 1)}
    if lam is not None:
        q = [0, 5, 25, 50, 75, 95, 100]
        line['lambda'] = {'mean': float(lam.mean()), 'quantiles': dict(
            zip(map(str, q), np.quantile(lam, np.array(q) / 100).tolist()))}
    tqdm.write(f"epoch {epoch:3d}  loss {loss:.4f}  dev micro-F1 {100 * dev['micro_f1']:.2f}  "
               f"macro-F1 {100 * dev['macro_f1']:.2f}  {seconds:.1f} s"
               + (f'  mixup, mean lambda {lam.mean():.3f}' if lam is not None else ''))
    return line


def test(args, out, tokens, gold, hierarchy, splits, info):
    """The test figures of the best-dev checkpoint, as evaluate.py computes them (label
    frequencies: in the whole training split)."""
    best, _, meta = data.load_checkpoint(os.path.join(out, 'best'), args.device)
    result = evaluate.report(lhmix.score_documents(best, tokens['test']) > 0, gold['test'],
                             hierarchy, [ls for _, ls in splits['train']])
    result.update(best_epoch=meta['epoch'], checkpoint=os.path.join(args.out, 'best'),
                  args=info['args'])
    data.write_atomically(os.path.join(out, evaluate.TEST_METRICS), json.dumps(result, indent=1))
    print(f"test micro-F1 {100 * result['micro_f1']:.2f}  macro-F1 {100 * result['macro_f1']:.2f}"
          f"  (best dev epoch {meta['epoch']}, {args.out})")


def train(args, given):
    out = check_out(args)
    args, hierarchy, splits, used, model, tokenizer, info, history, extra = prepare(args, given,
                                                                                   out)
    if ((len(history) >= args.epochs or since_best(history) >= args.early_stop)
            and os.path.exists(os.path.join(out, evaluate.TEST_METRICS))):
        print(f'--resume: {args.out} is finished ({len(history)} epochs); nothing to do',
              file=sys.stderr)
        return
    if args.mix != 'none' and args.epochs <= args.warmup_epochs:
        print(f'warning: --epochs {args.epochs} <= --warmup-epochs {args.warmup_epochs}: Mixup '
              'never starts', file=sys.stderr)
    tokens, cut, gold = {}, {}, {}
    for name, docs in used.items():
        tokens[name], cut[name] = lhmix.tokenize(tokenizer, [t for t, _ in docs],
                                                 model.text_budget(args.max_length))
        gold[name] = [ls for _, ls in docs]
    print(f'{len(hierarchy)} labels, depth {hierarchy.num_depths}; documents '
          + ', '.join(f'{k} {len(v)}' for k, v in tokens.items())
          + f'; cut to --max-length {args.max_length}: ' + ', '.join(f'{k} {cut[k]}' for k in cut))
    fit(args, out, model, tokenizer, tokens, gold, info, history, extra)
    test(args, out, tokens, gold, hierarchy, splits, info)


def main(argv=None):
    args, given = parse(argv)
    try:
        train(args, given)
        sys.stdout.flush()  # here, so that a closed pipe is caught below
    except KeyboardInterrupt as e:
        sys.exit(f'interrupted before the first epoch was saved: {args.out} unchanged'
                 if (e.args[0] if e.args else not args.resume) else
                 'interrupted: resume with --resume')
    except BrokenPipeError:  # `train.py ... | head -1`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except torch.OutOfMemoryError:
        sys.exit('error: out of GPU memory; try a smaller --batch')
    except OSError as e:  # disk full, permissions: the OS's words
        sys.exit(f'error: {e.filename or args.out}: {e.strerror or e}')
    except (ValueError, FloatingPointError) as e:
        sys.exit(f'error: {e}')


if __name__ == '__main__':
    main()
