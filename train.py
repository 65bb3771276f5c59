"""Train LH-Mix (or an ablation), then test the best-dev checkpoint. The run folder (--out) gets
metrics.jsonl (a line an epoch), the checkpoints best/ and last/ (loadable after a kill at any
instant: --resume continues), test_metrics.json.

    python train.py --data demo      # synthetic data, a tiny BERT: for a CPU (README: Performance)
    python train.py --data wos       # bert-base-uncased on WOS, as the paper (downloads WOS)
"""
import argparse
import functools
import json
import math
import os
import sys
import time

if __name__ == '__main__' and not {'OMP_WAIT_POLICY', 'GOMP_SPINCOUNT'} & set(os.environ):
    # OpenMP's idle threads spin briefly, then sleep: a lone run keeps spinning speed, and runs
    # sharing a CPU do not stall each other. torch's OpenMP (GNU's) reads it as torch loads.
    os.environ['GOMP_SPINCOUNT'] = '1000'

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

import data  # noqa: E402
import evaluate  # noqa: E402
import lhmix  # noqa: E402
import runs  # noqa: E402
import speed  # noqa: E402

# The defaults: the paper's (Sec. 5.2), else the authors' README command for RCV1, HPT's, or ours.
DEFAULTS = dict(
    model='bert-base-uncased',     # the paper's (Sec. 5.2)
    arch='prompt',                 # the paper's prompt; 'bert': Table 3's flat BERT (HGCLR's)
    mix='lhmix',                   # Table 3's rows: 'lhmix', 'mixup' or 'none' (Prompt, BERT)
    lr=3e-5,                       # the paper's Adam (Sec. 5.2)
    warmup_epochs=5,               # the paper's first step, without Mixup (Sec. 5.2)
    early_stop=5,                  # the paper's: epochs without a better macro-F1 (Sec. 5.2)
    epochs=100,                    # ours: runs stop early before it
    alpha=1.0,                     # Eq. 4: the authors' README command for RCV1
    beta=0.75,                     # Eq. 4: the same command
    mix_alpha=1.0,                 # + Mixup's Beta(a, a): Zhang et al.'s Mixup
    batch=16,                      # the authors' README command, as HPT's README (its train.py: 2)
    max_length=512,                # HPT's
    no_mlm=False,                  # HPT's MLM term is on, as in the authors' code
    train_fraction=1.0,            # all of the training split; Fig. 4 takes less
    seed=0,
)
# --model tiny (a 2-layer BERT of the data; --data demo is it) learns faster, on less. Its stop
# waits longer: an epoch is a few steps, and dev macro-F1 can stay 0 for over 5 epochs.
TINY = dict(lr=1e-3, warmup_epochs=4, max_length=128, early_stop=20)
DEMO = dict(model='tiny', epochs=12)
# Each number's range, shown by -h, checked by parse() (NaN fails each; lhmix checks --max-length).
POSITIVE, COUNT = ('> 0', lambda x: 0 < x < math.inf), ('>= 1', lambda x: x >= 1)
VALID = dict(lr=POSITIVE, alpha=POSITIVE, mix_alpha=POSITIVE, epochs=COUNT, early_stop=COUNT,
             batch=COUNT, warmup_epochs=('>= 0', lambda x: x >= 0),
             beta=('in [0.5, 1]', lambda x: 0.5 <= x <= 1),
             train_fraction=('in (0, 1]', lambda x: 0 < x <= 1),
             seed=('in [0, 2^32)', lambda x: 0 <= x < 2 ** 32))
MLM_RATE = 0.15  # HPT's MLM loss masks 15% of the text's word-pieces.
SPREAD = 0.01  # LH-Mix's ratios closer than this to one another are as one ratio (fit warns).
CONTROL = ('out', 'device', 'resume', 'overwrite', 'no_cuda_graphs')  # Not the run's settings.


def note(line):  # Warnings and notes go to stderr, apart from the run's lines on stdout.
    print(line, file=sys.stderr)


