"""The claims table of a reproduction study, in Markdown: each claim of the paper's experiments
(Sec. 5), what the paper reports, what the given train.py runs show, and a verdict.

    python -m tools.claims results/records/*/*

Runs are told apart by their arguments (test_metrics.json's), never by their folders' names.
Prompt and BERT are --arch prompt and bert with --mix none; + Mixup is --mix mixup; + LH-Mix is
--mix lhmix at this script's --alpha and --beta (train.py's defaults); the control, Prompt + LH-Mix
with lambda = 0.5, is --arch prompt --mix lhmix --beta 0.5 (Eq. 4 gives 0.5 for every pair at any
--alpha). All at --train-fraction 1 but in Fig. 4. Fig. 5's grids are the Prompt + LH-Mix runs at
--beta 1 (over --alpha) and at --alpha 1 (over --beta, the control aside). Fig. 6 reads each run's
relatives.json, which tools/similar.py --all-labels --out writes. The runs must agree in every
other argument (one data set, one protocol); their seeds are the samples.

Verdicts. A row tests one or more differences, each with the sign that the paper claims. It is
'reproduced' when every difference has the paper's sign and p < 0.05, else 'not reproduced' (no
correction for the several tests of a row: it passes only if each passes, which keeps its chance
of a false 'reproduced' at most 0.05). A difference between two settings' means over their runs
is tested by Welch's t-test, scipy.stats.ttest_ind(equal_var=False); a difference between two such
differences (Fig. 4's gap) by Welch's test of that contrast of four settings (Welch-Satterthwaite
degrees of freedom). A trend over a grid (Fig. 5) is the least-squares slope of the runs' test
macro-F1 over log10 alpha or over beta, its p scipy.stats.linregress's. A trend over the hierarchy
(Fig. 7) is each run's least-squares slope of test macro-F1 over the depths, or over the
label-frequency quartiles from the most frequent to the rarest, compared between settings by
Welch's test. 'Cannot be tested here': the claim needs models or data sets that are not here, or
the runs given lack a setting that it needs (two or more runs each); the row says which.
"""
import argparse
import json
import os
from dataclasses import dataclass

import numpy as np

import runs
import train
from tools.similar import K, RELATIVES
from tools.summary import row_name, settings, welch

DEFAULT = train.parse(['--data', 'wos'])[0]  # train.py's defaults, which the ablation's runs keep
VARIED = ('arch', 'mix', 'alpha', 'beta', 'train_fraction')  # what tells the claims' runs apart
CONTROL = row_name({'arch': 'prompt', 'mix': 'lhmix', 'beta': 0.5})
# The paper's Table 3 (Prompt + LH-Mix is also Table 2's LH-Mix): (micro-F1, macro-F1)
TABLE3 = {
    'WOS': {'BERT': (85.63, 79.07), 'BERT + Mixup': (86.58, 81.05),
            'BERT + LH-Mix': (86.86, 81.31), 'Prompt': (86.94, 81.37),
            'Prompt + Mixup': (87.13, 81.82), 'Prompt + LH-Mix': (87.27, 82.07)},
    'NYT': {'BERT': (78.24, 65.62), 'BERT + Mixup': (78.89, 67.85),
            'BERT + LH-Mix': (79.17, 68.46), 'Prompt': (80.23, 70.13),
            'Prompt + Mixup': (80.35, 70.63), 'Prompt + LH-Mix': (80.57, 71.26)},
    'RCV1-V2': {'BERT': (85.65, 67.02), 'BERT + Mixup': (86.36, 67.33),
                'BERT + LH-Mix': (86.52, 70.04), 'Prompt': (87.11, 69.82),
                'Prompt + Mixup': (87.45, 71.39), 'Prompt + LH-Mix': (87.47, 71.93)}}
F1 = ('micro_f1', 'macro_f1')


