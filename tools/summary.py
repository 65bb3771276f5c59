"""Mean +- sd of finished train.py runs per setting, and Welch's p-value of each setting against
the first (the paper's appendix reports T-tests without naming which; Welch's does not assume
equal variances; needs scipy, else the p-values are left out), then Fig. 7's macro-F1 per depth
and label-frequency quartile: two Markdown tables, each setting named as the paper names Table
3's rows (--overall: the first alone); with --each, a row per run instead (a rerun beside the
first runs); with --stops, a row per setting on its early stops; or the figures of another
tool's predictions, as evaluate.py reports a checkpoint's.

    python -m tools.summary runs/prompt-lhmix-s? runs/prompt-mixup-s?
    python -m tools.summary --each runs/prompt-lhmix-s? rerun/prompt-lhmix-s?
    python -m tools.summary --stops runs/prompt-lhmix-s? runs/prompt-mixup-s?
    python -m tools.summary --overall runs/prompt-lhmix-s? runs/prompt-mixup-s?
    python -m tools.summary --predictions preds.jsonl --data demo
"""
import argparse
import contextlib
import json
import os
from dataclasses import dataclass

import numpy as np

from runs import METRICS, TEST_METRICS, exit_on_error, since_best

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


# Fig. 6's study: tools/similar.py writes it, tools/claims.py reads it
K = (3, 15)  # Fig. 6's two spheres: the 3 and the 15 labels most similar to "Hockey"
RELATIVES = 'relatives.json'  # --all-labels' JSON in a run's folder, where tools/claims.py reads it
LEVEL = 0.05  # two-sided: every interval of the tools is a 95% one
NOT_SETTINGS = ('seed', 'data_dir')  # a run's arguments that do not change what it measures
# Table 3's rows, as the paper's text names them (its table writes "Bert" and "+Mixup")
ARCHS, MIXES = {'prompt': 'Prompt', 'bert': 'BERT'}, {'none': '', 'mixup': ' + Mixup',
                                                      'lhmix': ' + LH-Mix'}
GREEK = {'alpha': 'α', 'beta': 'β'}


@contextlib.contextmanager
def finished_run(path):
    """Any error reading a run's file `path` (missing, not JSON, not a run's) names it so."""
    try:
        yield
    except Exception as e:
        raise ValueError(f'{path}: not a finished train.py run ({e!r})') from None


def control(args):
    """Whether a run is the lambda = 0.5 control: LH-Mix at beta 0.5, where Eq. 4 gives 0.5 for
    every pair whatever alpha is."""
    return args['mix'] == 'lhmix' and args['beta'] == 0.5


def row_name(args):
    """The row of Table 3 that a run's arguments make ('Prompt + LH-Mix'), or the control's."""
    return ARCHS[args['arch']] + MIXES[args['mix']] + ', λ = 0.5 (control)' * control(args)


def in_words(key, value):
    """An argument in plain words: 'lr 0.0001', 'α 2', '10% of the training data'; a switch by
    its name when on, nothing when off."""
    words = GREEK.get(key, key.replace('_', ' '))
    if key == 'train_fraction':
        return f'{100 * value:g}% of the training data'
    if isinstance(value, bool):
        return words if value else ''
    return f'{words} {value:g}' if isinstance(value, float) else f'{words} {value}'


