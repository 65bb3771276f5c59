"""Train LH-Mix (or an ablation), then test the best-dev checkpoint.

    python train.py --data demo                      # synthetic data + tiny BERT, a minute on a CPU
    python train.py --data wos --data-dir data/wos   # bert-base-uncased on WOS

Writes OUT/metrics.jsonl (a line per epoch), the checkpoints OUT/best/ and OUT/last/ (loadable
after a kill at any instant) and OUT/test_metrics.json.
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

# Defaults, each from its source. The paper (Sec. 5.2) gives the model, Adam's learning rate, the
# warm-up and the early stopping; for alpha, beta only grids (Fig. 5: one varied, the other at 1).
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
RUN = ('best', 'last', evaluate.METRICS, evaluate.TEST_METRICS)  # a run folder's files
# each number's valid range (lo, hi]
RANGES = dict(lr=(0, math.inf), alpha=(0, math.inf), beta=(0.5, 1), mix_alpha=(0, math.inf),
              train_fraction=(0, 1), epochs=(0, math.inf), early_stop=(0, math.inf),
              warmup_epochs=(-1, math.inf), batch=(0, math.inf), max_length=(0, math.inf))


def parse(argv=None):
    """(args, the hyperparameters given on the command line)."""
    p = argparse.ArgumentParser(description=__doc__, argument_default=argparse.SUPPRESS,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add('--data', required=True, help='wos, nyt, rcv1, demo, or a HiAGM-format folder')
    for k, v in DEFAULTS.items():  # the hyperparameters: absent unless given
        if v is False:
            add('--' + k.replace('_', '-'), action='store_true')
        else:
            add('--' + k.replace('_', '-'), type=type(v), help=f'default {v}', choices={
                'arch': ['prompt', 'bert'], 'mix': ['none', 'mixup', 'lhmix']}.get(k))
    add('--data-dir', default=None, help='default data/NAME')
    add('--out', default=None, help='default out/DATA-ARCH-MIX-sSEED')
    add('--device', default=None, help='cpu, cuda or cuda:N (default cuda if there is one)')
    for flag in ('--resume', '--overwrite', '--no-cuda-graphs'):
        add(flag, action='store_true', default=False)
    ns = p.parse_args(argv)
    given = {k: v for k, v in vars(ns).items() if k in DEFAULTS}
    args = argparse.Namespace(**{**DEFAULTS, **(DEMO if ns.data == 'demo' else {}), **vars(ns)})
    for k, (lo, hi) in RANGES.items():
        if not (lo < getattr(args, k) <= hi and math.isfinite(getattr(args, k))):
            p.error(f"--{k.replace('_', '-')} must be in ({lo}, {hi}{']' if hi < math.inf else ')'}"
                    f', got {getattr(args, k)}')
    if args.resume and args.overwrite:
        p.error('--resume and --overwrite exclude each other')
    args.device = str(evaluate.parse_device(p, args.device))
    args.out = args.out or os.path.join(
        'out', f'{os.path.basename(args.data.rstrip("/"))}-{args.arch}-{args.mix}-s{args.seed}')
    return args, given


def check_out(args):
    """--out's problems, refused before anything is computed. A run is recognised by its files."""
    out = up = args.out
    while not os.path.lexists(up) and os.path.dirname(up) not in ('', up):
        up = os.path.dirname(up)
    if os.path.lexists(up) and not os.path.isdir(up):
        raise ValueError(f'--out {out}: {"" if up == out else up + " "}is a file, not a folder')
    if args.overwrite and os.path.islink(out):
        raise ValueError(f'--out {out}: a symbolic link; --overwrite replaces only a real folder')
    names = sorted(os.listdir(out)) if os.path.isdir(out) else []
    run = evaluate.METRICS in names and all(  # a killed save leaves .NAME.PID.tmp
        n in RUN or n.endswith('.tmp') and n[1:].rsplit('.', 2)[0] in RUN for n in names)
    if names and not run:
        raise ValueError(f'--out {out}: not a train.py run (it holds {", ".join(names[:3])}...); '
                         'choose another --out')
    if args.resume and not run:
        raise ValueError(f'--resume: {out} holds no run to continue; start one without --resume')
    if run and not (args.resume or args.overwrite):
        raise ValueError(f'--out {out}: holds an earlier run; continue it with --resume, replace '
                         'it with --overwrite, or choose another --out')


def digest(hierarchy, docs):
    """What --resume checks against the run's: the labels, the training documents and theirs."""
    x = json.dumps([hierarchy.labels, hierarchy.parent, docs]).encode()
    return {'sha256': hashlib.sha256(x).hexdigest(), 'n': len(docs)}


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


def make_step(model, opt, graphs, table=None, alpha=None, beta=None):
    """step(**batch) -> (loss, lambda or None) with no host sync: forward, backward, Adam; as CUDA
    graphs with `graphs`. Vanilla Mixup's batch carries `lam`; LH-Mix's, `rows` and `partner`."""
    device = next(model.parameters()).device
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
        return step
    # Adam's state made outside the graph: a step on zero gradients moves no weight; its step
    # count is undone (the warning: this step is not captured)
    if any(not opt.state[p] for p in params):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            opt.step()
        for p in params:
            opt.state[p]['step'].zero_()
    return CUDAGraphs(step, warmup=forward_backward)


