"""Scores a checkpoint (--ckpt RUN/best --data D) or a prediction file (--predictions P, a line
{"labels": [label, ...]} a document), classifies --texts FILE (- = stdin), lists the labels
nearest to --similar LABEL, or gives mean +- sd per setting and Welch's p of --summary RUN...
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

# F1 as HiAGM and every HTC baseline compute it, per depth and label-frequency quartile (Fig. 6)


def f1_scores(predictions, gold, num_labels, labels=None):
    """Micro-F1 over all label decisions, macro-F1 over ALL labels (a label neither predicted nor
    present scores 0), of (N, V) 0/1 arrays or lists of label-id lists; `labels`: a subset."""
    def matrix(x):  # (N, V) bool
        return x.astype(bool) if isinstance(x, np.ndarray) else np.array(
            [np.isin(range(num_labels), list(ls)) for ls in x], bool).reshape(-1, num_labels)

    P, G = matrix(predictions), matrix(gold)
    if labels is not None:
        P, G = P[:, labels], G[:, labels]
    # F1 = 2PR / (P + R) = 2 tp / (predicted + gold)
    tp, n = 2 * (P & G).sum(0).astype(float), (P.sum(0) + G.sum(0)).astype(float)
    per_label = np.divide(tp, n, out=np.zeros_like(tp), where=n > 0)
    return {'micro_f1': float(tp.sum() / n.sum() if n.sum() else 0),
            'macro_f1': float(per_label.mean() if len(tp) else 0)}


def report(pred, gold, hierarchy, train_labels):
    """Overall, per-depth and label-frequency-quartile F1 (Fig. 6; by train count, rarest first)."""
    def f1(subset=None, **about):
        return {**about, **f1_scores(pred, gold, len(hierarchy), subset)}

    counts = np.bincount([v for ls in train_labels for v in ls], minlength=len(hierarchy))
    quartiles = np.array_split(np.argsort(counts, kind='stable'), 4)
    per_depth = {d: f1(ls, labels=len(ls)) for d, ls in enumerate(hierarchy.by_depth, 1)}
    by_frequency = [f1(ls, quartile=q, labels=len(ls), train_docs_min=int(min(counts[ls])),
                       train_docs_max=int(max(counts[ls]))) for q, ls in enumerate(quartiles, 1)]
    return {**f1(), 'per_depth': per_depth, 'by_frequency': by_frequency}


def classify(model, tokenizer, texts):
    """Per text: the predicted labels (by depth), the names on each path from the root to a
    predicted leaf (predicted labels only), every label's score, whether it was cut to max_length.
    An empty text predicts nothing."""
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


# Scoring a checkpoint or a prediction file


def read_predictions(path, hierarchy, n):
    lines = [(number, line) for number, line in data.read_lines(path) if line.strip()]
    if len(lines) != n:
        raise ValueError(f'{path}: {len(lines)} predictions for {n} documents')
    pred = np.zeros((n, len(hierarchy)), dtype=bool)
    for i, (number, line) in enumerate(lines):
        try:
            labels = json.loads(line)['labels']
        except (ValueError, KeyError, TypeError):
            raise ValueError(f'{path}:{number}: expected {{"labels": [...]}}') from None
        if not isinstance(labels, list) or not all(isinstance(v, str) for v in labels):
            raise ValueError(f'{path}:{number}: `labels` must be a list of label names (strings)')
        for v in labels:
            if v not in hierarchy.index:
                raise ValueError(f'{path}:{number}: label {v!r} is not in the hierarchy')
            pred[i, hierarchy.index[v]] = True
    return pred


def check_output(path, flag, ckpt):
    """Before `flag` writes `path` (the OS reports the rest when it writes)."""
    folder = ckpt and os.path.realpath(ckpt)
    if folder and os.path.commonpath([os.path.realpath(path), folder]) == folder:
        raise ValueError(f'{flag} {path}: is inside the checkpoint folder {ckpt} being read')
    if os.path.isdir(path):
        raise ValueError(f'{flag} {path}: is a folder, not a file')
    if os.path.basename(path) in (METRICS, TEST_METRICS):  # begins as --out does, holds more
        raise ValueError(f"{flag} {path}: is a train.py run's own file")
    if not os.path.exists(path):
        return
    start = '{\n "micro_f1": ' if flag == '--out' else '{"labels": ['  # as `flag` writes it
    try:
        with open(path, encoding='utf-8') as f:
            if f.read(len(start)) == start:
                return
    except (OSError, ValueError):  # unreadable or not UTF-8
        pass
    raise ValueError(f'{flag} {path}: exists and is not an earlier {flag} file (remove it or '
                     'choose another name)')


def score_main(args, device):
    for flag, path in (('--out', args.out), ('--save-predictions', args.save_predictions)):
        if path:
            check_output(path, flag, args.ckpt)  # before minutes of computing
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
    for name, f in [(args.split, r), *((f'  depth {d}', f) for d, f in r['per_depth'].items()),
                    *((f"  label-frequency quartile {f['quartile']} ({f['train_docs_min']}-"
                       f"{f['train_docs_max']} train docs)", f) for f in r['by_frequency'])]:
        print(f"{name}: micro-F1 {100 * f['micro_f1']:.2f}  macro-F1 {100 * f['macro_f1']:.2f}")
    if args.out:
        data.write_atomically(args.out, json.dumps(r, indent=1))
    if args.save_predictions:
        data.write_atomically(args.save_predictions, ''.join(
            json.dumps({'labels': [hierarchy.labels[v] for v in np.flatnonzero(row)]}) + '\n'
            for row in pred))


# Summaries over runs: mean +- sd per setting and Welch's t-test (the paper's appendix)


def summary(run_dirs):
    """Each run once, grouped by setting: n, mean +- sd, Welch's p against the first group and
    Fig. 6's means."""
    groups = {}
    for run in dict.fromkeys(os.path.realpath(r) for r in run_dirs):
        path = os.path.join(run, TEST_METRICS)
        try:
            with open(path, encoding='utf-8') as f:
                m = json.load(f)
            args = {k: v for k, v in m['args'].items() if k not in NOT_SETTINGS}
        except Exception as e:  # missing, not JSON or not a run's: the message says which
            raise ValueError(f'{path}: not a finished train.py run ({e!r})') from None
        groups.setdefault(json.dumps(args, sort_keys=True), (args, []))[1].append(m)
    varying = sorted({k for a, _ in groups.values() for k in a
                      if len({json.dumps(b.get(k)) for b, _ in groups.values()}) > 1})
    try:
        from scipy.stats import ttest_ind
    except ImportError:
        ttest_ind = None
        print('(no p-values without scipy: pip install scipy)')
    table = [f"{'setting':<50} {'n':>2}  {'micro-F1':<13}  {'macro-F1':<13}  p vs first"]
    fig6 = [f"\n{'setting':<50} macro-F1 per depth, then per label-frequency quartile "
            '(rarest first)']
    rows = []
    for args, runs in groups.values():
        setting = ' '.join(f'{k}={args.get(k)}' for k in varying) or 'all runs'
        f1, n = 100 * np.array([(m['micro_f1'], m['macro_f1']) for m in runs]), len(runs)
        sd = p = None  # one run has no sd and no p-value
        if n > 1:
            sd = f1.std(0, ddof=1)
            if rows and ttest_ind and rows[0]['n'] > 1:
                p = ttest_ind(f1, rows[0]['f1'], equal_var=False).pvalue
        rows.append({'setting': setting, 'n': n, 'f1': f1, 'mean': f1.mean(0), 'sd': sd, 'p': p})
        micro, macro = (f'{m:.2f}' + (f' ± {sd[i]:.2f}' if n > 1 else '')
                        for i, m in enumerate(f1.mean(0)))
        table.append(f'{setting:<50} {n:>2}  {micro:<13}  {macro:<13}  '
                     + ('' if p is None else ', '.join(f'{x:.3g}' for x in p)))
        by = [[f['macro_f1'] for f in [*m['per_depth'].values(), *m['by_frequency']]] for m in runs]
        fig6.append(f'{setting:<50} ' + ' '.join(f'{x:6.2f}' for x in 100 * np.mean(by, 0)))
    print('\n'.join(table + fig6))
    return rows