def setting_names(all_args, without=()):
    """The name of each setting of `all_args` (their train.py arguments), as the paper names Table
    3's rows ('Prompt + LH-Mix'), with what tells it from the others: LH-Mix's alpha and beta
    where they vary among the LH-Mix settings, then each other argument that varies, in words
    (the share of the training data first). The arguments `without` (a figure's x) are left out:
    the settings that differ only in them share a name."""
    def varies(key, among):
        return len({json.dumps(a.get(key)) for a in among}) > 1

    def name(a, extra=()):
        out = row_name(a)
        if a['mix'] == 'lhmix' and not control(a) and eq4:
            out += ' (' + ', '.join(in_words(k, a[k]) for k in eq4) + ')'
        return ', '.join([out, *filter(None, (in_words(k, a.get(k)) for k in [*words, *extra]))])

    grid = [a for a in all_args if a['mix'] == 'lhmix' and not control(a)]
    eq4 = [k for k in GREEK if k not in without] * any(varies(k, grid) for k in GREEK)
    words = sorted((k for k in {k for a in all_args for k in a} if k not in (
        'arch', 'mix', *GREEK, *without) and varies(k, all_args)),
        key=lambda k: (k != 'train_fraction', k))
    names = [name(a) for a in all_args]
    # A name leaves out alpha and beta where they do not act (Mixup's, the control's alpha):
    # settings that differ only there are told apart by them in words.
    return [name(a, [k for k in GREEK if k not in without and varies(
        k, [b for b, m in zip(all_args, names) if m == n])]) for a, n in zip(all_args, names)]


@dataclass
class Setting:
    """The finished runs of one setting: their arguments but NOT_SETTINGS all equal."""
    name: str      # setting_names' name among the settings given
    args: dict     # train.py's arguments, less NOT_SETTINGS
    folders: list  # each run's folder
    tests: list    # each run's test_metrics.json


def settings(folders):
    """Each run once, grouped by setting in the order given, named by setting_names."""
    groups = {}
    for run in dict.fromkeys(os.path.realpath(r) for r in folders):
        path = os.path.join(run, TEST_METRICS)
        with finished_run(path):
            with open(path, encoding='utf-8') as f:
                m = json.load(f)
            args = {k: v for k, v in m['args'].items() if k not in NOT_SETTINGS}
        s = groups.setdefault(json.dumps(args, sort_keys=True), Setting('', args, [], []))
        s.folders.append(run)
        s.tests.append(m)
    groups = list(groups.values())
    for s, name in zip(groups, setting_names([s.args for s in groups])):
        s.name = name
    return groups


def fig7_columns(tests):
    """Fig. 7's columns over the runs' test_metrics.json `tests`: each depth of the deepest tree
    given, then each label-frequency quartile (rarest first), named with their label count and
    training-document range where the runs agree on them; the number of depths; and each run's
    macro-F1 (%) in each column, NaN below its own tree's depth."""
    depths = max(len(t['per_depth']) for t in tests)
    cells = [[*(t['per_depth'].get(str(d)) for d in range(1, depths + 1)), *t['by_frequency']]
             for t in tests]
    heads = []
    for j, column in enumerate(zip(*cells)):
        head = f'depth {j + 1}' if j < depths else f'Q{j - depths + 1}'
        about = {(f['labels'], f.get('train_docs_min'), f.get('train_docs_max'))
                 for f in column if f}
        if len(about) == 1:  # the runs agree on it
            labels, lo, hi = about.pop()
            head += (f' ({labels} labels)' if j < depths else
                     f': {lo}–{hi} training docs ({labels} labels)')
        heads.append(head)
    return heads, depths, np.array([[np.nan if f is None else 100 * f['macro_f1'] for f in row]
                                    for row in cells])


def mean_sd(x):
    """Mean and sd (ddof 1) over axis 0 of the values that are not NaN: NaN where there are none,
    the sd NaN where there is one."""
    x = np.asarray(x, dtype=float)
    n = (~np.isnan(x)).sum(0)
    with np.errstate(invalid='ignore'):  # 0 / 0
        mean = np.nansum(x, 0) / n
        return mean, np.sqrt(np.nansum((x - mean) ** 2, 0) / (n - 1))