def train_epoch(model, step, tokens, labels, rows, args, epoch, bar):
    """One pass over the training set: (mean loss, the lambdas used or None)."""
    device = next(model.parameters()).device
    rng = np.random.default_rng([args.seed, epoch])  # per-epoch streams make --resume repeatable
    torch.manual_seed(args.seed * 100003 + epoch)
    mixing = args.mix != 'none' and epoch >= args.warmup_epochs
    mlm_rate = 0.0 if args.no_mlm or args.arch == 'bert' else MLM_RATE
    model.train()
    total, lams = torch.zeros((), device=device), []
    batches = lhmix.train_batches([len(t) for t in tokens], args.batch, rng, mixing)
    for idx, partner in batches:
        batch = lhmix.make_batch(model, [tokens[i] for i in idx], [labels[i] for i in idx],
                                 lhmix.pad_multiple(device), rng, mlm_rate,
                                 static=isinstance(step, CUDAGraphs))
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


def metrics_line(epoch, loss, dev, lam, seconds, n):
    """metrics.jsonl's line for an epoch, printed; lam: the ratios used (the README's plot)."""
    line = {'epoch': epoch, 'mix': lam is not None, 'train_loss': loss,
            'dev_micro_f1': dev['micro_f1'], 'dev_macro_f1': dev['macro_f1'],
            'seconds': round(seconds, 2), 'samples_per_s': round(n / seconds, 1)}
    mixed = ''
    if lam is not None:
        q = [0, 5, 25, 50, 75, 95, 100]
        line['lambda'] = {'mean': float(lam.mean()), 'quantiles': dict(
            zip(map(str, q), np.quantile(lam, np.array(q) / 100).tolist()))}
        mixed = f'  mixup, mean lambda {lam.mean():.3f}'
    tqdm.write(f"epoch {epoch:3d}  loss {loss:.4f}  dev micro-F1 {100 * dev['micro_f1']:.2f}  "
               f"macro-F1 {100 * dev['macro_f1']:.2f}  {seconds:.1f} s{mixed}")
    return line


def since_best(history):
    """Epochs since the best dev macro-F1 (the first of equal ones)."""
    f1 = [h['dev_macro_f1'] for h in history]
    return len(f1) - 1 - int(np.argmax(f1)) if f1 else 0


def put_in_place(new, out, overwrite):
    """The run written whole in `new` becomes `out`. An earlier run there (--overwrite) is renamed
    aside first and removed last: a kill in between leaves both whole."""
    taken = os.path.isdir(out) and os.listdir(out)
    if taken and not overwrite:
        raise ValueError(f'--out {out}: another run has written there since this one started; '
                         'left as it is (choose another --out)')
    if taken:
        old = f'{out}.old-{os.urandom(4).hex()}'
        os.rename(out, old)
    os.replace(new, out)  # onto nothing or an empty folder
    if taken:
        shutil.rmtree(old)


