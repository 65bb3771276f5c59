"""Train LH-Mix (or one of the ablations) and test the best-dev checkpoint.

    python train.py --data demo                      # synthetic data + tiny BERT, a minute on a CPU
    python train.py --data wos --data-dir data/wos   # bert-base-uncased on WOS

Writes OUT/metrics.jsonl (a line per epoch), OUT/best/ and OUT/last/ (checkpoints that a kill at
any instant leaves loadable), OUT/test_metrics.json, and prints the best checkpoint's test F1.
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import time
import warnings

import numpy as np
import torch
from tqdm import tqdm

import data
import evaluate
import lhmix

# -----------------------------------------------------------------------------
# Defaults, each from its source. The paper (Sec. 5.1) gives only the model, Adam's learning rate,
# the 5 epochs without Mixup and the early stopping; for alpha and beta it gives grids (Fig. 5
# varies one with the other at 1).
DEFAULTS = dict(
    model='bert-base-uncased',  # the paper
    arch='prompt',              # the paper's hierarchical prompt; 'bert': the flat [CLS] ablation
    mix='lhmix',                # LH-Mix; 'mixup': vanilla Mixup; 'none'
    lr=3e-5,                    # the paper: Adam at 3e-5
    warmup_epochs=5,            # the paper: 5 epochs without Mixup, then Mixup
    early_stop=5,               # the paper: stop after 5 epochs without a better dev macro-F1
    alpha=1.0, beta=0.75,       # Eq. 4: the authors' README command for RCV1 (argparse: 2, 0.5)
    mix_alpha=1.0,              # Beta(1, 1) for vanilla Mixup: Zhang et al.'s code's default
    batch=16,                   # HPT's, and the authors' RCV1 command
    max_length=512,             # HPT's
    no_mlm=False,               # HPT's auxiliary MLM loss on, as in the authors' code
    epochs=100,                 # this implementation's cap: early stopping ends runs before it
    seed=0, train_fraction=1.0)
# bf16 autocast on GPUs (fp16 without bf16) is this implementation's; the authors trained in fp32.
DEMO = dict(model='tiny', epochs=12, warmup_epochs=4, lr=1e-3, max_length=128)  # --data demo
MLM_RATE = 0.15  # HPT's MLM loss masks 15% of the text word-pieces
RESUMABLE = ('epochs',)  # what --resume may change; every other saved argument is the run's own
RUN = ('best', 'last', evaluate.METRICS, evaluate.TEST_METRICS)  # what a run folder holds


def parse(argv=None):
    """(args, the hyperparameters given on the command line)."""
    p = argparse.ArgumentParser(description=__doc__, argument_default=argparse.SUPPRESS,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add('--data', required=True, help='wos | nyt | rcv1 | demo | PATH to a HiAGM-format folder')
    add('--data-dir', default=None, help='where the data set lies (default data/NAME)')
    add('--model', help="HF id or local folder, or 'tiny' (a small BERT built here)")
    add('--arch', choices=['prompt', 'bert'], help='hierarchical prompt, or the flat [CLS] ablation')
    add('--mix', choices=['none', 'mixup', 'lhmix'], help='no Mixup, vanilla Mixup, or LH-Mix')
    add('--alpha', type=float, help='alpha of Eq. 4 (> 0)')
    add('--beta', type=float, help='beta of Eq. 4, in (0.5, 1]')
    add('--mix-alpha', type=float, help='a of Beta(a, a) for vanilla Mixup (> 0)')
    add('--warmup-epochs', type=int, help='epochs without Mixup first')
    add('--epochs', type=int, help='at most this many epochs')
    add('--early-stop', type=int, help='patience in epochs on dev macro-F1')
    add('--batch', type=int, help='documents per batch')
    add('--lr', type=float, help='Adam learning rate')
    add('--max-length', type=int, help='tokens per input, template included')
    add('--no-mlm', action='store_true', help="drop HPT's auxiliary MLM loss (prompt arch)")
    add('--seed', type=int)
    add('--train-fraction', type=float, help='train on this seeded share, in (0, 1] (Fig. 3)')
    add('--out', default=None, help='output folder (default out/DATA-ARCH-MIX-sSEED)')
    add('--resume', action='store_true', default=False, help='continue OUT/last after a crash')
    add('--overwrite', action='store_true', default=False,
        help='replace the run in OUT (once the new run has saved its first epoch)')
    add('--device', default=None, help='cpu, cuda or cuda:N (default: cuda when there is one)')
    add('--no-cuda-graphs', action='store_true', default=False,
        help='on CUDA, run the steps and dev evaluation eagerly, not replayed from CUDA graphs')
    ns = p.parse_args(argv)
    given = {k: v for k, v in vars(ns).items() if k in DEFAULTS}
    args = argparse.Namespace(**{**DEFAULTS, **(DEMO if ns.data == 'demo' else {}), **vars(ns)})
    for flag, ok, what in [
            ('alpha', 0 < args.alpha < math.inf, 'a finite number > 0'),
            ('beta', 0.5 < args.beta <= 1, 'in (0.5, 1]'),
            ('mix-alpha', 0 < args.mix_alpha < math.inf, 'a finite number > 0'),
            ('lr', 0 < args.lr < math.inf, 'a finite number > 0'),
            ('train-fraction', 0 < args.train_fraction <= 1, 'in (0, 1]'),
            ('epochs', args.epochs >= 1, '>= 1'), ('early-stop', args.early_stop >= 1, '>= 1'),
            ('warmup-epochs', args.warmup_epochs >= 0, '>= 0'), ('batch', args.batch >= 1, '>= 1'),
            ('max-length', args.max_length >= 1, '>= 1')]:
        if not ok:
            p.error(f"--{flag} must be {what}, got {getattr(args, flag.replace('-', '_'))}")
    if args.resume and args.overwrite:
        p.error('--resume and --overwrite exclude each other')
    args.device = str(evaluate.parse_device(p, args.device))
    args.out = args.out or os.path.join(
        'out', f'{os.path.basename(args.data.rstrip("/"))}-{args.arch}-{args.mix}-s{args.seed}')
    return args, given


def is_run(folder):
    """A folder train.py wrote, recognised by its own files (and what a killed save leaves)."""
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return evaluate.METRICS in names and all(  # a killed save leaves .NAME.PID.tmp
        n in RUN or n.endswith('.tmp') and n[1:].rsplit('.', 2)[0] in RUN for n in names)


def check_out(args):
    """--out's problems, refused before anything is computed: a file, a folder that is not a run
    (with or without --overwrite), an earlier run without --resume or --overwrite."""
    out, up = args.out, args.out
    while not os.path.lexists(up) and os.path.dirname(up) not in ('', up):
        up = os.path.dirname(up)
    if os.path.lexists(up) and not os.path.isdir(up):
        raise ValueError(f'--out {out}: ' + ('is' if up == out else f'{up} is') + ' a file, not a folder')
    if args.overwrite and os.path.islink(out):
        raise ValueError(f'--out {out}: a symbolic link; --overwrite replaces only a real folder')
    if os.path.isdir(out) and os.listdir(out) and not is_run(out):
        raise ValueError(f'--out {out}: not a train.py run (it holds '
                         f'{", ".join(sorted(os.listdir(out))[:3])}...); choose another --out')
    if args.resume and not is_run(out):
        raise ValueError(f'--resume: {out} holds no run to continue; start one without --resume')
    if is_run(out) and not (args.resume or args.overwrite):
        raise ValueError(f'--out {out}: holds an earlier run; continue it with --resume, replace '
                         'it with --overwrite, or choose another --out')


def resumed(args, given, meta):
    """--resume continues the run as it was started: its saved arguments, but --epochs if given;
    anything else given differently is reported (stderr)."""
    saved = meta['args']
    for k, v in [*given.items(), ('data', args.data), ('data_dir', args.data_dir)]:
        if k not in RESUMABLE and v != saved[k]:
            print(f'--resume: the run keeps its saved --{k.replace("_", "-")} {saved[k]} (not {v})',
                  file=sys.stderr)
    return argparse.Namespace(**{**vars(args), **saved, **{k: given[k] for k in RESUMABLE
                                                            if k in given}})


def digest(hierarchy, docs):
    """What --resume checks against the run's: the labels, the training documents and theirs."""
    def sha(x):
        return hashlib.sha256(json.dumps(x).encode()).hexdigest()
    return {'labels': sha([hierarchy.labels, hierarchy.parent]), 'train': sha(docs),
            'train_documents': len(docs)}