# The paper's label case study (its t-SNE figure around "Hockey"): nearest labels by the
# verbalizer's embeddings, at initialisation and after training


def similar_main(args, device):
    """change = rank at init (rebuilt from the run's pretrained model) - rank after training."""
    model, _, meta = data.load_checkpoint(args.ckpt, device)
    h, label, top = model.hierarchy, args.similar, args.top
    hits = [u for u, name in enumerate(h.names)
            if label == h.labels[u] or label.lower() == name.lower()]
    if len(hits) != 1:  # a wrong label is the first thing to say
        raise ValueError(f'label {label!r} is ambiguous: ' + ', '.join(h.labels[u] for u in hits)
                         if hits else f"label {label!r} is not in the checkpoint's hierarchy")
    v, path = hits[0], args.model or meta.get('args', {}).get('model')
    if not path or path == 'tiny':  # 'tiny': a random init, not rebuildable
        raise ValueError(f"{args.ckpt}: the run's pretrained model is unknown ({path}); "
                         'pass --model PATH')
    mlm, tokenizer = data.load_pretrained(path)
    if len(tokenizer) != model.base_vocab or mlm.config.hidden_size != model.mlm.config.hidden_size:
        raise ValueError(f'{path}: not the model this checkpoint was trained from '
                         '(vocabulary or width differs)')
    init = lhmix.build_model(mlm, tokenizer, h, model.arch, model.max_length)

    def ranks(m):  # {label: rank}, 1 = nearest, ties by label id (a stable sort)
        emb = m.label_embeddings().detach().float().cpu()
        cos = torch.nn.functional.cosine_similarity(emb, emb[v:v + 1]).tolist()
        order = sorted((u for u in range(len(h)) if u != v), key=lambda u: -cos[u])
        return cos, {u: i for i, u in enumerate(order, 1)}

    (_, at_init), (cos, trained) = ranks(init), ranks(model)
    print(f'labels nearest to {h.labels[v]} ({h.names[v]}) by cosine of the label embeddings, '
          f"top {top}\n{'trained':>7} {'init':>5} {'change':>6} {'cos':>7}  label")
    for u in sorted(trained, key=trained.get):
        if min(trained[u], at_init[u]) <= top:  # 'new': not in the top at init
            change = 'new' if at_init[u] > top else f'{at_init[u] - trained[u]:+d}'
            print(f'{trained[u]:>7} {at_init[u]:>5} {change:>6} {cos[u]:7.3f}  '
                  f'{h.labels[u]} ({h.names[u]})')
    k, kept = min(top, len(trained)), sum(max(trained[u], at_init[u]) <= top for u in trained)
    print(f'{kept} of the top {k} after training were in the top {k} at initialisation')


