"""Train LH-Mix (or an ablation), then test the best-dev checkpoint.

    python train.py --data demo      # synthetic data and a tiny BERT: about a minute on a CPU
    python train.py --data wos       # bert-base-uncased on WOS, as the paper (downloads WOS)

The run folder (--out) gets metrics.jsonl (a line an epoch), the checkpoints best/ and last/
(loadable after a kill at any instant: --resume continues), test_metrics.json.
"""
import argparse
import functools
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field

if __name__ == '__main__' and not {'OMP_WAIT_POLICY', 'GOMP_SPINCOUNT'} & set(os.environ):
    # OpenMP's idle threads spin briefly, then sleep: a lone run keeps spinning speed, and runs
    # sharing a CPU do not slow each other down many times over. torch's OpenMP (GNU's, on Linux)
    # reads this once, when torch loads; a user's own setting of either variable wins.
    os.environ['GOMP_SPINCOUNT'] = '1000'

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

import data  # noqa: E402
import evaluate  # noqa: E402
import lhmix  # noqa: E402
import runs  # noqa: E402
import speed  # noqa: E402

# What --data demo sets: a tiny BERT that trains in about a minute on a CPU.
DEMO = dict(model='tiny', epochs=12, warmup_epochs=4, lr=1e-3, max_length=128)
MLM_RATE = 0.15  # HPT's MLM loss masks 15% of the text's word-pieces.
# The flags that steer a run without being part of its settings, which a checkpoint keeps.
CONTROL = ('out', 'device', 'resume', 'overwrite', 'no_cuda_graphs')


def within(cast, interval):
    """An argparse type: a finite number in `interval`, such as '(0, 1]', which -h shows."""
    lo, hi = (float(x) for x in interval[1:-1].split(','))

    def number(text):
        x = cast(text)
        if not (math.isfinite(x) and (lo <= x if interval[0] == '[' else lo < x)
                and (x <= hi if interval[-1] == ']' else x < hi)):
            raise argparse.ArgumentTypeError(f'must be in {interval}, got {text}')
        return x
    # argparse names the type in its own message, as in "invalid int value: 'x'".
    number.__name__, number.interval = cast.__name__, interval
    return number


def add_flag(p, *flag, **kw):
    """p.add_argument, with the flag's range, if its type has one, at the end of its help."""
    interval = getattr(kw.get('type'), 'interval', '')
    kw['help'] += f', in {interval}' * bool(interval)
    p.add_argument(*flag, **kw)


