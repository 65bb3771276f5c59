"""Train LH-Mix (or one of the paper's ablations) and test the best-dev checkpoint.

    python train.py --data demo                      # synthetic data + tiny BERT, about a minute on a CPU
    python train.py --data wos --data-dir data/wos   # the paper's setting (bert-base-uncased)

Writes OUT/metrics.jsonl (a line per epoch), OUT/best/ and OUT/last/ (checkpoints that survive a
kill at any instant) and OUT/test_metrics.json, and prints the test figures of the best-dev checkpoint.
"""
import argparse
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

# The paper's settings (Sec. 5.2): bert-base-uncased, Adam at 3e-5, batch 16, 5 epochs without Mixup
# first, early stopping after 5 epochs without a better dev macro-F1, alpha 1 and beta 0.75 for Eq. 4.
PAPER = dict(model='bert-base-uncased', arch='prompt', mix='lhmix', alpha=1.0, beta=0.75, mix_alpha=1.0,
             warmup_epochs=5, epochs=100, early_stop=5, batch=16, lr=3e-5, max_length=512, seed=0, train_fraction=1.0)
DEMO = dict(model='tiny', epochs=12, warmup_epochs=4, lr=1e-3, max_length=128)  # --data demo: a minute on a CPU
MLM_RATE = 0.15  # HPT's auxiliary MLM loss masks 15% of the text word-pieces
RESUMABLE = ('epochs', 'device')  # what --resume may change; every other argument is the run's own


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--data', required=True, help='wos | nyt | rcv1 | demo | PATH to a HiAGM-format folder')
    p.add_argument('--data-dir', help='where the data set lies (default data/wos, data/nyt, data/rcv1)')
    p.add_argument('--model', help="HF id or local folder, or 'tiny' (a small BERT built here)")
    p.add_argument('--arch', choices=['prompt', 'bert'], help='hierarchical prompt (the paper) or the flat [CLS] ablation')
    p.add_argument('--mix', choices=['none', 'mixup', 'lhmix'],
                   help='no Mixup, vanilla Mixup (Beta ratio) or LH-Mix (hierarchy-similarity ratio)')
    p.add_argument('--alpha', type=float, help='alpha of Eq. 4 (> 0)')
    p.add_argument('--beta', type=float, help='beta of Eq. 4, in (0.5, 1]')
    p.add_argument('--mix-alpha', type=float, help='a of Beta(a, a) for vanilla Mixup (> 0)')
    p.add_argument('--warmup-epochs', type=int, help='epochs without Mixup first')
    p.add_argument('--epochs', type=int, help='at most this many epochs')
    p.add_argument('--early-stop', type=int, help='patience in epochs on dev macro-F1')
    p.add_argument('--batch', type=int, help='documents per batch (even with Mixup: it pairs them)')
    p.add_argument('--lr', type=float, help='Adam learning rate')
    p.add_argument('--max-length', type=int, help='tokens per input, template included')
    p.add_argument('--no-mlm', action='store_true', help="drop HPT's auxiliary MLM loss (prompt arch)")
    p.add_argument('--seed', type=int)
    p.add_argument('--train-fraction', type=float, help='train on this seeded share, in (0, 1] (Fig. 3)')
    p.add_argument('--out', help='output folder (default out/DATA-ARCH-MIX-sSEED)')
    p.add_argument('--resume', action='store_true', help='continue from OUT/last after a crash')
    p.add_argument('--overwrite', action='store_true', help='replace an earlier run in OUT')
    p.add_argument('--device', help='cpu, cuda or cuda:N (default: cuda when there is one)')
    p.add_argument('--no-cuda-graphs', action='store_true',
                   help='run the training steps and dev evaluation eagerly on CUDA instead of replaying them '
                        'from CUDA graphs (one captured per batch shape)')
    args = p.parse_args(argv)
    args.given = sorted(k for k in PAPER if getattr(args, k) is not None)  # for --resume's report
    for k, v in {**PAPER, **(DEMO if args.data == 'demo' else {})}.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    for flag in ('alpha', 'beta', 'mix_alpha', 'lr', 'train_fraction'):
        if not math.isfinite(getattr(args, flag)):
            p.error(f"--{flag.replace('_', '-')} must be a finite number, got {getattr(args, flag)}")
    checks = [('alpha', args.alpha > 0, '> 0'), ('beta', 0.5 < args.beta <= 1, 'in (0.5, 1]'),
              ('mix_alpha', args.mix_alpha > 0, '> 0'), ('lr', args.lr > 0, '> 0'),
              ('train_fraction', 0 < args.train_fraction <= 1, 'in (0, 1]'), ('epochs', args.epochs >= 1, '>= 1'),
              ('early_stop', args.early_stop >= 1, '>= 1'), ('warmup_epochs', args.warmup_epochs >= 0, '>= 0'),
              ('batch', args.batch >= (1 if args.mix == 'none' else 2), '>= 1 (>= 2 with Mixup)'),
              ('max_length', args.max_length >= 1, '>= 1')]
    for flag, ok, what in checks:
        if not ok:
            p.error(f"--{flag.replace('_', '-')} must be {what}, got {getattr(args, flag)}")
    if args.mix != 'none' and args.batch % 2:
        p.error(f'--batch must be even with Mixup (documents are mixed in pairs), got {args.batch}')
    args.device = str(evaluate.parse_device(p, args.device))
    args.out = args.out or os.path.join('out', f'{os.path.basename(args.data.rstrip("/"))}-{args.arch}-{args.mix}-s{args.seed}')
    problem = evaluate.output_problem(os.path.join(args.out, evaluate.METRICS))  # the folder is made later
    if problem:
        p.error(f'--out {args.out}: {problem}')
    if args.resume and args.overwrite:
        p.error('--resume and --overwrite exclude each other')
    if not args.resume and not args.overwrite and os.path.isdir(args.out) and os.listdir(args.out):
        p.error(f'--out {args.out}: holds an earlier run; continue it with --resume, replace it with '
                '--overwrite, or choose another --out')
    return args