def parse(argv):
    """Return the arguments, and those that the command line gave. A setting not given is DEMO's
    with --data demo, TINY's with --model tiny, else DEFAULTS'; each number is checked (VALID)."""
    p = runs.parser(__doc__)

    def flag(name, help, **kw):  # A setting's help ends with its range and defaults.
        key = name[2:].replace('-', '_')
        notes = [VALID[key][0]] if key in VALID else []
        notes += [f'default: {DEFAULTS[key]}'] if key in DEFAULTS and 'action' not in kw else []
        notes += [f'--model tiny: {TINY[key]}'] if key in TINY else []
        p.add_argument(name, default=None, **kw, help=help + f' ({"; ".join(notes)})' * bool(notes))
    flag('--data', 'wos, nyt, rcv1, a folder, or demo (synthetic; --model tiny --epochs 12)',
         required=True)
    flag('--data-dir', 'the folder of wos, nyt or rcv1 (default: data/NAME)')
    flag('--model', 'a masked LM, hub id or folder; tiny: a 2-layer BERT of the data, for a CPU')
    flag('--arch', "the paper's prompt, or Table 3's flat BERT (HGCLR's linear head on [CLS], "
         'BCE)', choices=['prompt', 'bert'])
    flag('--mix', 'Table 3: LH-Mix, vanilla Mixup, or none', choices=['lhmix', 'mixup', 'none'])
    for name, kind, help in (
            ('--lr', float, "Adam's learning rate"), ('--epochs', int, 'at most'),
            ('--warmup-epochs', int, 'the first epochs, without Mixup'),
            ('--early-stop', int, 'epochs without a better dev macro-F1 before a stop'),
            ('--alpha', float, 'Eq. 4'), ('--beta', float, 'Eq. 4; 0.5 mixes every pair at 0.5'),
            ('--mix-alpha', float, "vanilla Mixup's Beta(a, a), drawn per document"),
            ('--batch', int, 'documents a step'), ('--max-length', int, 'tokens an input'),
            ('--train-fraction', float, 'a random part of the training split (Fig. 4)'),
            ('--seed', int, 'the random seed')):
        flag(name, help, type=kind)
    flag('--out', 'the run folder (default: out/DATA-ARCH-MIX-sSEED)')
    runs.add_device(p)
    for name, help in (
            ('--no-mlm', "without HPT's MLM loss (the flat BERT never has it)"),
            ('--resume', "continue --out's run in its settings (a given --epochs extends it)"),
            ('--overwrite', "replace --out's run once this run's first epoch is saved"),
            ('--no-cuda-graphs', 'run the GPU steps eagerly')):
        flag(name, help, action='store_true')
    args = p.parse_args(argv)
    given = {k: v for k, v in vars(args).items() if v is not None}
    demo = DEMO if args.data == 'demo' else {}
    tiny = TINY if given.get('model', demo.get('model')) == 'tiny' else {}
    vars(args).update({**DEFAULTS, **tiny, **demo, **given})
    for key, (want, ok) in VALID.items():
        if not ok(value := getattr(args, key)):
            p.error(f'argument --{key.replace("_", "-")}: must be {want}, got {value}')
    if args.resume and args.overwrite:
        p.error('--resume and --overwrite exclude each other')
    name = os.path.basename(os.path.normpath(args.data))
    args.out = os.path.normpath(args.out or f'out/{name}-{args.arch}-{args.mix}-s{args.seed}')
    return args, given


def prepare(args, given, folder):
    """Return the run: settings, folder, model, data and what its checkpoints keep. At --resume,
    args become the run's settings (a given --epochs extends it); it says which flags it ignores."""
    state = dict(history=[], extra={}, adam={})
    if args.resume:
        model, tokenizer, last = folder.load_last()
        saved = {**last['args'], 'epochs': given.get('epochs', last['args']['epochs'])}
        state = {k: last[k] for k in state}
        for k in [k for k in given if k in saved and given[k] != saved[k]]:
            note(f'--resume: the run keeps its --{k.replace("_", "-")} {saved[k]} (not {given[k]})')
        vars(args).update(saved)
    torch.manual_seed(args.seed)
    hierarchy, splits = data.load_data(args.data, args.data_dir)
    meta = {'args': {k: v for k, v in vars(args).items() if k not in CONTROL},
            'data': runs.digest(hierarchy, splits)}
    if args.resume and last['data'] != meta['data']:
        raise ValueError(f'--resume: the labels, label names or documents of --data {args.data} '
                         "differ from the run's; start a new run")
    used = {**splits, 'train': data.train_part(splits['train'], args.train_fraction, args.seed)}
    gold = {k: [ls for _, ls in docs] for k, docs in used.items()}
    if not args.resume:
        seen = {k: set().union(*ls) for k, ls in gold.items()}
        unseen = [hierarchy.labels[v] for v in sorted((seen['dev'] | seen['test']) - seen['train'])]
        if unseen:  # Scored all the same, they weigh on macro-F1 as any other label.
            note(f'warning: labels in dev or test but in no training document: {len(unseen)} '
                 f'({", ".join(unseen[:5] + ["..."] * (len(unseen) > 5))})')
        mlm, tokenizer = (lhmix.tiny_bert([t for t, _ in used['train']] + hierarchy.names)
                          if args.model == 'tiny' else lhmix.load_pretrained(args.model))
        model = lhmix.build_model(mlm, tokenizer, hierarchy, args.arch, args.max_length)
        if isinstance(model, lhmix.LHMix):  # The verbalizer as it starts: tools/similar.py
            state['extra']['labels_at_init'] = model.label_embeddings().detach().clone()
    tokens = {k: lhmix.tokenize(tokenizer, [t for t, _ in d], model.text_budget(args.max_length))
              for k, d in used.items()}
    print(f'{len(hierarchy)} labels, depth {hierarchy.num_depths}; documents '
          + ', '.join(f'{k} {len(v[0])}' for k, v in tokens.items()) + f'; cut to --max-length '
          f'{args.max_length}: ' + ', '.join(f'{k} {v[1]}' for k, v in tokens.items()))
    return argparse.Namespace(
        args=args, folder=folder, model=model.to(args.device), tokenizer=tokenizer, meta=meta,
        tokens={k: v[0] for k, v in tokens.items()}, train_labels=[ls for _, ls in splits['train']],
        gold=gold, **state)