def parse_device(parser, name):
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
    p = argparse.ArgumentParser(description=__doc__)
    for flag in ('--ckpt', '--predictions', '--data', '--data-dir', '--out', '--save-predictions',
                 '--texts', '--similar', '--model', '--device'):
        p.add_argument(flag)
    p.add_argument('--split', default='test', choices=['train', 'dev', 'test'])
    p.add_argument('--top', type=int, default=15)
    p.add_argument('--summary', nargs='+')
    args = p.parse_args(argv)
    device = parse_device(p, args.device)
    if (args.texts or args.similar) and (not args.ckpt or args.top < 1):
        p.error('--texts and --similar need --ckpt (and --top >= 1)')
    if not (args.summary or args.texts or args.similar
            or args.data and bool(args.ckpt) != bool(args.predictions)):
        p.error('give --data and one of --ckpt or --predictions, or --texts, --similar, --summary')
    try:
        if args.summary:
            summary(args.summary)
        elif args.texts:
            texts_main(args, device)
        else:
            (similar_main if args.similar else score_main)(args, device)
        sys.stdout.flush()  # here, so that a closed pipe is caught below
    except BrokenPipeError:  # `evaluate.py ... | head -2`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except OSError as e:
        sys.exit(f'error: {e.filename}: {e.strerror}' if e.filename else f'error: {e}')
    except ValueError as e:  # a user's mistake: one line
        sys.exit('error: ' + str(e).replace('\n', ' '))


if __name__ == '__main__':
    main()