def resume_args(args):
    """--resume continues the run as it was started: its saved arguments replace the command line's
    (only RESUMABLE may change); anything given differently is reported."""
    last = os.path.join(args.out, 'last')
    if not os.path.lexists(last):
        raise FileNotFoundError(f'--resume: {last} does not exist, nothing to continue (the run did not save an '
                                'epoch); start it again with --overwrite')
    meta = lhmix.read_checkpoint_meta(last)
    saved = meta.get('args')
    if not isinstance(saved, dict) or lhmix.TRAIN_STATE not in meta['files']:
        raise ValueError(f'{last}: not a checkpoint train.py can resume (no saved arguments or train_state.pt)')
    if saved.get('zmlce_rows', 'depth') != 'depth':  # the authors' ZMLCE rows, an option until e6a521d
        raise ValueError(f'{last}: trained with --zmlce-rows {saved["zmlce_rows"]}, which this version no longer '
                         'has; resume it with commit e6a521d')
    for k in [k for k in args.given if k not in RESUMABLE] + ['data', 'data_dir']:
        if getattr(args, k) != saved.get(k):
            print(f'--resume: the run keeps its saved --{k.replace("_", "-")} {saved.get(k)} (not {getattr(args, k)})')
    vars(args).update({k: v for k, v in saved.items() if k in PAPER and k not in RESUMABLE
                       or k in ('data', 'data_dir', 'no_mlm')})
    return meta