def cuda_graphs_unavailable(device):
    """Why CUDA graphs cannot run the steps on `device`, or None when they can."""
    import transformers
    if device.type != 'cuda':
        return 'not a CUDA device'
    if not torch.cuda.is_bf16_supported():
        return 'no bf16 on this GPU (fp16 needs a loss scaler that syncs)'
    if int(transformers.__version__.split('.')[0]) < 5:  # 4.x checks the mask on the host
        return f'transformers {transformers.__version__} syncs inside the encoder (5.x does not)'
    return None


class CUDAGraphs:
    """fn(**tensors) replayed from a CUDA graph: one captured per distinct set of input shapes and
    kept, so that a call costs one copy of the inputs and one replay, the GPU's own kernel time,
    instead of Python's and the kernel launches'. All graphs share one memory pool (they never run
    at once). Before each capture, warmup(**tensors) (default: fn) runs once on a side stream, as
    capture requires (first calls allocate workspaces and compile kernels). The returned tensors
    are overwritten by the next replay of the same graph."""

    def __init__(self, fn, warmup=None):
        self.fn, self.warmup, self.graphs = fn, warmup or fn, {}
        self.pool = torch.cuda.graph_pool_handle()

    def __call__(self, **inputs):
        key = tuple((k, tuple(v.shape), v.dtype) for k, v in inputs.items())
        if key not in self.graphs:
            static = {k: v.clone() for k, v in inputs.items()}
            side = torch.cuda.Stream()
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


