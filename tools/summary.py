"""Mean +- sd of finished train.py runs per setting, and Welch's p-value of each setting against
the first (the paper's appendix reports T-tests without naming which; Welch's does not assume
equal variances; needs scipy, else the p-values are left out); or the figures of another tool's
predictions, as evaluate.py reports a checkpoint's.

    python tools/summary.py runs/prompt-lhmix-s? runs/prompt-mixup-s?
    python tools/summary.py --predictions preds.jsonl --data demo
"""
import argparse
import contextlib
import json
import os
import sys
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import data  # noqa: E402
import evaluate  # noqa: E402
import runs  # noqa: E402

NOT_SETTINGS = ('seed', 'data_dir')  # a run's arguments that do not change what it measures


@contextlib.contextmanager
def finished_run(path):
    """Any error reading a run's file `path` (missing, not JSON, not a run's) names it so."""
    try:
        yield
    except Exception as e:
        raise ValueError(f'{path}: not a finished train.py run ({e!r})') from None


def setting_name(args, keys):
    """A setting named by its values of `keys`, the arguments that tell it from the others."""
    return ' '.join(f'{k}={args.get(k)}' for k in keys) or 'all runs'


@dataclass
class Setting:
    """The finished runs of one setting: their arguments but NOT_SETTINGS all equal."""
    name: str      # the arguments that tell it from the other settings given; 'all runs' if none
    args: dict     # train.py's arguments, less NOT_SETTINGS
    folders: list  # each run's folder
    tests: list    # each run's test_metrics.json


def settings(folders):
    """Each run once, grouped by setting in the order given; and the argument names that differ
    between the settings (they name them)."""
    groups = {}
    for run in dict.fromkeys(os.path.realpath(r) for r in folders):
        path = os.path.join(run, runs.TEST_METRICS)
        with finished_run(path):
            with open(path, encoding='utf-8') as f:
                m = json.load(f)
            args = {k: v for k, v in m['args'].items() if k not in NOT_SETTINGS}
        s = groups.setdefault(json.dumps(args, sort_keys=True), Setting('', args, [], []))
        s.folders.append(run)
        s.tests.append(m)
    varying = sorted({k for s in groups.values() for k in s.args
                      if len({json.dumps(t.args.get(k)) for t in groups.values()}) > 1})
    for s in groups.values():
        s.name = setting_name(s.args, varying)
    return list(groups.values()), varying


def summary(folders):
    """Each run once, grouped by setting: n, mean +- sd, Welch's p against the first group, and
    Fig. 7's macro-F1 per depth and label-frequency quartile."""
    groups, _ = settings(folders)
    try:
        from scipy.stats import ttest_ind
    except ImportError:
        ttest_ind = None
        print('(no p-values without scipy: pip install scipy)')
    table = [f"{'setting':<50} {'n':>2}  {'micro-F1':<13}  {'macro-F1':<13}  p vs first"]
    fig7 = [f"\n{'setting':<50} macro-F1 per depth, then per label-frequency quartile "
            '(rarest first)']
    rows = []
    for group in groups:
        setting, ms = group.name, group.tests
        f1, n = 100 * np.array([(m['micro_f1'], m['macro_f1']) for m in ms]), len(ms)
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
        by = [[f['macro_f1'] for f in [*m['per_depth'].values(), *m['by_frequency']]] for m in ms]
        fig7.append(f'{setting:<50} ' + ' '.join(f'{x:6.2f}' for x in 100 * np.mean(by, 0)))
    print('\n'.join(table + fig7))
    return rows


def read_predictions(path, lines, hierarchy, n):
    """(n, V) bool of the lines of a file with a line {"labels": [label, ...]} a document."""
    lines = [(number, line) for number, line in lines if line.strip()]
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


def score_predictions(args):
    lines = data.read_lines(args.predictions)  # the user's file, before the data set is loaded
    hierarchy, splits = data.load_data(args.data, args.data_dir)
    docs = splits[args.split]
    pred = read_predictions(args.predictions, lines, hierarchy, len(docs))
    evaluate.print_report(args.split, evaluate.report(
        pred, [ls for _, ls in docs], hierarchy, [ls for _, ls in splits['train']]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('runs', nargs='*', help='train.py run folders')
    p.add_argument('--predictions', metavar='FILE', help='score this prediction file instead')
    p.add_argument('--data', help='the predictions\' data, as train.py --data')
    p.add_argument('--data-dir', help='as train.py --data-dir')
    p.add_argument('--split', default='test', choices=['train', 'dev', 'test'],
                   help='the predictions\' split (default: test)')
    args = p.parse_args(argv)
    if bool(args.runs) == bool(args.predictions and args.data):
        p.error('give run folders, or --predictions and --data')
    runs.exit_on_error(summary if args.runs else score_predictions, args.runs or args)


if __name__ == '__main__':
    main()