def parse(argv=None):
    """Return the arguments, and those that the command line gave."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flag(p, '--data', required=True, help='wos, nyt, rcv1, a folder, or demo: synthetic, with '
             + ', '.join(f"--{k.replace('_', '-')} {v}" for k, v in DEMO.items()))
    add_flag(p, '--data-dir', help='the folder of wos, nyt or rcv1 (default: data/NAME)')
    add_flag(p, '--model', default='bert-base-uncased', help='a BERT-style masked LM, hub id or '
             "folder; tiny: a 2-layer BERT built from the data (default: the paper's "
             '%(default)s, Sec. 5.2)')
    add_flag(p, '--arch', default='prompt', choices=['prompt', 'bert'], help="the paper's prompt, "
             "or Table 3's flat BERT: HGCLR's head (linear on [CLS]) and loss (BCE), trained with "
             "the settings below, not HGCLR's (default: %(default)s)")
    add_flag(p, '--mix', default='lhmix', choices=['lhmix', 'mixup', 'none'],
             help='Table 3 (default: %(default)s)')
    add_flag(p, '--lr', type=within(float, '(0, inf)'), default=3e-5,
             help="Adam's learning rate (default: the paper's %(default)s)")
    add_flag(p, '--warmup-epochs', type=within(int, '[0, inf)'), default=5,
             help="first, without Mixup (default: the paper's %(default)s)")
    add_flag(p, '--early-stop', type=within(int, '[1, inf)'), default=5, help='after so many '
             "epochs without a better dev macro-F1 (default: the paper's %(default)s)")
    add_flag(p, '--epochs', type=within(int, '[1, inf)'), default=100,
             help='at most (default: %(default)s, ours; runs stop early before it)')
    add_flag(p, '--alpha', type=within(float, '(0, inf)'), default=1.0,
             help="Eq. 4 (default: %(default)s, the authors' README command for RCV1)")
    add_flag(p, '--beta', type=within(float, '[0.5, 1]'), default=0.75,
             help='Eq. 4; 0.5 mixes every pair at 0.5 (default: %(default)s, as --alpha)')
    add_flag(p, '--mix-alpha', type=within(float, '(0, inf)'), default=1.0, help="vanilla Mixup's "
             "Beta(a, a), drawn per document (default: %(default)s, Zhang et al.'s, drawn per "
             'batch)')
    add_flag(p, '--batch', type=within(int, '[1, inf)'), default=16,
             help="documents a step (default: HPT's %(default)s)")
    add_flag(p, '--max-length', type=within(int, '[1, inf)'), default=512,
             help="tokens an input (default: HPT's %(default)s)")
    add_flag(p, '--no-mlm', action='store_true',
             help="without HPT's MLM loss (the authors' code has it)")
    add_flag(p, '--train-fraction', type=within(float, '(0, 1]'), default=1.0,
             help='a random part of the training split (Fig. 4; default: %(default)s)')
    add_flag(p, '--seed', type=within(int, '[0, 4294967295]'), default=0,
             help='(default: %(default)s)')
    add_flag(p, '--out', help='the run folder (default: out/DATA-ARCH-MIX-sSEED)')
    runs.add_device(p)
    add_flag(p, '--resume', action='store_true',
             help="continue --out's run, its settings kept (a given --epochs extends it)")
    add_flag(p, '--overwrite', action='store_true',
             help="replace the run in --out, which stays until this run's first epoch is saved")
    add_flag(p, '--no-cuda-graphs', action='store_true', help='run the GPU steps eagerly')
    args = p.parse_args(argv)
    if args.data == 'demo':
        p.set_defaults(**DEMO)
        args = p.parse_args(argv)
    if args.resume and args.overwrite:
        p.error('--resume and --overwrite exclude each other')
    # Parsed again with every default None, the arguments show which flags the user gave.
    p.set_defaults(**dict.fromkeys(vars(args)))
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
    meta: dict          # The settings and the data's digest, saved in every checkpoint.
    tokens: dict        # {split: each document's word-pieces}
    gold: dict          # {split: each document's label ids}
    train_labels: list  # The whole training split's labels, which the frequency quartiles count.
    history: list = field(default_factory=list)  # metrics.jsonl's lines, an epoch each
    # The tensors saved in the checkpoints beside the weights: the initial label embeddings (for
    # tools/similar.py), and LH-Mix's local-hierarchy table and each training document's row.
    extra: dict = field(default_factory=dict)
    adam: dict = field(default_factory=dict)  # Adam's state, as its state_dict()['state']


def prepare(args, given, folder):
    """Return the run's model, data and state. At --resume the run keeps its own settings, but
    a given --epochs, and says which given flags it ignores."""
    state = {}
    if args.resume:
        model, tokenizer, last = folder.load_last()
        saved = last['args']
        state = {'history': last['history'], 'extra': last['extra'], 'adam': last['adam']}
        for k, v in given.items():
            if k in saved and k != 'epochs' and v != saved[k]:
                print(f'--resume: the run keeps its saved --{k.replace("_", "-")} {saved[k]} '
                      f'(not {v})', file=sys.stderr)
        args = argparse.Namespace(**{**vars(args), **saved,
                                     'epochs': given.get('epochs', saved['epochs'])})
    torch.manual_seed(args.seed)
    hierarchy, splits = data.load_data(args.data, args.data_dir)
    used = dict(splits)
    if args.train_fraction < 1:  # Fig. 4's sparse data: a random part of the training split
        keep = np.random.default_rng(args.seed).permutation(len(splits['train']))
        # The count is rounded up, after rounding off float error: 0.07 * 1200 is 84.00000000000001.
        n = math.ceil(round(args.train_fraction * len(keep), 9))
        used['train'] = [splits['train'][i] for i in sorted(keep[:n])]
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
        if isinstance(model, lhmix.LHMix):  # The verbalizer as it starts: tools/similar.py
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


# One step: zero the gradients, forward, backward, Adam's update

def make_optimizer(model, lr, capturable, state=None):
    """Return (Adam, its loss scaler), continuing from Adam's `state` when one is given.
    `capturable` keeps Adam's step count on the GPU, as a CUDA graph needs."""
    cuda = next(model.parameters()).is_cuda
    opt = torch.optim.Adam(model.parameters(), lr=lr, fused=cuda, capturable=capturable)
    opt.load_state_dict({'state': state or {}, 'param_groups': opt.state_dict()['param_groups']})
    # fp16, on a GPU without bf16 (which runs no CUDA graphs), needs its loss scaled so that
    # small gradients do not round to 0; the scale starts afresh at --resume.
    scaler = torch.amp.GradScaler(enabled=cuda and not torch.cuda.is_bf16_supported())
    # Every gradient is allocated here, once, and zeroed in place by every step: a CUDA graph
    # then writes the same memory at every replay, and every step, graphed or eager, updates a
    # weight that its batch leaves unused as one with gradient 0, even one no batch used yet.
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    return opt, scaler