class Untestable(Exception):
    """A row that cannot be tested here: why, and what was measured all the same."""

    def __init__(self, why, items=()):
        super().__init__(why)
        self.items = items


@dataclass
class Item:
    """Differences (or slopes) of one comparison, in points, with their p and the sign that the
    paper claims for each (0: none, in a row that cannot be tested here)."""
    what: str
    values: list
    ps: list
    sign: int = 1


def item(what, groups, weights=(1, -1)):
    """An Item of Welch's tests (summary.welch), a metric each (`groups`: per metric, the groups'
    values), each difference claimed positive."""
    values, ps = zip(*(welch(g, weights) for g in groups))
    return Item(what, list(map(float, values)), list(map(float, ps)))


class Runs:
    """The runs given, by setting; + LH-Mix at --alpha `alpha` and --beta `beta`."""

    def __init__(self, folders, alpha, beta):
        self.groups = settings(folders)
        other = sorted({k for s in self.groups for k in s.args if k not in VARIED
                        and len({json.dumps(t.args.get(k)) for t in self.groups}) > 1})
        if other:
            raise ValueError(f'the runs differ in --{other[0].replace("_", "-")} (' + ', '.join(
                sorted({json.dumps(s.args.get(other[0])) for s in self.groups})) + '): the claims '
                'compare the settings of one data set and one protocol; give those runs only')
        self.alpha, self.beta = alpha, beta
        self.data = self.groups[0].args['data']

    def select(self, name, fraction=1.0, **eq4):
        """Each run's test_metrics.json of the row `name` (summary.row_name) and these arguments,
        by folder, its folder as 'folder'."""
        return sorted((dict(t, folder=f) for s in self.groups for f, t in zip(s.folders, s.tests)
                       if row_name(s.args) == name and s.args['train_fraction'] == fraction
                       and all(s.args[k] == v for k, v in eq4.items())),
                      key=lambda t: t['folder'])

    def of(self, name, fraction=1.0):
        """The runs of a row of Table 3, or of the control, at --train-fraction `fraction`."""
        eq4 = {'alpha': self.alpha, 'beta': self.beta} if name.endswith('LH-Mix') else {}
        found = self.select(name, fraction, **eq4)
        if eq4:
            name += f' (--alpha {self.alpha:g} --beta {self.beta:g})'
        where = f' at --train-fraction {fraction:g}' if fraction != 1 else ''
        if len(found) < 2:
            raise Untestable(f'no runs of {name}{where} given' if not found else
                             f"one run of {name}{where}: Welch's test needs two or more")
        return found

    def f1(self, a, b, fraction=1.0):
        """Item: row a − row b in test micro- and macro-F1."""
        ra, rb = self.of(a, fraction), self.of(b, fraction)
        return item(f'{a} − {b}', [[[100 * t[m] for t in r] for r in (ra, rb)] for m in F1])


def paper(*pairs):
    """The paper's Table 3 differences a − b of each pair, micro / macro, per data set."""
    return '; '.join(f'{a} − {b}: ' + ', '.join(
        f'{d} {x[a][0] - x[b][0]:+.2f} / {x[a][1] - x[b][1]:+.2f}' for d, x in TABLE3.items())
        for a, b in pairs)


def fig4(fraction):
    def row(r):
        return [r.f1('Prompt + Mixup', 'Prompt', fraction),
                r.f1('Prompt + LH-Mix', 'Prompt', fraction)]
    return row


def fig4_gap(r):
    runs_ = [r.of(name, f) for f, name in [(0.1, 'Prompt + LH-Mix'), (0.1, 'Prompt + Mixup'),
                                           (1.0, 'Prompt + LH-Mix'), (1.0, 'Prompt + Mixup')]]
    f1 = [[[100 * t[m] for t in group] for group in runs_] for m in F1]
    return [item('+ LH-Mix − + Mixup at 10%', [g[:2] for g in f1]),
            item('the same at 10% − at 100%', f1, (1, -1, -1, 1))]