def train(args, given):
    check_out(args)
    device, out = torch.device(args.device), args.out
    if args.resume:  # the run's saved arguments, but --epochs if given; the rest said
        model, tokenizer, meta = data.load_checkpoint(os.path.join(out, 'last'))
        for k, v in [*given.items(), ('data', args.data), ('data_dir', args.data_dir)]:
            if k != 'epochs' and v != meta['args'][k]:
                print(f'--resume: the run keeps its saved --{k.replace("_", "-")} '
                      f'{meta["args"][k]} (not {v})', file=sys.stderr)
        vars(args).update({**meta['args'], 'epochs': given.get('epochs', meta['args']['epochs'])})
    torch.manual_seed(args.seed)
    hierarchy, splits = data.load_data(args.data, args.data_dir)
    docs = splits['train']
    if args.train_fraction < 1:
        keep = np.random.default_rng(args.seed).permutation(len(docs))
        docs = [docs[i] for i in sorted(keep[:math.ceil(args.train_fraction * len(docs))])]
    info = {'args': {k: getattr(args, k) for k in [*DEFAULTS, 'data', 'data_dir']},
            'data': digest(hierarchy, docs)}
    if args.resume:
        if meta['data'] != info['data']:
            raise ValueError(f'--resume: the labels or training documents of --data {args.data} '
                             f"differ from the run's ({meta['data']['n']} training documents then, "
                             f'{len(docs)} now); start a new run')
        history, extra = meta['history'], meta['extra']  # the epochs' metrics lines, last/'s extras
    else:
        history, extra = [], {}
        mlm, tokenizer = (data.tiny_bert([t for t, _ in docs] + hierarchy.names)
                          if args.model == 'tiny' else data.load_pretrained(args.model))
        model = lhmix.build_model(mlm, tokenizer, hierarchy, args.arch, args.max_length)
    if ((len(history) >= args.epochs or since_best(history) >= args.early_stop)
            and os.path.exists(os.path.join(out, evaluate.TEST_METRICS))):
        return print(f'--resume: {out} is finished ({len(history)} epochs); nothing to do',
                     file=sys.stderr)
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

    model.to(device)
    graphs = device.type == 'cuda' and not args.no_cuda_graphs
    why_not = graphs and cuda_graphs_unavailable(device)
    if why_not:
        print(f'CUDA graphs off: {why_not}', file=sys.stderr)
        graphs = False
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, fused=device.type == 'cuda',
                           capturable=graphs)
    if history:  # Adam's state, saved as extras adam.<parameter>.<name>
        state = {}
        for key, v in extra.items():
            if key.startswith('adam.'):
                _, i, name = key.split('.')
                state.setdefault(int(i), {})[name] = v
        opt.load_state_dict({'state': state, 'param_groups': opt.state_dict()['param_groups']})
    table, rows = extra.get('table'), extra.get('rows')
    if args.mix == 'lhmix' and table is None:  # the initial encoder, frozen (Sec. 4.1)
        table, rows = lhmix.local_hierarchy_table(model, tokenizer, gold['train'])
        print(f'{len(table)} distinct local hierarchies encoded')
    if table is not None:  # the table on the device, each document's row on the host
        table, rows = table.to(device), rows.cpu()
    step = make_step(model, opt, graphs, table, args.alpha, args.beta)

    steps = -(-len(docs) // args.batch)  # one bar for the run, off when not a terminal
    with tqdm(total=steps * max(args.epochs - len(history), 0), disable=None) as bar:
        for epoch in range(len(history), args.epochs):
            if since_best(history) >= args.early_stop:
                tqdm.write(f'early stop: dev macro-F1 not improved for {args.early_stop} epochs')
                break
            t0 = time.time()
            loss, lam = train_epoch(model, step, tokens['train'], gold['train'], rows, args,
                                    epoch, bar)
            seconds = time.time() - t0
            dev = evaluate.f1_scores(lhmix.score_documents(model, tokens['dev']) > 0, gold['dev'],
                                     len(hierarchy))
            history.append(metrics_line(epoch, loss, dev, lam, seconds, len(docs)))
            if not all(torch.isfinite(p).all() for p in model.parameters()):
                raise FloatingPointError(f'the weights became infinite or NaN in epoch {epoch} '
                                         '(try a lower --lr); this epoch is not saved')
            # best/ if dev macro-F1 improved, metrics.jsonl, then last/: a kill between them
            # re-runs the epoch at --resume. A new run's first epoch is written whole beside
            # --out, then put in place (over an earlier run only now, with --overwrite).
            folder = out if args.resume else f'{out}.new-{os.urandom(4).hex()}'
            try:
                if since_best(history) == 0:
                    data.save_checkpoint(os.path.join(folder, 'best'), model, tokenizer,
                                         {**info, 'epoch': epoch, 'dev': history[-1]})
                data.write_atomically(os.path.join(folder, evaluate.METRICS),
                                      ''.join(json.dumps(h) + '\n' for h in history))
                extra = {f'adam.{i}.{k}': v for i, s in opt.state_dict()['state'].items()
                         for k, v in s.items()}
                if table is not None:
                    extra.update(table=table, rows=rows)
                data.save_checkpoint(os.path.join(folder, 'last'), model, tokenizer,
                                     {**info, 'history': history}, extra)
                if not args.resume:
                    put_in_place(folder, out, args.overwrite)
            finally:  # a new run's first epoch, half-written or refused (nothing once in place)
                if folder != out:
                    shutil.rmtree(folder, ignore_errors=True)
            args.resume = True  # from now on, a run that --resume continues

    # the test figures of the best-dev checkpoint, as evaluate.py computes them
    best, _, meta = data.load_checkpoint(os.path.join(out, 'best'), device)
    result = evaluate.report(lhmix.score_documents(best, tokens['test']) > 0, gold['test'],
                             hierarchy, [ls for _, ls in splits['train']])
    result.update(best_epoch=meta['epoch'], checkpoint=os.path.join(out, 'best'), args=info['args'])
    data.write_atomically(os.path.join(out, evaluate.TEST_METRICS), json.dumps(result, indent=1))
    print(f"test micro-F1 {100 * result['micro_f1']:.2f}  macro-F1 {100 * result['macro_f1']:.2f}"
          f"  (best dev epoch {meta['epoch']}, {out})")


def main(argv=None):
    args, given = parse(argv)
    try:
        train(args, given)
    except KeyboardInterrupt:
        sys.exit('interrupted: resume with --resume' if args.resume
                 else f'interrupted before the first epoch was saved: {args.out} unchanged')
    except torch.OutOfMemoryError:
        sys.exit(f'error: out of GPU memory at --batch {args.batch}; try a smaller --batch')
    except OSError as e:  # disk full, permissions
        sys.exit(f'error: {e.filename or args.out}: {e.strerror or e}')
    except (ValueError, FloatingPointError) as e:
        sys.exit(f'error: {e}')


if __name__ == '__main__':
    main()