def train_step(model, opt, scaler, batch):
    """Takes one training step on a batch from lhmix.make_batch; returns (loss, lambda or None).
    Nothing here waits for the GPU, so on a GPU a CUDA graph captures this whole function and
    replays it."""
    opt.zero_grad(set_to_none=False)
    with lhmix.autocast(batch['input_ids'].device):
        loss, lam = model(**batch)
    scaler.scale(loss).backward()
    scaler.step(opt)  # This is opt.step() unless fp16's loss scaling is on.
    scaler.update()
    return loss.detach(), lam


# One epoch, the dev figures, the epochs (fit), the test

def train_epoch(run, step, epoch, bar):
    """Trains an epoch; returns (mean loss, lambdas or None). Mixup's batches are random:
    graphed steps pack them into one row, eager steps pad them, because nested tensors' Python
    dispatch costs an eager step more than the padding does."""
    args, model, tokens, gold = run.args, run.model, run.tokens['train'], run.gold['train']
    device = next(model.parameters()).device
    # Each epoch draws from streams of its own, so that a resumed run draws as an unbroken one.
    rng = np.random.default_rng([args.seed, epoch])
    torch.manual_seed(args.seed * 100003 + epoch)
    mixing = args.mix != 'none' and epoch >= args.warmup_epochs
    mlm_rate = MLM_RATE if model.mlm_term and not args.no_mlm else 0.0
    model.train()
    total, lams = torch.zeros((), device=device), []
    graphed = isinstance(step, speed.CUDAGraphs)
    batches = lhmix.train_batches([len(t) for t in tokens], args.batch, rng, mixing)
    for idx, partner in batches:
        batch = lhmix.make_batch(model, [tokens[i] for i in idx], [gold[i] for i in idx], rng,
                                 mlm_rate, speed.pack_row if mixing and graphed else lhmix.pad_rows)
        if graphed:
            speed.pad_for_graphs(batch, mlm_rate)
        if mixing:
            batch['partner'] = torch.from_numpy(partner)
            if args.mix == 'lhmix':
                batch['hierarchy_ids'] = run.extra['hierarchy_ids'][idx]
            else:
                batch['lam'] = lhmix.vanilla_mixup_ratio(rng, args.mix_alpha, len(idx))
        loss, lam = step(lhmix.to_device(batch, device))
        total += loss  # Summed on the device, so that no step waits for the GPU.
        if lam is not None:
            lams.append(lam.clone())  # A graph's next replay overwrites its output.
        bar.update(1)
    loss = total.item() / len(batches)
    if not math.isfinite(loss):
        raise FloatingPointError(f'the training loss became {loss} in epoch {epoch} (try a lower '
                                 '--lr); this epoch is not saved')
    return loss, torch.cat(lams).double().cpu().numpy() if lams else None