def trend(what, points, sign):
    """Item: the least-squares slope of y over x of the points (x, y); p: scipy.stats.linregress."""
    from scipy.stats import linregress
    fit = linregress(*zip(*points))
    return Item(what, [float(fit.slope)], [float(fit.pvalue)], sign)


def grid(r, x, fixed):
    """The Prompt + LH-Mix runs at `fixed` = 1 over the grid of `x` (beta's: the control aside):
    (x, macro-F1) of each, x as log10 alpha for alpha, as the paper's alpha grid is spaced."""
    found = r.select('Prompt + LH-Mix', **{fixed: 1.0})  # the control is a row of its own
    if len({t['args'][x] for t in found}) < 2 or len(found) < 3:
        raise Untestable(f'Fig. 5 needs Prompt + LH-Mix runs at --{fixed} 1 and two or more '
                         f'--{x}, three runs or more')
    return [(np.log10(t['args'][x]) if x == 'alpha' else t['args'][x], 100 * t['macro_f1'])
            for t in found]


def fig5_alpha(r):
    """RCV1-V2's fall: a falling slope; NYT's rise, then fall: a rising slope up to the grid's
    middle alpha, a falling one from there."""
    points = grid(r, 'alpha', 'beta')
    if r.data == 'rcv1':
        return [trend('slope over log10 α', points, -1)]
    if r.data != 'nyt':
        raise Untestable(f"the paper's trend in α differs by data set (NYT: rises, then falls; "
                         f'RCV1-V2: falls), which it ascribes to their statistics: it claims none '
                         f'for {r.data}', [trend('slope over log10 α', points, 0)])
    xs = sorted({x for x, _ in points})
    middle = xs[(len(xs) - 1) // 2]
    halves = [p for p in points if p[0] <= middle], [p for p in points if p[0] >= middle]
    if any(len({x for x, _ in h}) < 2 or len(h) < 3 for h in halves):
        raise Untestable("a rise, then a fall needs runs at two or more --alpha on each side of "
                         "the grid's middle, three runs or more a side")
    return [trend(f'slope over log10 α, α {which} {10 ** middle:g}', h, sign)
            for which, h, sign in zip(('≤', '≥'), halves, (1, -1))]


def fig5_beta(r):
    return [trend('slope over β', grid(r, 'beta', 'alpha'), -1)]


def relatives(runs_, name):
    """Each run's relatives.json (tools/similar.py --all-labels): {k: {'init', 'trained'}}."""
    lacking = [t['folder'] for t in runs_ if not os.path.exists(os.path.join(t['folder'],
                                                                            RELATIVES))]
    if lacking:
        raise Untestable(f'{len(lacking)} of the {len(runs_)} runs of {name} have no {RELATIVES} '
                         f'(python -m tools.similar --all-labels --out RUN/{RELATIVES})')
    out = []
    for t in runs_:
        path = os.path.join(t['folder'], RELATIVES)
        try:
            with open(path, encoding='utf-8') as f:
                shares = json.load(f)['relatives_among_nearest']
            out.append({k: {s: 100 * float(shares[str(k)][s]) for s in ('init', 'trained')}
                        for k in K})
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f'{path}: not tools/similar.py --all-labels output ({e!r})') from None
    return out


def fig6(r):
    lhmix, prompt = (relatives(r.of(name), name) for name in ('Prompt + LH-Mix', 'Prompt'))
    ks = ' / '.join(map(str, K))
    return [item(f'+ LH-Mix trained − at initialisation, k {ks}',
                 [[[x[k][s] for x in lhmix] for s in ('trained', 'init')] for k in K]),
            item(f'+ LH-Mix − Prompt, both trained, k {ks}',
                 [[[x[k]['trained'] for x in runs_] for runs_ in (lhmix, prompt)] for k in K])]