def setup(args):
    """Everything a user can get wrong is checked here, before anything is written."""
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    meta = resume_args(args) if args.resume else None
    hierarchy, splits = data.load_data(args.data, args.data_dir)
    train = splits['train']
    if args.train_fraction < 1:
        keep = np.random.default_rng(args.seed).permutation(len(train))[:math.ceil(args.train_fraction * len(train))]
        train = [train[i] for i in sorted(keep)]
    if args.resume:
        model, tokenizer, _ = lhmix.load_checkpoint(os.path.join(args.out, 'last'), hierarchy=hierarchy)
    else:
        mlm, tokenizer = (data.tiny_bert([t for t, _ in train] + hierarchy.names) if args.model == 'tiny'
                          else data.load_pretrained(args.model))
        model = lhmix.build_model(mlm, tokenizer, hierarchy, args.arch, args.max_length)
    max_text = model.text_budget(args.max_length)
    if not 0 < max_text <= model.text_budget(model.mlm.config.max_position_embeddings):
        raise ValueError(f'--max-length {args.max_length} leaves {max_text} text tokens for this model '
                         f'(at most {model.mlm.config.max_position_embeddings} positions)')
    if args.mix != 'none' and args.epochs <= args.warmup_epochs:
        print(f'warning: --epochs {args.epochs} <= --warmup-epochs {args.warmup_epochs}: Mixup never starts')
    tokens, cut = {}, {}
    for name, docs in (('train', train), ('dev', splits['dev']), ('test', splits['test'])):
        tokens[name], cut[name] = lhmix.tokenize(tokenizer, [t for t, _ in docs], max_text)
    print(f'{len(hierarchy)} labels, depth {hierarchy.num_depths}; documents '
          + ', '.join(f'{k} {len(v)}' for k, v in tokens.items()) + f'; cut to --max-length {args.max_length}: '
          + ', '.join(f'{k} {cut[k]}' for k in tokens))
    model.to(device)
    graphs = device.type == 'cuda' and not args.no_cuda_graphs
    why_not = graphs and cuda_graphs_unavailable(device)
    if why_not:
        print(f'CUDA graphs off: {why_not}')
        graphs = False
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, fused=device.type == 'cuda', capturable=graphs)
    scaler = torch.amp.GradScaler(device.type, enabled=device.type == 'cuda' and not torch.cuda.is_bf16_supported())
    run = argparse.Namespace(args=args, device=device, hierarchy=hierarchy, model=model, tokenizer=tokenizer,
                             opt=opt, scaler=scaler, graphs=graphs, tokens=tokens, labels=[ls for _, ls in train],
                             dev_gold=[ls for _, ls in splits['dev']], test_gold=[ls for _, ls in splits['test']],
                             all_train=[ls for _, ls in splits['train']], table=None, rows=None, history=[],
                             state={'epoch': 0, 'best': -1.0, 'bad_epochs': 0})
    if args.resume:
        path = os.path.join(args.out, 'last', lhmix.TRAIN_STATE)
        try:  # checked by its hash already: an error here is a file this version did not write
            saved = torch.load(path, map_location='cpu', weights_only=True)
            opt.load_state_dict(saved['optimizer'])
            for group in opt.param_groups:  # as this run's device needs, not as saved
                group.update(fused=device.type == 'cuda', capturable=graphs)
            for p, state in opt.state.items():  # fused Adam counts its steps on the weights' device
                state['step'] = state['step'].to(p.device)
            scaler.load_state_dict(saved['scaler'])
            run.table, run.rows, run.state = saved.get('table'), saved.get('rows'), meta['state']
        except Exception as e:  # unpickling, a missing key or a wrong shape: one line, not a traceback
            raise ValueError(f'{path}: cannot be read ({type(e).__name__}: {" ".join(str(e).split())})') from None
        path = os.path.join(args.out, evaluate.METRICS)
        run.history = []
        with open(path, encoding='utf-8') as f:
            for n, line in enumerate(f, 1):
                try:
                    h = json.loads(line)
                    if h['epoch'] < run.state['epoch']:
                        run.history.append(h)
                except (ValueError, KeyError, TypeError):
                    raise ValueError(f'{path}:{n}: not a metrics line (corrupt file)') from None
        for name in ('best', 'last'):  # all checked: now remove what a kill during a save left
            tidy_checkpoint(os.path.join(args.out, name))
    elif args.mix == 'lhmix':  # the initial encoder, frozen: encode every local hierarchy once (Sec. 4.1)
        run.table, run.rows = lhmix.local_hierarchy_table(model, tokenizer, run.labels)
        print(f'{len(run.table)} distinct local hierarchies encoded')
    run.step = make_step(model, opt, scaler, graphs)
    run.score_graphs = CUDAGraphs(model.label_scores) if graphs else None
    return run