def since_best(history):
    """Return the epochs since the best dev macro-F1 (the first of equal ones)."""
    f1 = [h['dev_macro_f1'] for h in history]
    return len(f1) - 1 - int(np.argmax(f1)) if f1 else 0


def evaluate_dev(run, epoch, loss, lam, seconds):
    """Scores the dev split and prints the epoch's line; returns it as metrics.jsonl keeps it,
    with the mixing ratios used as quantiles."""
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
    """Trains until --epochs or early stopping, saving every epoch. LH-Mix's local hierarchies
    are encoded first, once, by the encoder as it starts (Sec. 4.1)."""
    args, model, extra = run.args, run.model, run.extra
    if args.mix == 'lhmix':
        if 'table' not in extra:
            extra['table'], extra['hierarchy_ids'] = lhmix.local_hierarchy_table(
                model, run.tokenizer, run.gold['train'])
            print(f"{len(extra['table'])} distinct local hierarchies encoded")
        lhmix.use_local_hierarchies(model, extra['table'], args.alpha, args.beta)
    why_not = speed.cuda_graphs_unavailable(args.device)
    if why_not and args.device.type == 'cuda' and not args.no_cuda_graphs:
        print(f'CUDA graphs off: {why_not}', file=sys.stderr)
    graphed = not (why_not or args.no_cuda_graphs)
    opt, scaler = make_optimizer(model, args.lr, graphed, run.adam)
    step = functools.partial(train_step, model, opt, scaler)
    if graphed:
        speed.use_packed_rows(model)
        step = speed.CUDAGraphs(step)
    steps = -(-len(run.tokens['train']) // args.batch)
    with tqdm(total=steps * max(args.epochs - len(run.history), 0), disable=None) as bar:
        for epoch in range(len(run.history), args.epochs):
            if since_best(run.history) >= args.early_stop:
                tqdm.write(f'early stop: dev macro-F1 not improved for {args.early_stop} epochs')
                break
            t0 = time.time()
            loss, lam = train_epoch(run, step, epoch, bar)
            run.history.append(evaluate_dev(run, epoch, loss, lam, time.time() - t0))
            if not all(torch.isfinite(p).all() for p in model.parameters()):
                raise FloatingPointError(f'the weights became infinite or NaN in epoch {epoch} '
                                         '(try a lower --lr); this epoch is not saved')
            run.folder.save(model, run.tokenizer, run.meta, run.history, extra, opt,
                            improved=since_best(run.history) == 0)


def test(run):
    """The best-dev checkpoint's test figures, as evaluate.py computes them."""
    best, _, meta = runs.load_checkpoint(os.path.join(run.folder.path, 'best'), run.args.device)
    result = evaluate.report(lhmix.score_documents(best, run.tokens['test']) > 0,
                             run.gold['test'], best.hierarchy, run.train_labels)
    result.update(best_epoch=meta['epoch'], checkpoint=os.path.join(run.args.out, 'best'),
                  args=run.meta['args'])
    runs.write_whole(os.path.join(run.folder.path, runs.TEST_METRICS),
                     json.dumps(result, indent=1))
    print(f"test micro-F1 {100 * result['micro_f1']:.2f}  macro-F1 {100 * result['macro_f1']:.2f}"
          f"  (best dev epoch {meta['epoch']}, {run.args.out})")


def train(args, given):
    """The run in --out, from the start or from where it stopped, then its test."""
    with runs.RunFolder(args.out, args.resume, args.overwrite) as folder:
        run = prepare(args, given, folder)
        args = run.args
        if ((len(run.history) >= args.epochs or since_best(run.history) >= args.early_stop)
                and os.path.exists(os.path.join(folder.path, runs.TEST_METRICS))):
            print(f'--resume: {args.out} is finished ({len(run.history)} epochs); nothing to do',
                  file=sys.stderr)
            return
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