def per_level(t, part):
    """A run's test macro-F1 per depth, or per label-frequency quartile, and the x of each: the
    depth, or minus the quartile (quartile 1 holds the rarest labels: rarer is larger)."""
    if part == 'depth':
        return [(int(d), 100 * f['macro_f1']) for d, f in t['per_depth'].items()]
    return [(-f['quartile'], 100 * f['macro_f1']) for f in t['by_frequency']]


def fig7(part):
    def row(r):
        mixup, lhmix, prompt = (r.of(name) for name in ('Prompt + Mixup', 'Prompt + LH-Mix',
                                                        'Prompt'))
        if len(per_level(prompt[0], part)) < 2:
            raise Untestable(f'the data has one {part}')
        slopes = [[np.polyfit(*zip(*per_level(t, part)), 1)[0] for t in runs_]
                  for runs_ in (mixup, lhmix, prompt)]
        per = 'depth' if part == 'depth' else 'quartile toward the rarer'
        return [item(f'{name} − Prompt, slope per {per}', [[slopes[i], slopes[2]]])
                for i, name in enumerate(('+ Mixup', '+ LH-Mix'))]
    return row


def fig7_lhmix(r):
    lhmix, mixup = r.of('Prompt + LH-Mix'), r.of('Prompt + Mixup')
    out = []
    for part, what in (('depth', 'depth'), ('quartile', 'quartile, rarest first')):
        f1 = [np.array([[y for _, y in per_level(t, part)] for t in runs_])
              for runs_ in (lhmix, mixup)]  # (runs, levels) each
        out.append(item(f'+ LH-Mix − + Mixup per {what}',
                        [[g[:, i] for g in f1] for i in range(f1[0].shape[1])]))
    return out


def cannot(why):
    def row(r):
        raise Untestable(why)
    return row


PROMPT = ('Prompt + Mixup', 'Prompt'), ('Prompt + LH-Mix', 'Prompt + Mixup')
BERT = ('BERT + Mixup', 'BERT'), ('BERT + LH-Mix', 'BERT + Mixup')
SPARSE = ('"+Mixup and +LH-Mix continue to perform better than Prompt with the decreasing of '
          'training samples"')
HIERARCHY = ('"as the label hierarchy deepened and the label frequency decreased, the improvement '
             'of +Mixup and +LH-Mix compared to the baseline Prompt is larger and larger" (NYT)')