def make_step(model, opt, graphs, table=None, alpha=None, beta=None):
    """step(**batch) -> (loss, lambda or None), device tensors (no host sync): forward, backward,
    Adam. For LH-Mix the batch carries `rows` (each document's row of the local-hierarchy `table`)
    and `partner`, and lambda is computed here, on the device (Eqs. 3-4); vanilla Mixup's batch
    carries `lam`. With `graphs`, each batch shape's step is captured once as a CUDA graph and
    replayed after; the gradients then stay allocated, zeroed inside the graph."""
    device = next(model.parameters()).device
    # fp16 (GPUs without bf16) needs loss scaling; its scale restarts at --resume
    scaler = torch.amp.GradScaler(device.type, enabled=device.type == 'cuda'
                                  and not torch.cuda.is_bf16_supported())

    def forward_backward(rows=None, lam=None, **batch):
        if rows is not None:
            lam = lhmix.pair_ratios(table[rows], batch['partner'], alpha, beta)  # Eqs. 3-4
        with lhmix.autocast(device):
            loss = model(**batch, lam=lam)
        scaler.scale(loss).backward()
        return loss.detach(), lam

    def step(**batch):
        opt.zero_grad(set_to_none=True)
        out = forward_backward(**batch)
        scaler.step(opt)
        scaler.update()
        return out

    if not graphs:
        return step
    params = [p for g in opt.param_groups for p in g['params']]
    for p in params:
        p.grad = torch.zeros_like(p)
    if any(not opt.state[p] for p in params):  # Adam's state made outside the graph: a step on
        with warnings.catch_warnings():          # zero gradients moves no weight; its step count is
            warnings.simplefilter('ignore')      # undone (the warning: this step is not captured)
            opt.step()
        for p in params:
            opt.state[p]['step'].zero_()

    def graphed(**batch):
        torch._foreach_zero_([p.grad for p in params])
        out = forward_backward(**batch)
        opt.step()
        return out
    return CUDAGraphs(graphed, warmup=forward_backward)