def welch(a, b):
    """Welch's t-test of mean(a) − mean(b), each sample's values along axis 0 (a column a metric):
    the difference, its two-sided p, its standard error and Welch-Satterthwaite's degrees of
    freedom; scipy.stats.ttest_ind(a, b, equal_var=False) with the standard error and df that an
    interval needs. NaN where neither sample has any spread. Needs scipy."""
    from scipy.stats import t
    v = [np.var(x, 0, ddof=1) / len(x) for x in (a, b)]
    diff, se = np.mean(a, 0) - np.mean(b, 0), np.sqrt(sum(v))
    with np.errstate(divide='ignore', invalid='ignore'):
        df = sum(v) ** 2 / sum(x * x / (len(g) - 1) for x, g in zip(v, (a, b)))
        return diff, 2 * t.sf(abs(diff) / se, df), se, df


def markdown(cells):
    return '| ' + ' | '.join(map(str, cells)) + ' |'


def summary(folders, breakdown=True):
    """Each run once, grouped by setting, as two Markdown tables: n, mean +- sd, Welch's p against
    the first setting; with `breakdown`, Fig. 7's macro-F1 per depth and label-frequency
    quartile."""
    groups = settings(folders)
    try:
        import scipy.stats  # noqa: F401 (welch's)
        with_p = True
    except ImportError:
        with_p = False
        print('(no p-values without scipy: pip install scipy)')
    heads, _, by = fig7_columns([t for s in groups for t in s.tests])
    head = ['setting', 'n', 'test micro-F1 (%)', 'test macro-F1 (%)',
            f"Welch's p against {groups[0].name} (micro, macro)"]
    table = [markdown(head), markdown(['---'] * len(head))]
    fig7 = ['', markdown(['test macro-F1 (%), mean over the runs', *heads]),
            markdown(['---'] * (1 + len(heads)))]
    rows = []
    for group in groups:
        f1 = 100 * np.array([(m['micro_f1'], m['macro_f1']) for m in group.tests])
        n, (mean, sd) = len(f1), mean_sd(f1)
        p = None  # one run has no p-value (nor sd)
        if n > 1 and rows and with_p and rows[0]['n'] > 1:
            p = welch(f1, rows[0]['f1'])[1]
        rows.append({'setting': group.name, 'n': n, 'f1': f1, 'mean': mean,
                     'sd': sd if n > 1 else None, 'p': p})
        table.append(markdown([group.name, n, *(f'{m:.2f}' + (f' ± {sd[i]:.2f}' if n > 1 else '')
                                                for i, m in enumerate(mean)),
                               '' if p is None else ', '.join(f'{x:.3g}' for x in p)]))
        mine, by = by[:n], by[n:]
        # empty where none of the setting's runs has the depth
        fig7.append(markdown([group.name, *('' if np.isnan(x) else f'{x:.2f}'
                                            for x in mean_sd(mine)[0])]))
    print('\n'.join(table + fig7 * breakdown))
    return rows


def each(folders):
    """A Markdown row per run, in the order given (each run once), beside its setting's name: a
    rerun of a setting at its seeds, seed by seed against the first runs."""
    groups = settings(folders)
    found = {f: (s.name, t) for s in groups for f, t in zip(s.folders, s.tests)}
    head = ['run', 'setting', 'seed', 'test micro-F1 (%)', 'test macro-F1 (%)', 'best dev epoch']
    print('\n'.join([markdown(head), markdown(['---'] * len(head))]))
    given = {}  # each run under the name it was first given by
    for run in folders:
        given.setdefault(os.path.realpath(run), run)
    for real, run in given.items():
        name, t = found[real]
        print(markdown([run, name, t['args']['seed'], f"{100 * t['micro_f1']:.2f}",
                        f"{100 * t['macro_f1']:.2f}", t['best_epoch']]))


def epochs(folder):
    """A finished run's metrics.jsonl: a dict per epoch, in order."""
    path = os.path.join(folder, METRICS)
    with finished_run(path), open(path, encoding='utf-8') as f:
        return [json.loads(line) for line in f]