# Each claim of Sec. 5, in the paper's order: (the claim, the paper's figures or words, ours)
ROWS = [
    ('Table 2: LH-Mix above 15 other models, best in 5 of 6 metrics',
     'LH-Mix: ' + ', '.join(f'{d} {x["Prompt + LH-Mix"][0]} / {x["Prompt + LH-Mix"][1]}'
                            for d, x in TABLE3.items()),
     cannot('the other models and the three data sets are not here')),
    ('Table 3: Prompt above BERT', paper(('Prompt', 'BERT')),
     lambda r: [r.f1('Prompt', 'BERT')]),
    ('Table 3, Prompt: Prompt < + Mixup < + LH-Mix', paper(*PROMPT),
     lambda r: [r.f1(*pair) for pair in PROMPT]),
    ('Table 3, BERT: BERT < + Mixup < + LH-Mix', paper(*BERT),
     lambda r: [r.f1(*pair) for pair in BERT]),
    ('The method (Table 3): mixing at the ratio of local-hierarchy similarity (Eq. 4) beats '
     'mixing without it',
     '"+LH-Mix outperforms +Mixup, providing evidence for the capability of incorporating '
     'hierarchical label correlation in Mixup ratio controlling"; ' + paper(PROMPT[1])
     + '; the control is not in the paper',
     lambda r: [r.f1('Prompt + LH-Mix', CONTROL), r.f1('Prompt + LH-Mix', 'Prompt + Mixup')]),
    ('Table 4: graph encoders (GCN, GAT, Graphormer) add little to Prompt',
     '"the gain from the graph encoder is limited"', cannot('no graph encoder is here')),
    ('Table 5: EDA and back translation below LH-Mix',
     '"both EDA and BT perform worse compared to LH-Mix"',
     cannot('neither augmentation is here')),
    *[(f'Fig. 4, {100 * f:g}% of the training data: + Mixup and + LH-Mix above Prompt', SPARSE,
       fig4(f)) for f in (0.5, 0.25, 0.1)],
    ('Fig. 4: at 10%, + LH-Mix above + Mixup by more than with all the data',
     '"as the dataset decreases extremely to 10%, the performance gap between +LH-Mix and +Mixup '
     'is enlarged"', fig4_gap),
    ('Fig. 5: macro-F1 over α at β = 1', '"When β=1 is fixed, for NYT, the Macro-F1 initially '
     'increases and then decreases with increasing α. For RCV1-V2, the Macro-F1 gradually '
     'decreases."', fig5_alpha),
    ('Fig. 5: macro-F1 falls with β at α = 1', '"when α=1 is fixed, the results for both NYT and '
     'RCV1-V2 gradually decrease with increasing β"', fig5_beta),
    ("Fig. 6: after LH-Mix, more of a label's nearest labels (cosine of the label embeddings) are "
     'its relatives in the tree (parent, children, siblings)', '"Hockey": "NHL" from the top 15 to '
     'the top 3, "Baseball", "Basketball", "NFL" from the top 30 to the top 15; "better '
     'performance in hierarchical label correlation after learning with LH-Mix"', fig6),
    ('Fig. 7: the gains over Prompt grow with depth', HIERARCHY, fig7('depth')),
    ('Fig. 7: the gains over Prompt grow as labels get rarer', HIERARCHY, fig7('quartile')),
    ("Fig. 7: + LH-Mix's gain above + Mixup's", '"the improvement achieved by +LH-Mix is superior '
     'to that of +Mixup" (NYT)', fig7_lhmix),
]


def cells(items):
    """The ours and p cells of a row's items."""
    return ('; '.join(f'{i.what}: ' + ' / '.join(f'{v:+.2f}' for v in i.values) for i in items),
            '; '.join(' / '.join(f'{p:.2g}' for p in i.ps) for i in items))


def claims(args):
    try:
        import scipy.stats  # noqa: F401
    except ImportError:
        raise ValueError('tools/claims.py needs scipy: pip install scipy') from None
    r = Runs(args.runs, args.alpha, args.beta)
    n = sum(len(s.folders) for s in r.groups)
    print(f"The claims of the paper's Sec. 5 against {n} runs of --data {r.data}; a / b: micro- "
          'and macro-F1, in points, unless the row says otherwise. The paper\'s figures give no '
          'numbers in its text: their rows quote its words. The verdict rule, and how runs are '
          'chosen: tools/claims.py.\n\n| claim | the paper | ours | p | verdict |\n'
          '| --- | --- | --- | --- | --- |')
    for claim, said, measure in ROWS:
        try:
            items = measure(r)
            verdict = 'reproduced' if all(
                i.sign * v > 0 and p < 0.05 for i in items for v, p in zip(i.values, i.ps)) \
                else 'not reproduced'
        except Untestable as e:
            items, verdict = e.items, f'cannot be tested here: {e}'
        print(f'| {claim} | {said} | ' + ' | '.join(cells(items)) + f' | {verdict} |')


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('runs', nargs='+', help='train.py run folders, or their records (metrics.jsonl, '
                   f'test_metrics.json, {RELATIVES})')
    p.add_argument('--alpha', type=float, default=DEFAULT.alpha,
                   help="+ LH-Mix's --alpha (Eq. 4; default: train.py's, %(default)s)")
    p.add_argument('--beta', type=float, default=DEFAULT.beta,
                   help="+ LH-Mix's --beta (Eq. 4; default: train.py's, %(default)s)")
    runs.exit_on_error(claims, p.parse_args(argv))


if __name__ == '__main__':
    main()