def train_step(model, opt, scaler, batch):
    """Takes one training step on a batch from lhmix.make_batch; returns (loss, lambda or None).
    Nothing here waits for the GPU: a CUDA graph captures this whole function and replays it."""
    opt.zero_grad(set_to_none=False)
    with lhmix.autocast(batch['input_ids'].device):
        loss, lam = model(**batch)
    scaler.scale(loss).backward()
    scaler.step(opt)  # This is opt.step() unless fp16's loss scaling is on.
    scaler.update()
    return loss.detach(), lam


def train_epoch(run, step, graphed, epoch, bar):
    """Trains an epoch; returns (mean loss, lambdas or None). The loss is checked by fit."""
    args, model = run.args, run.model
    # Each epoch draws from streams of its own, so that a resumed run draws as an unbroken one.
    rng = np.random.default_rng([args.seed, epoch])
    torch.manual_seed(args.seed * 100003 + epoch)
    mixing = args.mix != 'none' and epoch >= args.warmup_epochs  # @warm-up
    mlm_rate = MLM_RATE if model.mlm_term and not args.no_mlm else 0.0
    model.train()
    total, lams, steps = torch.zeros((), device=args.device), [], 0
    batches = speed.epoch_batches(
        model, run.tokens['train'], run.gold['train'], args.batch, rng, args.device, mlm_rate,
        mixing, graphed, hierarchy_ids=run.extra.get('hierarchy_ids'),  # LH-Mix's ratios, or
        mix_alpha=args.mix_alpha if args.mix == 'mixup' else None)  # vanilla Mixup's draws
    for steps, batch in enumerate(batches, 1):
        loss, lam = step(batch)
        total += loss  # Summed on the device, so that no step waits for the GPU.
        if lam is not None:
            lams.append(lam.clone())  # A graph's next replay overwrites its output.
        bar.update(1)
    return total.item() / steps, torch.cat(lams).double().cpu().numpy() if lams else None


def evaluate_dev(run, epoch, loss, lam, seconds):
    """Scores dev and prints the epoch's line, with the seconds of training and scoring; returns it
    as metrics.jsonl keeps it, with training documents a second and the mixing ratios' quantiles."""
    t0 = time.time()
    dev = evaluate.f1_scores(lhmix.score_documents(run.model, run.tokens['dev']) > 0,
                             run.gold['dev'], len(run.model.hierarchy))
    dev_seconds = time.time() - t0
    line = {'epoch': epoch, 'mix': lam is not None, 'train_loss': loss,
            **{f'dev_{k}': v for k, v in dev.items()}, 'seconds': round(seconds, 2),
            'dev_seconds': round(dev_seconds, 2),
            'samples_per_s': round(len(run.tokens['train']) / seconds, 1)}
    if lam is not None:
        quantiles = {str(p): float(np.quantile(lam, p / 100)) for p in (0, 5, 25, 50, 75, 95, 100)}
        line['lambda'] = {'mean': float(lam.mean()), 'quantiles': quantiles}
    tqdm.write(f"epoch {epoch:3d}  loss {loss:.4f}  dev micro-F1 {100 * dev['micro_f1']:.2f}  "
               f"macro-F1 {100 * dev['macro_f1']:.2f}  {seconds:.1f} s + dev {dev_seconds:.1f}"
               ' s' + (f'  mixup, mean lambda {lam.mean():.3f}' if lam is not None else ''))
    return line


