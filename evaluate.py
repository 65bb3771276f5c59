"""Score a checkpoint or a prediction file, classify texts, compare labels, summarise runs.

    python evaluate.py --ckpt OUT/best --data wos [--split test] [--out F] [--save-predictions P]
    python evaluate.py --predictions P --data wos   # P: one {"labels": [label, ...]} a line
    python evaluate.py --ckpt OUT/best --texts FILE # one JSON line per line of FILE (- = stdin)
    python evaluate.py --ckpt OUT/best --similar LABEL [--top 15] [--model PRETRAINED]
    python evaluate.py --summary OUT...             # mean +- sd per setting, Welch's p-values

F1 as HiAGM computes it (macro over ALL labels), per depth and label-frequency quartile (Fig. 6).
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

import data
import lhmix

METRICS, TEST_METRICS = 'metrics.jsonl', 'test_metrics.json'  # a train.py run's figures
# train.py's arguments that do not change a run's result: --summary groups runs without them
NOT_SETTINGS = {'seed', 'out', 'overwrite', 'resume', 'device', 'no_cuda_graphs', 'data_dir'}

# -----------------------------------------------------------------------------
# F1 as HiAGM and every HTC baseline compute it, with the paper's per-depth and frequency breakdown


def f1_scores(predictions, gold, num_labels, labels=None):
    """Micro-F1 over all label decisions and macro-F1 over ALL labels (a label neither predicted
    nor present scores 0), as HiAGM and every baseline compute them. Inputs are (N, V) 0/1 arrays
    or lists of label-id collections; `labels` restricts both to a subset."""
    P, G = (_as_matrix(x, num_labels) for x in (predictions, gold))
    if labels is not None:
        P, G = P[:, labels], G[:, labels]
    tp = (P & G).sum(0).astype(float)
    n_pred, n_gold = P.sum(0).astype(float), G.sum(0).astype(float)

    def f1(tp, n_pred, n_gold):
        p = np.divide(tp, n_pred, out=np.zeros_like(tp), where=n_pred > 0)
        r = np.divide(tp, n_gold, out=np.zeros_like(tp), where=n_gold > 0)
        return np.divide(2 * p * r, p + r, out=np.zeros_like(tp), where=p + r > 0)

    per_label = f1(tp, n_pred, n_gold)
    micro = f1(np.array([tp.sum()]), np.array([n_pred.sum()]), np.array([n_gold.sum()]))[0]
    return {'micro_f1': float(micro), 'macro_f1': float(per_label.mean() if len(tp) else 0),
            'per_label_f1': per_label.tolist()}


def report(pred, gold, hierarchy, train_labels):
    """Overall, per-depth and label-frequency-quartile F1 of (N, V) bool predictions (quartiles of
    the labels by their count in `train_labels`, rarest first)."""
    V = len(hierarchy)
    out = {k: v for k, v in f1_scores(pred, gold, V).items() if k != 'per_label_f1'}
    out['per_depth'] = {}
    for d, labels in enumerate(hierarchy.by_depth, 1):
        f = f1_scores(pred, gold, V, labels)
        out['per_depth'][d] = {'labels': len(labels), 'micro_f1': f['micro_f1'],
                               'macro_f1': f['macro_f1']}
    counts = np.bincount([v for ls in train_labels for v in ls], minlength=V)
    out['by_frequency'] = []
    for q, labels in enumerate(np.array_split(np.argsort(counts, kind='stable'), 4), 1):
        f = f1_scores(pred, gold, V, labels)
        out['by_frequency'].append({
            'quartile': q, 'labels': len(labels), 'train_docs_min': int(counts[labels].min()),
            'train_docs_max': int(counts[labels].max()), 'macro_f1': f['macro_f1'],
            'micro_f1': f['micro_f1']})
    return out


def _as_matrix(x, num_labels):
    if isinstance(x, np.ndarray) and x.ndim == 2:
        return x.astype(bool)
    m = np.zeros((len(x), num_labels), dtype=bool)
    for i, ls in enumerate(x):
        m[i, list(ls)] = True
    return m


# -----------------------------------------------------------------------------
# Classifying raw texts


def classify(model, tokenizer, texts):
    """Per text: the predicted labels (by depth); `paths`: for each predicted label without a
    predicted child, the names of the predicted labels from the root down to it (ancestors that
    were not predicted are left out); every label's score; whether the text was cut to
    max_length. An empty text predicts nothing."""
    h, budget = model.hierarchy, model.text_budget(model.max_length)
    tokens, _ = lhmix.tokenize(tokenizer, list(texts), budget + 1)  # + 1: tells a cut text
    keep = [i for i, t in enumerate(texts) if t.strip()]
    scores = lhmix.score_documents(model, [tokens[i][:budget] for i in keep]) if keep else []
    out = [{'labels': [], 'paths': [], 'scores': {}, 'truncated': False} for _ in texts]
    for i, s in zip(keep, scores):
        on = set(np.flatnonzero(s > 0).tolist())
        leaves = sorted(on - {a for v in on for a in h.path(v)[:-1]})  # no predicted descendant
        out[i] = {'labels': [h.labels[v] for v in sorted(on, key=lambda v: (h.depth[v], v))],
                  'paths': [[h.names[a] for a in h.path(v) if a in on] for v in leaves],
                  'scores': {h.labels[v]: round(float(s[v]), 4) for v in range(len(h))},
                  'truncated': len(tokens[i]) > budget}
    return out


def texts_main(args, device):
    model, tokenizer, _ = data.load_checkpoint(args.ckpt, device)
    out = classify(model, tokenizer, [line for _, line in data.read_lines(args.texts)])
    for r in out:
        print(json.dumps(r))
    cut = sum(r['truncated'] for r in out)
    if cut:
        print(f'{cut} of {len(out)} texts truncated to max_length {model.max_length}',
              file=sys.stderr)


# -----------------------------------------------------------------------------
# Scoring a checkpoint or a prediction file


def read_predictions(path, hierarchy, n):
    """(n, V) bool predictions from a JSONL file of {"labels": [label name, ...]}, one line per
    document of the split (blank lines skipped); a line not of that form is an error naming it."""
    pred = np.zeros((n, len(hierarchy)), dtype=bool)
    lines = [(number, line) for number, line in data.read_lines(path) if line.strip()]
    if len(lines) != n:
        raise ValueError(f'{path}: {len(lines)} predictions for {n} documents')
    for i, (number, line) in enumerate(lines):
        try:
            labels = json.loads(line)['labels']
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ValueError(f'{path}:{number}: expected {{"labels": [...]}}') from None
        if not isinstance(labels, list) or not all(isinstance(v, str) for v in labels):
            raise ValueError(f'{path}:{number}: `labels` must be a list of label names (strings)')
        for v in labels:
            if v not in hierarchy.index:
                raise ValueError(f'{path}:{number}: label {v!r} is not in the hierarchy')
            pred[i, hierarchy.index[v]] = True
    return pred


def _earlier_output(path, flag):
    """Whether `path` holds what `flag` writes: a JSON object with micro_f1 and macro_f1 (--out),
    or lines of {"labels": ...} (--save-predictions)."""
    try:
        with open(path, encoding='utf-8') as f:
            rows = [json.load(f)] if flag == '--out' else [json.loads(x) for x in f if x.strip()]
    except (OSError, ValueError):  # unreadable, not UTF-8 or not JSON: not ours
        return False
    keys = {'micro_f1', 'macro_f1'} if flag == '--out' else {'labels'}
    return all(isinstance(r, dict) and keys <= r.keys() for r in rows)


def output_problem(path, flag, ckpt=None):
    """Why `flag` (--out, --save-predictions) must not write `path`: into the checkpoint folder
    `ckpt` being read, over a file that is not its earlier output, or where it cannot (None if it
    may: missing folders are made when it writes)."""
    real = os.path.realpath(path)
    if ckpt and os.path.commonpath([real, os.path.realpath(ckpt)]) == os.path.realpath(ckpt):
        return f'is inside the checkpoint folder {ckpt} being read'
    if os.path.isdir(path):
        return 'is a folder, not a file'
    if os.path.exists(path) and not _earlier_output(path, flag):
        return f'exists and is not an earlier {flag} file (remove it or choose another name)'
    above = os.path.dirname(real)
    while not os.path.exists(above):
        above = os.path.dirname(above)
    if not os.path.isdir(above) or not os.access(above, os.W_OK | os.X_OK):
        return f'{above} is not a writable folder'
    return None


def score_main(args, device):
    hierarchy, splits = data.load_data(args.data, args.data_dir)
    docs = splits[args.split]
    if args.predictions:
        pred = read_predictions(args.predictions, hierarchy, len(docs))
    else:
        model, tokenizer, _ = data.load_checkpoint(args.ckpt, device, hierarchy)
        budget, t0 = model.text_budget(model.max_length), time.time()
        tokens, cut = lhmix.tokenize(tokenizer, [t for t, _ in docs], budget)
        pred = lhmix.score_documents(model, tokens) > 0
        print(f'{len(docs)} documents ({cut} truncated to max_length {model.max_length}) '
              f'in {time.time() - t0:.1f} s')
    r = report(pred, [ls for _, ls in docs], hierarchy, [ls for _, ls in splits['train']])
    print(f"{args.split}: micro-F1 {100 * r['micro_f1']:.2f}  macro-F1 {100 * r['macro_f1']:.2f}")
    for d, f in r['per_depth'].items():
        print(f"  depth {d}: micro-F1 {100 * f['micro_f1']:.2f}  "
              f"macro-F1 {100 * f['macro_f1']:.2f}")
    for f in r['by_frequency']:
        print(f"  label-frequency quartile {f['quartile']} ({f['train_docs_min']}-"
              f"{f['train_docs_max']} train docs): macro-F1 {100 * f['macro_f1']:.2f}")
    if args.out:
        data.write_atomically(args.out, json.dumps(r, indent=1))
    if args.save_predictions:
        data.write_atomically(args.save_predictions, ''.join(
            json.dumps({'labels': [hierarchy.labels[v] for v in np.flatnonzero(row)]}) + '\n'
            for row in pred))


# -----------------------------------------------------------------------------
# Summaries over runs: mean +- sd per setting and Welch's t-test (the paper's appendix)


def run_args(run):
    """The arguments train.py saved in the run's best/ checkpoint (its header only is read)."""
    from safetensors import safe_open
    path = os.path.join(run, 'best', data.WEIGHTS)
    try:
        with safe_open(path, 'pt') as f:
            return json.loads(f.metadata()['lhmix'])['args']
    except Exception as e:  # missing, truncated or not a run's: the message says which
        raise ValueError(f'{path}: not a finished train.py run ({e})') from None