def hangs_on_its_best(history, patience):
    """How far (dev macro-F1, points) a run's best epoch stands above its best later one, where
    the run stopped early and would have trained on without that epoch's dev score (put back to
    the epoch's before: a later epoch would then be the best); else None. A later epoch a hair
    below the best (a plateau) counts too: the count is of stops that hang on one epoch."""
    since = since_best(history)
    b = len(history) - 1 - since
    if b == 0 or since < patience:
        return None
    flat = history[:b] + [dict(history[b], dev_macro_f1=history[b - 1]['dev_macro_f1'])]
    if since_best(flat + history[b + 1:]) >= patience:
        return None
    return 100 * (history[b]['dev_macro_f1'] - max(h['dev_macro_f1'] for h in history[b + 1:]))


def stops(folders):
    """A Markdown row per setting on its early stops: the epochs trained, the runs whose stop
    hangs on their best epoch (hangs_on_its_best), and how much of the spread of its test
    macro-F1 goes with the best epoch; then the count over all, with how far the best stood
    above the best later epoch in those runs."""
    head = ['setting', 'n', 'epochs trained', 'would go on without its best epoch',
            'test macro-F1 (%), sd', 'r: best dev epoch, test macro-F1', 'r²']
    print('\n'.join([markdown(head), markdown(['---'] * len(head))]))
    margins, total = [], 0  # of the runs whose stop hangs on one epoch; runs
    for s in settings(folders):
        histories = [epochs(folder) for folder in s.folders]
        trained = np.array([len(h) for h in histories])
        best, macro = np.array([(t['best_epoch'], 100 * t['macro_f1']) for t in s.tests]).T
        hang = [m for m in (hangs_on_its_best(h, s.args['early_stop']) for h in histories)
                if m is not None]
        margins, total = margins + hang, total + len(macro)
        r = np.corrcoef(best, macro)[0, 1] if len(macro) > 2 else None
        print(markdown([s.name, len(macro), f'{trained.min()}–{trained.max()}', len(hang),
                        f'{macro.std(ddof=1):.2f}' if len(macro) > 1 else '',
                        *([f'{r:+.2f}', f'{r * r:.2f}'] if r is not None else ['', ''])]))
    q = np.percentile(margins, [25, 50, 75]) if margins else [np.nan] * 3
    print(f'\n{len(margins)} of the {total} runs would have trained on without their best '
          "epoch's dev score; in them the best stood above the best later epoch by a median "
          f'{q[1]:.2f} points of dev macro-F1 (quartiles {q[0]:.2f}, {q[2]:.2f}).')


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
    import data  # the data set's reader, and with it torch: here alone
    import evaluate
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
    p.add_argument('--each', action='store_true',
                   help='a row per run, not per setting (a rerun against the first runs)')
    p.add_argument('--overall', action='store_true',
                   help="the first table alone, without Fig. 7's breakdown per depth and quartile")
    p.add_argument('--stops', action='store_true',
                   help="a row per setting on its early stops (the runs' metrics.jsonl)")
    p.add_argument('--predictions', metavar='FILE', help='score this prediction file instead')
    p.add_argument('--data', help='the predictions\' data, as train.py --data')
    p.add_argument('--data-dir', help='as train.py --data-dir')
    p.add_argument('--split', default='test', choices=['train', 'dev', 'test'],
                   help='the predictions\' split (default: test)')
    args = p.parse_args(argv)
    if bool(args.runs) == bool(args.predictions and args.data):
        p.error('give run folders, or --predictions and --data')
    if (args.each or args.stops) and not args.runs:
        p.error(f'--{"each" if args.each else "stops"} takes run folders, not predictions')
    if args.each and args.stops:
        p.error('give --each or --stops, not both')
    exit_on_error(each if args.each else stops if args.stops else
                  (lambda r: summary(r, not args.overall)) if args.runs else score_predictions,
                  args.runs or args)


if __name__ == '__main__':
    main()