def train_epoch(model, step, tokens, labels, rows, args, epoch, bar):
    """One pass over the training set: (mean loss, the lambdas used or None, seconds)."""
    device = next(model.parameters()).device
    rng = np.random.default_rng([args.seed, epoch])  # per-epoch streams make --resume repeatable
    torch.manual_seed(args.seed * 100003 + epoch)
    mixing = args.mix != 'none' and epoch >= args.warmup_epochs
    mlm_rate = 0.0 if args.no_mlm or args.arch == 'bert' else MLM_RATE
    graphs = isinstance(step, CUDAGraphs)
    model.train()
    t0, total, lams = time.time(), torch.zeros((), device=device), []
    batches = lhmix.train_batches([len(t) for t in tokens], args.batch, rng, mixing)
    for idx, partner in batches:
        batch = lhmix.make_batch(model, [tokens[i] for i in idx], [labels[i] for i in idx],
                                 lhmix.pad_multiple(device), rng, mlm_rate, static=graphs)
        if mixing:
            batch['partner'] = torch.from_numpy(partner)
            if args.mix == 'lhmix':
                batch['rows'] = torch.from_numpy(rows[idx])
            else:  # vanilla Mixup: Beta(a, a) folded to [0.5, 1], as LH-Mix's lambda
                lam = rng.beta(args.mix_alpha, args.mix_alpha, len(idx))
                batch['lam'] = torch.from_numpy(np.maximum(lam, 1 - lam)).float()
        loss, lam = step(**lhmix.to_device(batch, device))
        total += loss  # summed on the device: no host sync in the loop
        if lam is not None:
            lams.append(lam.clone())  # a graph's next replay overwrites its output
        bar.update(1)
    seconds = time.time() - t0
    loss = total.item() / len(batches)
    if not math.isfinite(loss):
        raise FloatingPointError(f'the training loss became {loss} in epoch {epoch} (try a lower '
                                 '--lr); this epoch is not saved')
    return loss, torch.cat(lams).double().cpu().numpy() if lams else None, seconds


def adam_extra(opt):
    """Adam's state as checkpoint extras (name -> tensor)."""
    return {f'adam.{i}.{k}': v for i, s in opt.state_dict()['state'].items() for k, v in s.items()}


def load_adam(opt, extra):
    state = {}
    for name, v in extra.items():
        if name.startswith('adam.'):
            _, i, k = name.split('.')
            state.setdefault(int(i), {})[k] = v
    opt.load_state_dict({'state': state, 'param_groups': opt.state_dict()['param_groups']})
    for p, s in opt.state.items():  # fused Adam counts its steps on the weights' device
        s['step'] = s['step'].to(p.device)


def put_in_place(new, out):
    """The run written whole in `new` becomes `out`. An earlier run there (--overwrite) is renamed
    aside first and removed last: a kill in between leaves both whole (OUT, OUT.old-*)."""
    old = None
    if os.path.isdir(out) and os.listdir(out):
        old = f'{out}.old-{os.urandom(4).hex()}'
        os.rename(out, old)
    os.replace(new, out)  # onto nothing or an empty folder
    if old:
        shutil.rmtree(old)


def finish(out, model_device, tokens, gold, hierarchy, train_labels):
    """The test figures of the best-dev checkpoint, as evaluate.py computes them."""
    best, _, meta = data.load_checkpoint(os.path.join(out, 'best'), model_device)
    pred = lhmix.score_documents(best, tokens) > 0
    result = evaluate.report(pred, gold, hierarchy, train_labels)
    result.update(best_epoch=meta['epoch'], checkpoint=os.path.join(out, 'best'))
    data.write_atomically(os.path.join(out, evaluate.TEST_METRICS), json.dumps(result, indent=1))
    print(f"test micro-F1 {100 * result['micro_f1']:.2f}  macro-F1 {100 * result['macro_f1']:.2f}"
          f"  (best dev epoch {meta['epoch']}, {out})")


