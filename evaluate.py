"""Evaluate a checkpoint (or a file of predictions), or summarise many runs.

    python evaluate.py --ckpt out/wos-prompt-lhmix-s0/best --data wos [--split test] [--out FILE]
    python evaluate.py --predictions preds.jsonl --data wos          # score predictions instead
    python evaluate.py --summary out/*/                               # mean +- sd per setting, Welch's t-test

Prints micro/macro-F1 (HiAGM convention: macro over ALL labels), per-depth F1 and macro-F1 by
label-frequency quartile (the paper's Fig. 6 analysis) and writes them as JSON with --out.
A prediction file has one JSON object a line, {"labels": [label, ...]}, in the split's order.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

import data
import lhmix

METRICS, TEST_METRICS = 'metrics.jsonl', 'test_metrics.json'  # a train.py run's figures, beside best/ and last/

# -----------------------------------------------------------------------------
# F1 as HiAGM and every HTC baseline compute it, with the paper's per-depth and frequency breakdown


def f1_scores(predictions, gold, num_labels, labels=None):
    """Micro-F1 over all label decisions and macro-F1 over ALL labels of the hierarchy (a label
    neither predicted nor present scores 0), as HiAGM and every baseline compute them. Inputs are
    (N, V) 0/1 arrays or lists of label-id collections; `labels` restricts both to a subset."""
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
    return {'micro_f1': float(micro), 'macro_f1': float(per_label.mean()) if len(per_label) else 0.0,
            'per_label_f1': per_label.tolist()}


def report(pred, gold, hierarchy, train_labels):
    """Overall, per-depth and label-frequency-quartile F1 (the paper's Fig. 6 analysis; quartiles of
    the labels by their count in `train_labels`, rarest first) of (N, V) bool predictions."""
    V = len(hierarchy)
    out = {k: v for k, v in f1_scores(pred, gold, V).items() if k != 'per_label_f1'}
    out['per_depth'] = {}
    for d, labels in enumerate(hierarchy.by_depth, 1):
        f = f1_scores(pred, gold, V, labels)
        out['per_depth'][d] = {'labels': len(labels), 'micro_f1': f['micro_f1'], 'macro_f1': f['macro_f1']}
    counts = np.bincount([v for ls in train_labels for v in ls], minlength=V)
    order = np.argsort(counts, kind='stable')  # rarest first
    out['by_frequency'] = []
    for q, labels in enumerate(np.array_split(order, 4), 1):
        f = f1_scores(pred, gold, V, labels)
        out['by_frequency'].append({'quartile': q, 'labels': len(labels), 'train_docs_min': int(counts[labels].min()),
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
# Scoring a checkpoint or a prediction file


def read_predictions(path, hierarchy, n):
    """(n, V) bool predictions from a JSONL file of {"labels": [label name, ...]}, one line per
    document of the split (blank lines skipped); any line not of that form is an error naming it."""
    pred = np.zeros((n, len(hierarchy)), dtype=bool)
    try:
        lines = [(number, line) for number, line in data.read_lines(path) if line.strip()]
    except OSError as e:
        raise ValueError(f'{path}: cannot be read ({e.strerror or e})') from None
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


# -----------------------------------------------------------------------------
# Summaries over runs: mean +- sd per setting and Welch's t-test (the paper's appendix)


def betainc(a, b, x):
    """Regularised incomplete beta I_x(a, b) by its continued fraction (Lentz's method)."""
    if x <= 0 or x >= 1:
        return float(x >= 1)
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast on this side only
        return 1.0 - betainc(b, a, 1 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny, f, c, d = 1e-300, 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        else:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + num / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1.0 - c * d) < 1e-15:
            break
    return front * (f - 1.0)


def t_test_p(t, df):
    """Two-sided p-value of Student's t with df degrees of freedom: I_{df/(df+t^2)}(df/2, 1/2)."""
    return betainc(df / 2, 0.5, df / (df + t * t))


def welch(x, y):
    """Welch's unequal-variance t-test: (t, df, two-sided p)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    if vx + vy == 0:
        return 0.0, float('nan'), 1.0 if x.mean() == y.mean() else 0.0
    t = (x.mean() - y.mean()) / math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (vx ** 2 / (len(x) - 1) + vy ** 2 / (len(y) - 1))
    return t, df, t_test_p(t, df)


def summary(run_dirs):
    """Groups runs by their arguments (all but seed and output), prints mean +- sd of test F1 per
    group and Welch's p-value of each group against the first one."""
    groups = {}
    for run in run_dirs:
        metrics, meta = os.path.join(run, TEST_METRICS), os.path.join(run, 'best', lhmix.CHECKPOINT_META)
        if not (os.path.exists(metrics) and os.path.exists(meta)):
            raise FileNotFoundError(f'{run!r}: no {TEST_METRICS} or best/{lhmix.CHECKPOINT_META} (did the run finish?)')
        with open(meta) as f:
            args = json.load(f)['args']
        with open(metrics) as f:
            m = json.load(f)
        key = tuple(sorted((k, v) for k, v in args.items() if k not in ('seed', 'out', 'resume', 'device', 'data_dir')))
        groups.setdefault(key, []).append(m)
    varying = sorted({k for key in groups for k, v in key if len({dict(g)[k] for g in groups}) > 1})
    rows, first = [], None
    for key, runs in groups.items():
        a = 100 * np.array([(m['micro_f1'], m['macro_f1']) for m in runs])
        name = ' '.join(f'{k}={dict(key)[k]}' for k in varying) or 'all runs'
        row = {'setting': name, 'runs': len(a), 'micro_mean': a[:, 0].mean(), 'micro_sd': a[:, 0].std(ddof=1) if len(a) > 1 else 0.0,
               'macro_mean': a[:, 1].mean(), 'macro_sd': a[:, 1].std(ddof=1) if len(a) > 1 else 0.0}
        if first is None:
            first = a
        elif len(a) > 1 and len(first) > 1:
            row['p_micro'], row['p_macro'] = welch(a[:, 0], first[:, 0])[2], welch(a[:, 1], first[:, 1])[2]
        if all('per_depth' in m for m in runs):  # Fig. 6: mean over the runs of each breakdown
            row['depth_macro'] = [100 * np.mean([m['per_depth'][d]['macro_f1'] for m in runs]) for d in runs[0]['per_depth']]
            row['quartile_macro'] = [100 * np.mean([m['by_frequency'][q]['macro_f1'] for m in runs]) for q in range(4)]
        rows.append(row)
    print(f"{'setting':<50} {'n':>2}  {'micro-F1':>13}  {'macro-F1':>13}  p vs first (micro, macro)")
    for r in rows:
        p = f"{r['p_micro']:.3g}, {r['p_macro']:.3g}" if 'p_micro' in r else ''
        print(f"{r['setting']:<50} {r['runs']:>2}  {r['micro_mean']:6.2f} ± {r['micro_sd']:4.2f}  "
              f"{r['macro_mean']:6.2f} ± {r['macro_sd']:4.2f}  {p}")
    if all('depth_macro' in r for r in rows):
        print(f"\n{'setting':<50} macro-F1 per depth | per label-frequency quartile, rarest first (means)")
        for r in rows:
            print(f"{r['setting']:<50} " + ' '.join(f'{x:6.2f}' for x in r['depth_macro']) + ' | '
                  + ' '.join(f'{x:6.2f}' for x in r['quartile_macro']))
    return rows


def parse_device(parser, name):
    """The torch.device of --device NAME (default: cuda when there is one), or the parser's error."""
    try:
        device = torch.device(name or ('cuda' if torch.cuda.is_available() else 'cpu'))
    except RuntimeError:
        parser.error(f'--device {name}: unknown device (cpu, cuda or cuda:N)')
    if device.type not in ('cpu', 'cuda'):
        parser.error(f'--device {name}: only cpu and cuda are supported')
    if device.type == 'cuda' and not torch.cuda.is_available():
        parser.error(f'--device {name}: no CUDA GPU is available here')
    return device


def output_problem(path):
    """Why the file `path` could not be written (None if it can: missing folders are made when it is)."""
    if path is None:
        return None
    if os.path.isdir(path):
        return 'is a folder, not a file'
    above = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(above):
        above = os.path.dirname(above)
    if not os.path.isdir(above):
        return f'{above} is a file, not a folder'
    if not os.access(above, os.W_OK | os.X_OK):
        return f'{above} is not writable'
    return None


def write_atomically(path, text):
    """Writes `path` whole or not at all (a temporary file renamed over it), making its folder."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f'.{os.path.basename(path)}.{os.getpid()}.tmp')
    try:
        with open(tmp, 'w', encoding='utf-8') as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


# -----------------------------------------------------------------------------
# The paper's label case study (its t-SNE figure around "Hockey"): nearest labels by the
# verbalizer's embeddings, at initialisation and after training


def find_label(hierarchy, label):
    """Id of `label`, given as its key or its (unique) name."""
    if label in hierarchy.index:
        return hierarchy.index[label]
    hits = [v for v, name in enumerate(hierarchy.names) if name == label or name.lower() == label.lower()]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise ValueError(f"label name {label!r} is ambiguous: " + ', '.join(hierarchy.labels[v] for v in hits))
    raise ValueError(f"label {label!r} is not in the checkpoint's hierarchy")


def _ranks(emb, v):
    """Cosine of every label's embedding with label v's, and each label's rank by it (1 = nearest;
    v itself gets rank 0; ties broken by label id)."""
    emb = emb.detach().float()
    cos = torch.nn.functional.cosine_similarity(emb, emb[v:v + 1], dim=1).numpy()
    order = [u for u in np.argsort(-cos, kind='stable') if u != v]
    rank = np.zeros(len(emb), dtype=int)
    rank[order] = np.arange(1, len(order) + 1)
    return cos, rank


def similar_labels(model, init_model, label):
    """Every other label's cosine similarity to `label` (key or name) in the label embeddings of
    `init_model` (at initialisation) and `model` (trained), with its rank among all labels but
    `label` (1 = nearest). Returns dicts (label, rank_init, rank_trained, cos_init, cos_trained),
    nearest after training first."""
    h = model.hierarchy
    if init_model.hierarchy.labels != h.labels:
        raise ValueError('the initial and trained models have different labels')
    v = find_label(h, label)
    cos_i, rank_i = _ranks(init_model.label_embeddings(), v)
    cos_t, rank_t = _ranks(model.label_embeddings(), v)
    rows = [{'label': h.labels[u], 'rank_init': int(rank_i[u]), 'rank_trained': int(rank_t[u]),
             'cos_init': float(cos_i[u]), 'cos_trained': float(cos_t[u])} for u in range(len(h)) if u != v]
    return sorted(rows, key=lambda r: r['rank_trained'])


def print_similar(rows, hierarchy, label, top, file=None):
    """One row per label in the top-`top` after training or at initialisation; change = rank at
    init - rank after training (+ = moved nearer), 'new' if it was not in the init top-k."""
    file = file or sys.stdout
    v = find_label(hierarchy, label)
    print(f"labels nearest to {hierarchy.labels[v]} ({hierarchy.names[v]}) by cosine of the label embeddings, "
          f"top {top}", file=file)
    print(f"{'trained':>7} {'init':>5} {'change':>6} {'cos':>7}  label", file=file)
    for r in rows:
        if r['rank_trained'] > top and r['rank_init'] > top:
            continue
        change = 'new' if r['rank_init'] > top else f"{r['rank_init'] - r['rank_trained']:+d}"
        name = hierarchy.names[hierarchy.index[r['label']]]
        print(f"{r['rank_trained']:>7} {r['rank_init']:>5} {change:>6} {r['cos_trained']:7.3f}  {r['label']} ({name})",
              file=file)
    k = min(top, len(rows))
    kept = sum(r['rank_trained'] <= top and r['rank_init'] <= top for r in rows)
    print(f'{kept} of the top {k} after training were in the top {k} at initialisation', file=file)


def similar_main(args):
    """--similar LABEL --ckpt CKPT [--top K] [--model PATH]."""
    model, _, meta = lhmix.load_checkpoint(args.ckpt)
    v = find_label(model.hierarchy, args.similar)
    path = args.model or (meta.get('args') or {}).get('model')
    if not path:
        raise ValueError(f'{args.ckpt}: the checkpoint does not record its pretrained model; pass --model PATH')
    if path == 'tiny':
        raise ValueError("the run started from --model tiny (random init, not rebuildable); pass --model PATH")
    mlm, tokenizer = data.load_pretrained(path)
    if len(tokenizer) != model.base_vocab or mlm.config.hidden_size != model.mlm.config.hidden_size:
        raise ValueError(f'{path}: not the model this checkpoint was trained from (vocabulary or width differs)')
    init_model = lhmix.build_model(mlm, tokenizer, model.hierarchy, model.arch, model.max_length)
    rows = similar_labels(model, init_model, model.hierarchy.labels[v])
    print_similar(rows, model.hierarchy, model.hierarchy.labels[v], args.top)
    return rows


# -----------------------------------------------------------------------------
# Predictions for raw texts, one a line


def texts_main(args, device):
    """--ckpt CKPT --texts FILE: one JSON line of lhmix.classify's output per input line."""
    model, tokenizer, _ = lhmix.load_checkpoint(args.ckpt, device)
    lines = [line for _, line in data.read_lines(args.texts)]
    out = lhmix.classify(model, tokenizer, lines)
    for r in out:
        print(json.dumps(r))
    cut = sum(r['truncated'] for r in out)
    if cut:
        print(f'{cut} of {len(lines)} texts truncated to max_length {model.max_length}', file=sys.stderr)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--ckpt', help='a checkpoint folder written by train.py (OUT/best)')
    p.add_argument('--predictions', help='score this prediction file instead of a checkpoint')
    p.add_argument('--data', help='wos | nyt | rcv1 | demo | PATH (as for train.py)')
    p.add_argument('--data-dir')
    p.add_argument('--split', default='test', choices=['train', 'dev', 'test'])
    p.add_argument('--out', help='write the figures here as JSON')
    p.add_argument('--save-predictions', help="write the checkpoint's predictions here (JSONL)")
    p.add_argument('--summary', nargs='+', metavar='RUN_DIR', help='summarise finished train.py runs')
    p.add_argument('--device', help='cuda or cpu (default: cuda when there is one)')
    p.add_argument('--similar', metavar='LABEL', help="labels nearest to LABEL (key or name), at init and trained")
    p.add_argument('--top', type=int, default=15, help='with --similar: how many nearest labels (default 15)')
    p.add_argument('--model', help="with --similar: the pretrained model the run started from (default: the checkpoint's)")
    p.add_argument('--texts', metavar='FILE', help="classify FILE's lines (- for stdin), one JSON line each")
    args = p.parse_args(argv)
    if args.similar or args.texts:
        if not args.ckpt:
            p.error('--similar and --texts need --ckpt')
        if args.top < 1:
            p.error('--top must be >= 1')
        try:
            if args.similar:
                similar_main(args)
            else:
                texts_main(args, parse_device(p, args.device))
        except (ValueError, FileNotFoundError) as e:
            sys.exit('error: ' + str(e).replace('\n', ' '))
        return
    if args.summary:
        try:
            summary(args.summary)
        except (ValueError, FileNotFoundError) as e:
            sys.exit(f'error: {e}')
        return
    if not args.data or bool(args.ckpt) == bool(args.predictions):
        p.error('give --data and one of --ckpt or --predictions (or --summary RUN_DIR...)')
    device = parse_device(p, args.device)
    for flag in ('out', 'save_predictions'):  # checked before anything is computed
        problem = output_problem(getattr(args, flag))
        if problem:
            p.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: {problem}")
    try:
        hierarchy, splits = data.load_data(args.data, args.data_dir)
        docs = splits[args.split]
        if args.predictions:
            pred = read_predictions(args.predictions, hierarchy, len(docs))
        else:
            model, tokenizer, meta = lhmix.load_checkpoint(args.ckpt, device, hierarchy)
            tokens, cut = lhmix.tokenize(tokenizer, [t for t, _ in docs], model.text_budget(model.max_length))
            t0 = time.time()
            pred = lhmix.score_documents(model, tokens) > 0
            print(f'{len(docs)} documents ({cut} truncated to max_length {model.max_length}) in {time.time() - t0:.1f} s')
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f'error: {e}')
    result = report(pred, [ls for _, ls in docs], hierarchy, [ls for _, ls in splits['train']])
    print(f"{args.split}: micro-F1 {100 * result['micro_f1']:.2f}  macro-F1 {100 * result['macro_f1']:.2f}")
    for d, r in result['per_depth'].items():
        print(f"  depth {d} ({r['labels']} labels): micro-F1 {100 * r['micro_f1']:.2f}  macro-F1 {100 * r['macro_f1']:.2f}")
    for r in result['by_frequency']:
        print(f"  frequency quartile {r['quartile']} ({r['labels']} labels, {r['train_docs_min']}-{r['train_docs_max']} "
              f"train docs): macro-F1 {100 * r['macro_f1']:.2f}")
    if args.out:
        write_atomically(args.out, json.dumps(result, indent=1))
    if args.save_predictions:
        write_atomically(args.save_predictions, ''.join(
            json.dumps({'labels': [hierarchy.labels[v] for v in np.flatnonzero(row)]}) + '\n' for row in pred))


if __name__ == '__main__':
    main()