def cuda_graphs_unavailable(device):
    """Why CUDA graphs cannot run the steps on `device`, or None when they can."""
    import transformers
    if device.type != 'cuda':
        return 'not a CUDA device'
    if not torch.cuda.is_bf16_supported():
        return 'no bf16 on this GPU (fp16 needs a loss scaler that syncs)'
    if int(transformers.__version__.split('.')[0]) < 5:  # 4.x tests the attention mask for padding on the host
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
        self.fn, self.warmup, self.graphs, self.pool = fn, warmup or fn, {}, torch.cuda.graph_pool_handle()

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


def make_step(model, opt, scaler, graphs):
    """step(**batch) -> the batch's loss (a device scalar: no host sync): forward, backward, Adam.
    With `graphs`, each batch shape's step is captured once as a CUDA graph and replayed after
    (CUDAGraphs); the gradients then stay allocated, zeroed inside the graph."""
    device = next(model.parameters()).device

    def forward_backward(**batch):
        with lhmix.autocast(device):
            loss = model(**batch)
        scaler.scale(loss).backward()
        return loss.detach()

    def step(**batch):
        opt.zero_grad(set_to_none=True)
        loss = forward_backward(**batch)
        scaler.step(opt)
        scaler.update()
        return loss

    if not graphs:
        return step
    params = [p for g in opt.param_groups for p in g['params']]
    for p in params:
        p.grad = torch.zeros_like(p)
    if any(not opt.state[p] for p in params):  # Adam's state made outside the graph: a step on zero
        with warnings.catch_warnings():          # gradients moves no weight; its step count is undone
            warnings.simplefilter('ignore')      # (the warning that this step is not captured)
            opt.step()
        for p in params:
            opt.state[p]['step'].zero_()

    def graphed(**batch):
        torch._foreach_zero_([p.grad for p in params])
        loss = forward_backward(**batch)
        opt.step()
        return loss
    return CUDAGraphs(graphed, warmup=forward_backward)


def train_epoch(run, epoch, bar):
    """One pass over the training set; returns the epoch's metrics line (dev F1 included)."""
    args, model, device = run.args, run.model, run.device
    rng = np.random.default_rng([args.seed, epoch])  # per-epoch streams make --resume repeatable
    torch.manual_seed(args.seed * 100003 + epoch)
    mixing = args.mix != 'none' and epoch >= args.warmup_epochs
    mlm_rate = 0.0 if args.no_mlm or args.arch == 'bert' else MLM_RATE
    multiple = lhmix.pad_multiple(device)
    model.train()
    t0, total, lams = time.time(), torch.zeros((), device=device), []
    batches = lhmix.train_batches([len(t) for t in run.tokens['train']], args.batch, rng, paired=mixing)
    for idx, partner in batches:
        batch = lhmix.make_batch(model, [run.tokens['train'][i] for i in idx], [run.labels[i] for i in idx],
                                 multiple, rng, mlm_rate, static=run.graphs)
        if mixing:  # partners and ratios ride with the batch to the GPU
            hier = run.table[run.rows[idx]] if args.mix == 'lhmix' else None  # cached local hierarchies
            batch['partner'] = partner
            batch['lam'] = lhmix.pair_ratios(args.mix, partner, hier, args.alpha, args.beta, args.mix_alpha)
            lams.append(batch['lam'])
        total += run.step(**lhmix.to_device(batch, device))  # summed on the device: no host sync in the loop
        bar.update(1)
    seconds = time.time() - t0
    train_loss = total.item() / len(batches)
    if not math.isfinite(train_loss):
        raise FloatingPointError(f'the training loss became {train_loss} in epoch {epoch} (try a lower --lr); '
                                 'this epoch is not saved')
    scores = lhmix.score_documents(model, run.tokens['dev'], scorer=run.score_graphs)
    dev = evaluate.f1_scores(scores > 0, run.dev_gold, len(run.hierarchy))
    line = {'epoch': epoch, 'mix': mixing, 'train_loss': train_loss, 'dev_micro_f1': dev['micro_f1'],
            'dev_macro_f1': dev['macro_f1'], 'seconds': round(seconds, 2),
            'samples_per_s': round(len(run.tokens['train']) / seconds, 1)}
    if lams:  # the ratios actually used, for the README's lambda distribution
        lam = torch.cat(lams).double().numpy()
        line['lambda'] = {'mean': float(lam.mean()),
                          'quantiles': dict(zip(('0', '5', '25', '50', '75', '95', '100'),
                                                np.quantile(lam, [0, .05, .25, .5, .75, .95, 1]).tolist()))}
    return line