def train(args, given):
    check_out(args)
    device, out = torch.device(args.device), args.out
    if args.resume:
        model, tokenizer, meta = data.load_checkpoint(os.path.join(out, 'last'))
        args = resumed(args, given, meta)
    torch.manual_seed(args.seed)
    hierarchy, splits = data.load_data(args.data, args.data_dir)
    docs = splits['train']
    if args.train_fraction < 1:
        keep = np.random.default_rng(args.seed).permutation(len(docs))
        docs = [docs[i] for i in sorted(keep[:math.ceil(args.train_fraction * len(docs))])]
    saved_args = {k: getattr(args, k) for k in [*DEFAULTS, 'data', 'data_dir']}
    info = {'args': saved_args, 'data': digest(hierarchy, docs)}
    if args.resume:
        changed = [k for k in ('labels', 'train') if meta['data'][k] != info['data'][k]]
        if changed:
            raise ValueError(f'--resume: the {" and ".join(changed)} of --data {args.data} differ '
                             f"from the run's ({meta['data']['train_documents']} training "
                             f"documents then, {len(docs)} now); start a new run instead")
        state, extra = meta['state'], meta['extra']
        if state['epoch'] >= args.epochs or state['bad_epochs'] >= args.early_stop:
            if os.path.exists(os.path.join(out, evaluate.TEST_METRICS)):
                why = ('stopped early' if state['bad_epochs'] >= args.early_stop
                       else f'--epochs {args.epochs} done')
                print(f'--resume: {out} is finished ({why}); nothing to do', file=sys.stderr)
                return
    else:
        mlm, tokenizer = (data.tiny_bert([t for t, _ in docs] + hierarchy.names)
                          if args.model == 'tiny' else data.load_pretrained(args.model))
        model = lhmix.build_model(mlm, tokenizer, hierarchy, args.arch, args.max_length)
        state, extra = {'epoch': 0, 'best': -1.0, 'bad_epochs': 0}, {}
    max_text, most = model.text_budget(args.max_length), model.mlm.config.max_position_embeddings
    if not 0 < max_text <= model.text_budget(most):
        raise ValueError(f'--max-length {args.max_length} leaves {max_text} text tokens for this '
                         f'model (at most {most} positions)')
    if args.mix != 'none' and args.epochs <= args.warmup_epochs:
        print(f'warning: --epochs {args.epochs} <= --warmup-epochs {args.warmup_epochs}: Mixup '
              'never starts', file=sys.stderr)
    tokens, cut, gold = {}, {}, {}
    for name, split in (('train', docs), ('dev', splits['dev']), ('test', splits['test'])):
        tokens[name], cut[name] = lhmix.tokenize(tokenizer, [t for t, _ in split], max_text)
        gold[name] = [ls for _, ls in split]
    print(f'{len(hierarchy)} labels, depth {hierarchy.num_depths}; documents '
          + ', '.join(f'{k} {len(v)}' for k, v in tokens.items())
          + f'; cut to --max-length {args.max_length}: ' + ', '.join(f'{k} {cut[k]}' for k in cut))
    history = []
    if args.resume:  # the lines of the epochs last/ holds
        path = os.path.join(out, evaluate.METRICS)
        for n, line in data.read_lines(path):
            try:
                if json.loads(line)['epoch'] < state['epoch']:
                    history.append(json.loads(line))
            except (ValueError, KeyError, TypeError):
                raise ValueError(f'{path}:{n}: not a metrics line (corrupt file)') from None

    model.to(device)
    graphs = device.type == 'cuda' and not args.no_cuda_graphs
    why_not = graphs and cuda_graphs_unavailable(device)
    if why_not:
        print(f'CUDA graphs off: {why_not}', file=sys.stderr)
        graphs = False
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, fused=device.type == 'cuda',
                           capturable=graphs)
    if extra:
        load_adam(opt, extra)
    table, rows = extra.get('table'), extra.get('rows')
    if args.mix == 'lhmix' and table is None:  # the initial encoder, frozen (Sec. 4.1)
        table, rows = lhmix.local_hierarchy_table(model, tokenizer, gold['train'])
        print(f'{len(table)} distinct local hierarchies encoded')
    if table is not None:  # the table on the device, each document's row on the host
        table, rows = table.to(device), rows.cpu().numpy()
    step = make_step(model, opt, graphs, table, args.alpha, args.beta)
    scorer = CUDAGraphs(model.label_scores) if graphs else None

    steps = -(-len(docs) // args.batch)  # one bar for the run (stderr; off when not a terminal)
    with tqdm(total=steps * (args.epochs - state['epoch']), desc='train', disable=None) as bar:
        for epoch in range(state['epoch'], args.epochs):
            if state['bad_epochs'] >= args.early_stop:
                tqdm.write(f'early stop: dev macro-F1 has not improved for {args.early_stop} epochs')
                break
            loss, lam, seconds = train_epoch(model, step, tokens['train'], gold['train'], rows,
                                             args, epoch, bar)
            scores = lhmix.score_documents(model, tokens['dev'], scorer=scorer)
            dev = evaluate.f1_scores(scores > 0, gold['dev'], len(hierarchy))
            line = {'epoch': epoch, 'mix': lam is not None, 'train_loss': loss,
                    'dev_micro_f1': dev['micro_f1'], 'dev_macro_f1': dev['macro_f1'],
                    'seconds': round(seconds, 2), 'samples_per_s': round(len(docs) / seconds, 1)}
            if lam is not None:  # the ratios used, for the README's lambda distribution
                q = [0, 5, 25, 50, 75, 95, 100]
                line['lambda'] = {'mean': float(lam.mean()), 'quantiles': dict(
                    zip(map(str, q), np.quantile(lam, np.array(q) / 100).tolist()))}
            tqdm.write(f'epoch {epoch:3d}  loss {loss:.4f}  dev micro-F1 {100 * dev["micro_f1"]:.2f}'
                       f'  macro-F1 {100 * dev["macro_f1"]:.2f}  {seconds:.1f} s'
                       + (f'  mixup, mean lambda {lam.mean():.3f}' if lam is not None else ''))
            if not all(torch.isfinite(p).all() for p in model.parameters()):
                raise FloatingPointError(f'the weights became infinite or NaN in epoch {epoch} '
                                         '(try a lower --lr); this epoch is not saved')
            # best/ if dev macro-F1 improved, metrics.jsonl, then last/: a kill between them
            # re-runs the epoch at --resume. A new run's first epoch is written whole beside
            # --out, then put in place (over an earlier run only now, with --overwrite).
            first = not args.resume
            folder = f'{out}.new-{os.urandom(4).hex()}' if first else out
            improved = dev['macro_f1'] > state['best']
            state = {'epoch': epoch + 1, 'best': max(dev['macro_f1'], state['best']),
                     'bad_epochs': 0 if improved else state['bad_epochs'] + 1}
            history.append(line)
            try:
                if first:
                    os.makedirs(folder)
                if improved:
                    data.save_checkpoint(os.path.join(folder, 'best'), model, tokenizer,
                                         {**info, 'epoch': epoch, 'dev': line})
                data.write_atomically(os.path.join(folder, evaluate.METRICS),
                                      ''.join(json.dumps(h) + '\n' for h in history))
                extra = adam_extra(opt) | ({} if rows is None else
                                           {'table': table, 'rows': torch.from_numpy(rows)})
                data.save_checkpoint(os.path.join(folder, 'last'), model, tokenizer,
                                     {**info, 'state': state}, extra)
            except BaseException:
                if first:
                    shutil.rmtree(folder, ignore_errors=True)
                raise
            if first:
                put_in_place(folder, out)
                args.resume = True  # from now on, a run --resume continues
    finish(out, device, tokens['test'], gold['test'], hierarchy, [ls for _, ls in splits['train']])


def main(argv=None):
    args, given = parse(argv)
    try:
        train(args, given)
    except KeyboardInterrupt:
        sys.exit('interrupted: resume with --resume' if args.resume
                 else f'interrupted before the first epoch was saved: {args.out} unchanged')
    except torch.OutOfMemoryError:
        sys.exit(f'error: out of GPU memory at --batch {args.batch}; try a smaller --batch')
    except OSError as e:  # disk full, permissions: the file and the reason
        sys.exit(f'error: {e.filename}: {e.strerror}' if e.filename else f'error: {e}')
    except (ValueError, FloatingPointError) as e:
        sys.exit(f'error: {e}')


if __name__ == '__main__':
    main()
