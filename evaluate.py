"""Score a checkpoint on a split (overall, per depth, per label-frequency quartile), or classify
new texts with it (a JSON line per input line).

    python evaluate.py --ckpt out/demo-prompt-lhmix-s0/best --data demo
    echo "quantum optics" | python evaluate.py --ckpt out/demo-prompt-lhmix-s0/best --texts -
"""
import json
import sys
import time
from os.path import abspath, basename, commonpath, dirname, lexists, realpath

import numpy as np

import data
import lhmix
import runs


def f1_scores(predictions, gold, num_labels, labels=None):
    """Return micro-F1 over all label decisions and macro-F1 over all labels (one neither
    predicted nor present scores 0), as HiAGM and the HTC baselines count them, of (N, V) 0/1
    arrays or label-id lists; `labels` picks a subset of the labels."""
    def matrix(x):  # Either form as an (N, V) bool array.
        return x.astype(bool) if isinstance(x, np.ndarray) else np.array(
            [np.isin(range(num_labels), list(ls)) for ls in x], bool).reshape(-1, num_labels)

    P, G = (matrix(x)[:, slice(None) if labels is None else labels] for x in (predictions, gold))
    # Per label, F1 = 2PR / (P + R) = 2 tp / (predicted + gold).
    tp, n = 2 * (P & G).sum(0), P.sum(0) + G.sum(0)
    per_label = np.divide(tp, n, out=np.zeros(len(tp)), where=n > 0)
    return {'micro_f1': float(tp.sum() / n.sum() if n.sum() else 0),
            'macro_f1': float(per_label.mean() if len(tp) else 0)}


def report(pred, gold, hierarchy, train_labels):
    """Return F1 overall, per depth and per label-frequency quartile, for Fig. 7. The paper does
    not say how it groups frequencies: quartiles by training count, rarest first, are ours."""
    def f1(subset=None, **about):
        return {**about, **f1_scores(pred, gold, len(hierarchy), subset)}

    counts = np.bincount([v for ls in train_labels for v in ls], minlength=len(hierarchy))
    quartiles = np.array_split(np.argsort(counts, kind='stable'), 4)
    per_depth = {d: f1(ls, labels=len(ls)) for d, ls in enumerate(hierarchy.by_depth, 1)}
    by_frequency = [f1(ls, quartile=q, labels=len(ls), train_docs_min=int(min(counts[ls])),
                       train_docs_max=int(max(counts[ls]))) for q, ls in enumerate(quartiles, 1)]
    return {**f1(), 'per_depth': per_depth, 'by_frequency': by_frequency}


def print_report(name, r):
    for what, f in [(name, r), *((f'  depth {d}', f) for d, f in r['per_depth'].items()),
                    *((f"  label-frequency quartile {f['quartile']} ({f['train_docs_min']}-"
                       f"{f['train_docs_max']} train docs)", f) for f in r['by_frequency'])]:
        print(f"{what}: micro-F1 {100 * f['micro_f1']:.2f}  macro-F1 {100 * f['macro_f1']:.2f}")


def classify(model, tokenizer, texts):
    """Return, per text, the predicted labels (by depth), the predicted names on each path from
    the root to a predicted leaf, every label's score, and whether it was cut. An empty text is
    not scored: it predicts nothing and has no scores."""
    h, budget = model.hierarchy, model.text_budget(model.max_length)
    # One word-piece more than fits tells a text that was cut from one that just fits.
    tokens, _ = lhmix.tokenize(tokenizer, texts, budget + 1)
    keep = [i for i, t in enumerate(texts) if t.strip()]
    scores = lhmix.score_documents(model, [tokens[i][:budget] for i in keep])
    out = [{'labels': [], 'paths': [], 'scores': {}, 'truncated': False} for _ in texts]
    for i, s in zip(keep, scores):
        on = set(np.flatnonzero(s > 0))
        # A path ends at a predicted label with no predicted descendant.
        leaves = sorted(on - {a for v in on for a in h.path(v)[:-1]})
        out[i] = {'labels': [h.labels[v] for v in sorted(on, key=lambda v: (h.depth[v], v))],
                  'paths': [[h.names[a] for a in h.path(v) if a in on] for v in leaves],
                  'scores': {v: round(float(x), 4) for v, x in zip(h.labels, s)},
                  'truncated': len(tokens[i]) > budget}
    return out