def summary(run_dirs):
    """Groups runs (each folder once) by the arguments that change the result; prints n, mean
    +- sd of test F1, Welch's p-value against the first group, and Fig. 6's means."""
    groups = {}
    for run in dict.fromkeys(os.path.realpath(r) for r in run_dirs):
        args = {k: v for k, v in run_args(run).items() if k not in NOT_SETTINGS}
        with open(os.path.join(run, TEST_METRICS)) as f:
            groups.setdefault(json.dumps(args, sort_keys=True), (args, []))[1].append(json.load(f))
    varying = sorted({k for a, _ in groups.values() for k in a
                      if len({json.dumps(b.get(k)) for b, _ in groups.values()}) > 1})
    try:
        from scipy.stats import ttest_ind
    except ImportError:
        ttest_ind = None
        print('(no p-values without scipy: pip install scipy)')
    print(f"{'setting':<50} {'n':>2}  {'micro-F1':<13}  {'macro-F1':<13}  p vs first")
    rows = []
    for args, runs in groups.values():
        f1 = 100 * np.array([(m['micro_f1'], m['macro_f1']) for m in runs])
        fig6 = [[f['macro_f1'] for f in [*m['per_depth'].values(), *m['by_frequency']]]
                for m in runs]
        r = {'setting': ' '.join(f'{k}={args.get(k)}' for k in varying) or 'all runs',
             'n': len(f1), 'f1': f1, 'mean': f1.mean(0), 'sd': None, 'p': None,
             'fig6': 100 * np.mean(fig6, 0)}
        if len(f1) > 1:  # one run has no sd (and no p-value)
            r['sd'] = f1.std(0, ddof=1)
            if rows and ttest_ind and rows[0]['n'] > 1:
                r['p'] = ttest_ind(f1, rows[0]['f1'], equal_var=False).pvalue
        cells = [f'{m:6.2f}' + (f' ± {r["sd"][i]:4.2f}' if r['n'] > 1 else ' ' * 7)
                 for i, m in enumerate(r['mean'])]
        p = ', '.join(f'{x:.3g}' for x in r['p']) if r['p'] is not None else ''
        print(f"{r['setting']:<50} {r['n']:>2}  {'  '.join(cells)}  {p}")
        rows.append(r)
    print(f"\n{'setting':<50} macro-F1 per depth, then per label-frequency quartile (rarest first)")
    for r in rows:
        print(f"{r['setting']:<50} " + ' '.join(f'{x:6.2f}' for x in r['fig6']))
    return rows