def _fsync(path):  # a file or a folder
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _crash_point(step, folder):
    """For the tests: LHMIX_CRASH_AT=step, or name:step for the folder `name` only, kills a save there."""
    if os.environ.get('LHMIX_CRASH_AT') in (step, f'{os.path.basename(folder)}:{step}'):
        os.kill(os.getpid(), 9)


def save_atomically(folder, model, tokenizer, info, train_state=None):
    """lhmix.save_checkpoint into a new version folder `folder.ckpt-*`, its files given the umask's
    modes and synced, then the symbolic link `folder` switched to it by one atomic rename and older
    versions removed: a kill at any instant leaves the old checkpoint or the new one whole."""
    folder = os.path.abspath(folder)
    parent, base = os.path.split(folder)
    version = os.path.join(parent, f'{base}.ckpt-{os.urandom(6).hex()}')
    try:
        lhmix.save_checkpoint(version, model, tokenizer, info, train_state)
        mask = os.umask(0)
        os.umask(mask)
        for path in [os.path.join(version, f) for f in os.listdir(version)] + [version]:
            os.chmod(path, (0o777 if path == version else 0o666) & ~mask)  # safetensors writes 0600
            _fsync(path)
    except BaseException:
        shutil.rmtree(version, ignore_errors=True)
        raise
    _crash_point('written', folder)
    if os.path.lexists(folder + '.link'):
        os.remove(folder + '.link')
    os.symlink(os.path.basename(version), folder + '.link')
    _crash_point('linked', folder)
    if os.path.isdir(folder) and not os.path.islink(folder):  # a plain folder (copied by hand): set aside
        os.replace(folder, f'{folder}.ckpt-{os.urandom(6).hex()}')
    os.replace(folder + '.link', folder)  # atomic: `folder` names the old version or the new, never nothing
    _fsync(parent)
    _crash_point('switched', folder)
    tidy_checkpoint(folder)


def tidy_checkpoint(folder):
    """Removes what a killed save_atomically left beside `folder`: the temporary link and the version
    folders `folder` does not point to (all of them if it points to none)."""
    folder = os.path.abspath(folder)
    parent, base = os.path.split(folder)
    keep = os.path.basename(os.readlink(folder)) if os.path.islink(folder) else None
    if os.path.lexists(folder + '.link'):
        os.remove(folder + '.link')
    for f in os.listdir(parent) if os.path.isdir(parent) else []:
        if f.startswith(base + '.ckpt-') and f != keep:
            shutil.rmtree(os.path.join(parent, f), ignore_errors=True)