def save_predictions(path, hierarchy, predicted):
    """Writes the --save-predictions file `path`, if one is named, of label-id sets: a line
    {"labels": [...]} a document, in the tree's order."""
    if path:
        lines = [{'labels': [hierarchy.labels[v] for v in sorted(ids)]} for ids in predicted]
        runs.write_whole(path, ''.join(json.dumps(x, ensure_ascii=False) + '\n' for x in lines))


def check_output(path, flag, ckpt, start):
    """Refuses, before anything is computed, to write `path` into the checkpoint being read, over
    a run's figures, where no folder can be made, or over a file not beginning with `start`."""
    folder = realpath(ckpt)
    if commonpath([realpath(path), folder]) == folder:
        why = f'is inside the checkpoint {ckpt} being read'
    elif basename(path) in (runs.METRICS, runs.TEST_METRICS):
        why = "is a train.py run's own file"
    else:
        why = runs.unwritable(dirname(abspath(path)))
    if not why and lexists(path):
        with open(path, 'rb') as f:  # If it is a folder, the OS says so.
            if f.read(len(start)) != start.encode():
                why = f'exists and is not an earlier {flag} file (remove it or choose another name)'
    if why:
        raise ValueError(f'{flag} {path}: {why}')


def evaluate(args):
    for flag, path, start in (('--out', args.out, '{\n "micro_f1": '),
                              ('--save-predictions', args.save_predictions, '{"labels": [')):
        if path:
            check_output(path, flag, args.ckpt, start)
    if args.texts:
        model, tokenizer, _ = runs.load_checkpoint(args.ckpt, args.device)
        out = classify(model, tokenizer, [line for _, line in data.read_lines(args.texts)])
        h = model.hierarchy
        # Saved before printing, which a closed pipe would end.
        save_predictions(args.save_predictions, h, [[h.index[v] for v in r['labels']] for r in out])
        for r in out:
            print(json.dumps(r, ensure_ascii=False))
        cut = sum(r['truncated'] for r in out)
        if cut:
            print(f'{cut} of {len(out)} texts truncated to max_length {model.max_length}',
                  file=sys.stderr)
        return
    hierarchy, splits = data.load_data(args.data, args.data_dir)
    docs = splits[args.split]
    model, tokenizer, _ = runs.load_checkpoint(args.ckpt, args.device, hierarchy)
    budget, t0 = model.text_budget(model.max_length), time.time()
    tokens, cut = lhmix.tokenize(tokenizer, [t for t, _ in docs], budget)
    pred = lhmix.score_documents(model, tokens) > 0
    print(f'{len(docs)} documents ({cut} truncated to max_length {model.max_length}) '
          f'in {time.time() - t0:.1f} s')
    r = report(pred, [ls for _, ls in docs], hierarchy, [ls for _, ls in splits['train']])
    print_report(args.split, r)
    if args.out:
        runs.write_whole(args.out, json.dumps(r, indent=1))
    save_predictions(args.save_predictions, hierarchy, map(np.flatnonzero, pred))


def main(argv=None):
    p = runs.parser(__doc__)
    add = p.add_argument
    add('--ckpt', required=True, help='a checkpoint folder, such as RUN/best')
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument('--data', help='the data to score, as train.py --data')
    what.add_argument('--texts', metavar='FILE', help='classify the lines of FILE (- : stdin)')
    add('--data-dir', help='as train.py --data-dir')
    add('--split', default='test', choices=data.SPLITS, help='the split to score (default: test)')
    add('--out', help='write the figures here as JSON, as test_metrics.json (--data only)')
    add('--save-predictions', metavar='FILE',
        help='write the predicted labels here: a line {"labels": [...]} a document (or text)')
    runs.add_device(p)
    args = p.parse_args(argv)
    if args.texts and args.out:  # F1 needs gold labels, which texts do not have.
        p.error('--out (F1 figures) needs --data: texts have no gold labels')
    if args.out and args.save_predictions and realpath(args.out) == realpath(args.save_predictions):
        p.error(f'--out and --save-predictions name one file: {args.out}')
    runs.exit_on_error(evaluate, args)


if __name__ == '__main__':
    main()