# -----------------------------------------------------------------------------
# The paper's label case study (its t-SNE figure around "Hockey"): nearest labels by the
# verbalizer's embeddings, at initialisation and after training


def find_label(hierarchy, label):
    """Id of `label`, given as its key or its (unique, any case) name."""
    if label in hierarchy.index:
        return hierarchy.index[label]
    hits = [v for v, name in enumerate(hierarchy.names) if name.lower() == label.lower()]
    if len(hits) != 1:
        raise ValueError(f"label {label!r} is not in the checkpoint's hierarchy" if not hits else
                         f'label name {label!r} is ambiguous: '
                         + ', '.join(hierarchy.labels[v] for v in hits))
    return hits[0]


def similar_labels(model, init_model, label, top):
    """Prints the labels in the top `top` by cosine to `label` (key or name) in the label
    embeddings after training (`model`) or at initialisation (`init_model`); change = rank at
    init - rank after training (+: moved nearer), 'new' if not in the top at init. Returns every
    other label's dict (label, rank_init, rank_trained, cos_init, cos_trained), rank 1 = nearest
    (ties by label id), nearest after training first."""
    h, v = model.hierarchy, find_label(model.hierarchy, label)

    def ranks(m):  # label v gets cosine 2 (above any other), so rank 0
        emb = m.label_embeddings().detach().float().cpu()
        cos = torch.nn.functional.cosine_similarity(emb, emb[v:v + 1])
        return cos.tolist(), torch.argsort(torch.argsort(-cos.index_fill(0, torch.tensor([v]), 2),
                                                         stable=True)).tolist()

    (cos_i, rank_i), (cos_t, rank_t) = ranks(init_model), ranks(model)
    rows = sorted(({'label': h.labels[u], 'rank_init': rank_i[u], 'rank_trained': rank_t[u],
                    'cos_init': cos_i[u], 'cos_trained': cos_t[u]}
                   for u in range(len(h)) if u != v), key=lambda r: r['rank_trained'])
    print(f'labels nearest to {h.labels[v]} ({h.names[v]}) by cosine of the label embeddings, '
          f"top {top}\n{'trained':>7} {'init':>5} {'change':>6} {'cos':>7}  label")
    for r in rows:
        if min(r['rank_trained'], r['rank_init']) <= top:
            change = 'new' if r['rank_init'] > top else f"{r['rank_init'] - r['rank_trained']:+d}"
            print(f"{r['rank_trained']:>7} {r['rank_init']:>5} {change:>6} "
                  f"{r['cos_trained']:7.3f}  {r['label']} ({h.names[h.index[r['label']]]})")
    k, kept = min(top, len(rows)), sum(max(r['rank_trained'], r['rank_init']) <= top for r in rows)
    print(f'{kept} of the top {k} after training were in the top {k} at initialisation')
    return rows