def save_epoch(run, line):
    """best/ when dev macro-F1 improved, metrics.jsonl, then last/ (a kill between them re-runs the
    epoch on --resume and replaces its metrics line)."""
    args, info = run.args, {'args': {k: v for k, v in vars(run.args).items() if k != 'given'}}
    run.history.append(line)
    if line['dev_macro_f1'] > run.state['best']:
        run.state['best'], run.state['bad_epochs'] = line['dev_macro_f1'], 0
        save_atomically(os.path.join(args.out, 'best'), run.model, run.tokenizer,
                        {**info, 'epoch': line['epoch'], 'dev': line})
    else:
        run.state['bad_epochs'] += 1
    evaluate.write_atomically(os.path.join(args.out, evaluate.METRICS), ''.join(json.dumps(h) + '\n' for h in run.history))
    run.state['epoch'] = line['epoch'] + 1
    extra = {'optimizer': run.opt.state_dict(), 'scaler': run.scaler.state_dict()}
    if run.table is not None:
        extra.update(table=run.table, rows=run.rows)
    save_atomically(os.path.join(args.out, 'last'), run.model, run.tokenizer, {**info, 'state': run.state}, extra)


def finish(run):
    """The test figures of the best-dev checkpoint, as evaluate.py computes them."""
    args = run.args
    best, _, meta = lhmix.load_checkpoint(os.path.join(args.out, 'best'), run.device)
    pred = lhmix.score_documents(best, run.tokens['test']) > 0
    result = evaluate.report(pred, run.test_gold, run.hierarchy, run.all_train)
    result.update(best_epoch=meta['epoch'], checkpoint=os.path.join(args.out, 'best'))
    evaluate.write_atomically(os.path.join(args.out, evaluate.TEST_METRICS), json.dumps(result, indent=1))
    print(f"test micro-F1 {100 * result['micro_f1']:.2f}  macro-F1 {100 * result['macro_f1']:.2f}  "
          f"(best dev epoch {meta['epoch']}, {args.out})")


def check_weights(run, epoch):
    """A finite loss can still leave infinite or NaN weights after the epoch's last step: never saved."""
    if not all(torch.isfinite(p).all() for p in run.model.parameters()):
        raise FloatingPointError(f'the weights became infinite or NaN in epoch {epoch} (try a lower --lr); '
                                 'this epoch is not saved')


def claim_out(run):
    """Makes --out (replacing an earlier run with --overwrite) just before the first save, so that a
    run that fails before it has an epoch to save leaves --out as it was."""
    args = run.args
    if args.overwrite and os.path.lexists(args.out):
        shutil.rmtree(args.out)
    os.makedirs(args.out, exist_ok=True)
    run.claimed = True


def main(argv=None):
    args = parse(argv)
    try:
        run = setup(args)
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f'error: {e}')
    run.claimed = args.resume
    steps = -(-len(run.tokens['train']) // args.batch)
    # one bar for the run (stderr); off when stderr is not a terminal, where the epoch lines say it all
    with tqdm(total=steps * (args.epochs - run.state['epoch']), desc='train', disable=None, dynamic_ncols=True) as bar:
        for epoch in range(run.state['epoch'], args.epochs):
            if run.state['bad_epochs'] >= args.early_stop:
                tqdm.write(f'early stop: dev macro-F1 has not improved for {args.early_stop} epochs')
                break
            try:
                line = train_epoch(run, epoch, bar)
            except FloatingPointError as e:
                sys.exit(f'error: {e}')
            tqdm.write(f"epoch {epoch:3d}  loss {line['train_loss']:.4f}  dev micro-F1 {100 * line['dev_micro_f1']:.2f}  "
                       f"macro-F1 {100 * line['dev_macro_f1']:.2f}  {line['seconds']:.1f} s"
                       + (f"  mixup, mean lambda {line['lambda']['mean']:.3f}" if line['mix'] else ''))
            try:
                check_weights(run, epoch)
                if not run.claimed:
                    claim_out(run)
                save_epoch(run, line)  # lhmix.save_checkpoint refuses non-finite weights
            except FloatingPointError as e:
                sys.exit(f'error: {e}')
    finish(run)


if __name__ == '__main__':
    main()