def fit(run):
    """Trains until --epochs or early stopping, saving every epoch. LH-Mix's local hierarchies
    are encoded first, once, by the encoder as it starts (Sec. 4.1)."""
    args, model, extra = run.args, run.model, run.extra
    if args.mix != 'none' and args.epochs <= args.warmup_epochs:
        note(f'warning: --epochs {args.epochs} <= --warmup-epochs {args.warmup_epochs}: '
             'Mixup never starts')
    if args.mix == 'lhmix':
        if 'table' not in extra:
            extra['table'], extra['hierarchy_ids'] = lhmix.local_hierarchy_table(
                model, run.tokenizer, run.gold['train'])
            print(f"{len(extra['table'])} distinct local hierarchies encoded")
        lhmix.use_local_hierarchies(model, extra['table'], args.alpha, args.beta)
        # Each distinct local hierarchy with the next: an encoder that sees them alike (as an
        # untrained one does) gives every pair the same ratio, within SPREAD.
        t = extra['table']
        lam = lhmix.mixup_ratio(lhmix.hierarchy_similarity(t, t.roll(1, 0)), args.alpha, args.beta)
        if len(t) > 1 and args.beta > 0.5 and lam.max() - lam.min() < SPREAD:
            note(f'warning: LH-Mix here mixes every pair at {lam.mean():.2g}, because the initial '
                 'encoder sees the local hierarchies alike; use a pretrained masked LM')
    graphed = speed.use_cuda_graphs(args.device, model, args.no_cuda_graphs)
    opt, scaler = speed.make_optimizer(model, args.lr, graphed, run.adam)
    step = functools.partial(train_step, model, opt, scaler)
    step = speed.CUDAGraphs(step) if graphed else step
    steps = -(-len(run.tokens['train']) // args.batch)
    with tqdm(total=steps * max(args.epochs - len(run.history), 0), disable=None) as bar:
        for epoch in range(len(run.history), args.epochs):
            if runs.since_best(run.history) >= args.early_stop:  # @early-stop
                tqdm.write(f'early stop: dev macro-F1 not improved for {args.early_stop} epochs')
                break
            t0 = time.time()
            loss, lam = train_epoch(run, step, graphed, epoch, bar)
            if not (math.isfinite(loss) and all(p.isfinite().all() for p in model.parameters())):
                what = 'weights' if math.isfinite(loss) else f'training loss ({loss})'
                raise FloatingPointError(f'the {what} became infinite or NaN in epoch {epoch} (try'
                                         ' a lower --lr); this epoch is not saved')
            run.history.append(evaluate_dev(run, epoch, loss, lam, time.time() - t0))
            run.folder.save(model, run.tokenizer, run.meta, run.history, extra, opt)


def test(run, started):
    """The best-dev checkpoint's test figures, as evaluate.py computes them, and where the run came
    from (runs.provenance); the line ends with the run's time since `started`. A run whose best dev
    macro-F1 is 0 learned nothing (it stopped too soon?): an error names what stopped it."""
    args = run.args
    best, _, meta = runs.load_checkpoint(os.path.join(run.folder.path, 'best'), args.device)
    r = {**evaluate.report(lhmix.score_documents(best, run.tokens['test']) > 0, run.gold['test'],
                           best.hierarchy, run.train_labels),
         'best_epoch': meta['epoch'], 'checkpoint': os.path.join(args.out, 'best'),
         'args': run.meta['args'], 'provenance': runs.provenance(args.device, run.meta['data'])}
    runs.write_whole(os.path.join(run.folder.path, runs.TEST_METRICS), json.dumps(r, indent=1))
    print(f"test micro-F1 {100 * r['micro_f1']:.2f}  macro-F1 {100 * r['macro_f1']:.2f}  (best dev "
          f"epoch {meta['epoch']}, {args.out}; {time.time() - started:.0f} s in all)")
    if not any(h['dev_macro_f1'] for h in run.history):
        # Early stopping is named even at the last epoch: more epochs would end at once.
        flag, n = '--epochs', args.epochs
        if runs.since_best(run.history) >= args.early_stop:
            flag, n = '--early-stop', args.early_stop
        raise ValueError(f'{flag} {n} ended the run at dev macro-F1 0: try a larger {flag} or --lr')


def train(args, given):
    """The run in --out, from the start or from where it stopped, then its test."""
    started = time.time()
    with runs.RunFolder(args.out, args.resume, args.overwrite) as folder:
        run = prepare(args, given, folder)  # at --resume, args become the run's
        if ((len(run.history) >= args.epochs or runs.since_best(run.history) >= args.early_stop)
                and os.path.exists(os.path.join(folder.path, runs.TEST_METRICS))):
            note(f'--resume: {args.out} is finished ({len(run.history)} epochs); nothing to do')
            return
        try:
            fit(run)
            test(run, started)
        except KeyboardInterrupt:
            sys.exit('interrupted: continue with --resume' if folder.saved else
                     'interrupted before the first epoch was saved; nothing is kept')


def main(argv=None):
    runs.exit_on_error(train, *parse(argv))


if __name__ == '__main__':
    main()