def similar_main(args, device):
    model, _, meta = data.load_checkpoint(args.ckpt, device)
    find_label(model.hierarchy, args.similar)  # a wrong label is the first thing to say
    path = args.model or meta.get('args', {}).get('model')
    if not path or path == 'tiny':  # 'tiny': a random init, not rebuildable
        raise ValueError(f"{args.ckpt}: the run's pretrained model is unknown ({path}); "
                         'pass --model PATH')
    mlm, tokenizer = data.load_pretrained(path)
    if len(tokenizer) != model.base_vocab or mlm.config.hidden_size != model.mlm.config.hidden_size:
        raise ValueError(f'{path}: not the model this checkpoint was trained from '
                         '(vocabulary or width differs)')
    init = lhmix.build_model(mlm, tokenizer, model.hierarchy, model.arch, model.max_length)
    similar_labels(model, init, args.similar, args.top)


# -----------------------------------------------------------------------------


def parse_device(parser, name):
    """The torch.device of --device NAME (default: cuda if there is one), or the parser's error."""
    try:
        device = torch.device(name or ('cuda' if torch.cuda.is_available() else 'cpu'))
    except RuntimeError:
        parser.error(f'--device {name}: unknown device (cpu, cuda or cuda:N)')
    if device.type not in ('cpu', 'cuda'):
        parser.error(f'--device {name}: only cpu and cuda are supported')
    if device.type == 'cuda' and not torch.cuda.is_available():
        parser.error(f'--device {name}: no CUDA GPU is available here')
    return device


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag in ('--ckpt', '--predictions', '--data', '--data-dir', '--out', '--save-predictions',
                 '--texts', '--similar', '--model', '--device'):
        p.add_argument(flag)
    p.add_argument('--split', default='test', choices=['train', 'dev', 'test'])
    p.add_argument('--top', type=int, default=15)
    p.add_argument('--summary', nargs='+')
    args = p.parse_args(argv)
    device = parse_device(p, args.device)
    if args.summary:
        mode, mode_args = summary, (args.summary,)
    elif args.texts or args.similar:
        if not args.ckpt or args.top < 1:
            p.error('--texts and --similar need --ckpt (and --top >= 1)')
        mode, mode_args = texts_main if args.texts else similar_main, (args, device)
    elif args.data and bool(args.ckpt) != bool(args.predictions):
        mode, mode_args = score_main, (args, device)
        for flag, path in (('--out', args.out), ('--save-predictions', args.save_predictions)):
            problem = path and output_problem(path, flag, args.ckpt)  # before computing
            if problem:
                sys.exit(f'error: {flag} {path}: {problem}')
    else:
        p.error('give --data and one of --ckpt or --predictions, or --texts, --similar, --summary')
    try:
        mode(*mode_args)
        sys.stdout.flush()  # here, so that a closed pipe is caught below
    except BrokenPipeError:  # `evaluate.py ... | head -2`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except (ValueError, OSError) as e:
        sys.exit('error: ' + str(e).replace('\n', ' '))


if __name__ == '__main__':
    main()
