"""The claims table of a reproduction study, in Markdown: each claim of the paper's experiments
(Sec. 5) in the paper's words, what the paper reports, what the given train.py runs show, and a
verdict; then, apart, our own tests, which the paper does not make.

    python -m tools.claims results/records/*/*
    python -m tools.claims results/records/table3/* --rerun results/records/rerun/*

Runs are told apart by their arguments (test_metrics.json's), never by their folders' names.
Prompt and BERT are --arch prompt and bert with --mix none; + Mixup is --mix mixup; + LH-Mix is
--mix lhmix at this script's --alpha and --beta (train.py's defaults); the control, Prompt + LH-Mix
with lambda = 0.5, is --arch prompt --mix lhmix --beta 0.5 (Eq. 4 gives 0.5 for every pair at any
--alpha). All at --train-fraction 1 but in Fig. 4. Fig. 5's grids are the Prompt + LH-Mix runs at
--beta 1 (over --alpha) and at --alpha 1 (over --beta, the control aside). Fig. 6 reads each run's
relatives.json, which tools/similar.py --all-labels --out writes. The runs must agree in every
other argument (one data set, one protocol); their seeds are the samples.

Tests. Each line of a table is one comparison in two measures, a / b: test micro- and macro-F1 in
points (Fig. 5: macro-F1 alone, as the paper reads it; Fig. 6: the share of each label's 3 / 15
nearest labels that are its relatives), each with its 95% interval, tested by a t-test (the line
says which):
- Welch: a difference of two settings' means over their runs (or of the runs' slopes, Fig. 7),
  Welch's t with Welch-Satterthwaite's degrees of freedom (tools/summary.py's welch); the interval
  is the difference +- t(0.975, df) SE.
- paired by seed: where the seed fixes what the arms share (Fig. 4, and the control below 100%:
  train.py draws the --train-fraction subset from the seed), the mean of the per-seed
  differences (Fig. 4's gap: of the per-seed contrasts of four settings), Student's t with n - 1
  df over the n seeds; each arm needs the same seeds, once each.
- paired by run: Fig. 6, each run's labels after training against the same run's at
  initialisation, Student's t over the runs.
- slope: a trend over Fig. 5's grid, the least-squares slope of the runs' test macro-F1 over log10
  alpha or over beta, its interval from the slope's standard error and t with n - 2 df
  (scipy.stats.linregress). A trend over the hierarchy (Fig. 7) is each run's least-squares slope
  over the depths, or over the label-frequency quartiles from the most frequent to the rarest,
  compared between settings by Welch's test.
'Detectable' is the smallest true difference that the test finds with 80% power at the two-sided
5% level, at its observed standard error: (t(0.975, df) + t(0.80, df)) SE, the usual
approximation (with the noncentral t, the power there is 0.77 at 2 df, 0.79 at 4 df).

Verdicts. Holm's step-down correction runs within each measure's tests of a table: the paper's
claims are one family per measure, our own tests another. Per measure, a test is 'supported'
where Holm's adjusted p < 0.05 and the difference has the paper's sign, 'contradicted' where the
adjusted p < 0.05 and it has the other sign, else 'inconclusive'. The interval shown is the
unadjusted 95% one, from the same t as the unadjusted p: it clears 0 exactly where that p < 0.05,
and Holm's adjusted p is never below it. So a supported or contradicted test's interval clears 0
on its side; a test whose interval clears 0 but whose adjusted p does not is inconclusive, written
'inconclusive (Holm)'. A line's verdict reads from its measures: supported, contradicted or
inconclusive where they agree, 'partly' where they differ. 'Cannot be tested here': the claim
needs models or data sets that are not here, or the runs given lack a setting that it needs (two
runs or more each); the line says which, and what it measured all the same (outside Holm's
families).

A rerun (--rerun: one setting's runs made again at the seeds of its runs given): per measure, each
set's mean and sd, the mean of the same-seed differences with its interval (paired by seed), and
the sd of one run that the pairs imply, sd(differences) / sqrt(2) (a pair's two runs differ by
two independent draws); then every line whose verdict of a measure changes with the rerun in
place of the first runs, each table measured and corrected again.
"""
import argparse
import json
import os
from dataclasses import dataclass

import numpy as np

import runs
import train
from tools.similar import K, RELATIVES
from tools.summary import markdown, row_name, settings, welch

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
RELATED = tuple(f'relatives among the {k} nearest' for k in K)  # Fig. 6's measures
WORDS = {'micro_f1': 'micro-F1', 'macro_f1': 'macro-F1'}  # the measures in the text
LEVEL, POWER = 0.05, 0.8  # two-sided; the power at which 'detectable' is read


class Untestable(Exception):
    """A claim that cannot be tested here: why, and what was measured all the same."""

    def __init__(self, why, tests=()):
        super().__init__(why)
        self.tests = tests


@dataclass
class Test:
    """One comparison in each of its measures: the difference (or slope, in points), its two-sided
    p, standard error and degrees of freedom, each an array over the measures; how it was tested;
    the sign that the claim gives it (0: none); Holm's adjusted p, set by correct()."""
    what: str
    how: str
    value: np.ndarray
    p: np.ndarray
    se: np.ndarray
    df: np.ndarray
    measures: tuple = F1
    sign: int = 1
    holm: np.ndarray = None

    def interval(self):
        """The unadjusted 95% interval per measure: value +- t(0.975, df) SE."""
        from scipy.stats import t
        half = t.ppf(1 - LEVEL / 2, self.df) * self.se
        return self.value - half, self.value + half

    def detectable(self):
        """The smallest true difference found with 80% power at the two-sided 5% level."""
        from scipy.stats import t
        return (t.ppf(1 - LEVEL / 2, self.df) + t.ppf(POWER, self.df)) * self.se

    def verdicts(self):
        """Per measure: supported / contradicted where Holm's p < 0.05 (the sign says which),
        else inconclusive, '(Holm)' where the unadjusted interval clears 0 all the same."""
        return [('supported' if self.sign * v > 0 else 'contradicted') if h < LEVEL else
                'inconclusive (Holm)' if p < LEVEL else 'inconclusive'
                for v, p, h in zip(self.value, self.p, self.holm)]

    def cells(self):
        """The comparison, how tested, difference [interval], Holm's p, detectable: a / b."""
        lo, hi = self.interval()
        return [self.what, self.how, ' / '.join(f'{v:+.2f} [{a:+.2f}, {b:+.2f}]'
                                                for v, a, b in zip(self.value, lo, hi)),
                ' / '.join(f'{h:.2g}' for h in self.holm) if self.sign else '',
                ' / '.join(f'{d:.2f}' for d in self.detectable())]


def welch_test(what, a, b, measures=F1):
    """Test: Welch's, of a − b (each (runs, measures), in points)."""
    return Test(what, 'Welch', *welch(a, b), measures)


def paired_test(what, d, how='paired by seed', measures=F1):
    """Test: Student's t of the mean of the per-pair differences d ((pairs, measures), points)."""
    from scipy.stats import ttest_1samp
    d = np.asarray(d, dtype=float)
    return Test(what, how, d.mean(0), ttest_1samp(d, 0).pvalue, d.std(0, ddof=1) / np.sqrt(len(d)),
                np.full(d.shape[1], len(d) - 1), measures)


def slope_test(what, points, sign):
    """Test: the least-squares slope of macro-F1 y over x of the points (x, y), n - 2 df."""
    from scipy.stats import linregress
    fit = linregress(*zip(*points))
    return Test(what, 'slope', *(np.array([x]) for x in (fit.slope, fit.pvalue, fit.stderr,
                                                         len(points) - 2)), ('macro_f1',), sign)


def holm(ps):
    """Holm's step-down adjusted p-values of one family: the i-th smallest of m p-values times
    m - i + 1 (i from 1), raised to the largest such product before it, at most 1."""
    ps = np.asarray(ps, dtype=float)
    order = np.argsort(ps)
    adjusted = np.empty_like(ps)
    adjusted[order] = np.minimum(1, np.maximum.accumulate((len(ps) - np.arange(len(ps)))
                                                          * ps[order]))
    return adjusted


def correct(tests):
    """Sets each test's Holm's p: per measure, over the tests given that claim a sign."""
    family = {}
    for test in tests:
        test.holm = np.full(len(test.p), np.nan)
        for i, m in enumerate(test.measures if test.sign else ()):
            family.setdefault(m, []).append((test, i))
    for members in family.values():
        for (test, i), h in zip(members, holm([test.p[i] for test, i in members])):
            test.holm[i] = h


def f1(runs_):
    """(runs, 2): each run's test micro- and macro-F1, in points."""
    return np.array([[100 * t[m] for m in F1] for t in runs_])


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
                             f'one run of {name}{where}: a test needs two or more')
        return found

    def welch(self, a, b, what=None):
        """Test: row a − row b with all the data, Welch's."""
        return welch_test(what or f'{a} − {b}', f1(self.of(a)), f1(self.of(b)))

    def paired(self, what, arms, weights=(1, -1)):
        """Test paired by seed: the per-seed contrast sum_i w_i (arm i's F1) of the arms, each
        (row, fraction), all run at the same seeds."""
        found = [sorted(self.of(*arm), key=lambda t: t['args']['seed']) for arm in arms]
        seeds = [[t['args']['seed'] for t in f] for f in found]
        if any(s != seeds[0] for s in seeds) or len(set(seeds[0])) < len(seeds[0]):
            raise Untestable('a test paired by seed needs the same seeds, once each: ' + '; '.join(
                f'{name} at {100 * f:g}% has seeds ' + ', '.join(map(str, s))
                for (name, f), s in zip(arms, seeds)))
        return paired_test(what, sum(w * f1(f) for w, f in zip(weights, found)))


def paper(*pairs):
    """The paper's Table 3 differences a − b of each pair, micro / macro, per data set."""
    return '; '.join(f'{a} − {b}: ' + ', '.join(
        f'{d} {x[a][0] - x[b][0]:+.2f} / {x[a][1] - x[b][1]:+.2f}' for d, x in TABLE3.items())
        for a, b in pairs)


def fig4(fraction):
    def tests(r):
        return [r.paired(f'{name} − Prompt', [(name, fraction), ('Prompt', fraction)])
                for name in ('Prompt + Mixup', 'Prompt + LH-Mix')]
    return tests


def fig4_gap(r):
    arms = [('Prompt + LH-Mix', 0.1), ('Prompt + Mixup', 0.1), ('Prompt + LH-Mix', 1.0),
            ('Prompt + Mixup', 1.0)]
    return [r.paired('+ LH-Mix − + Mixup at 10%', arms[:2]),
            r.paired('the same at 10% − at 100%', arms, (1, -1, -1, 1))]


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
    points, what = grid(r, 'alpha', 'beta'), 'slope of macro-F1 over log10 α'
    if r.data == 'rcv1':
        return [slope_test(what, points, -1)]
    if r.data != 'nyt':
        raise Untestable(f"the paper's trend in α differs by data set (NYT: rises, then falls; "
                         f'RCV1-V2: falls), which it ascribes to their statistics: it claims none '
                         f'for {r.data}', [slope_test(what, points, 0)])
    xs = sorted({x for x, _ in points})
    middle = xs[(len(xs) - 1) // 2]
    halves = [p for p in points if p[0] <= middle], [p for p in points if p[0] >= middle]
    if any(len({x for x, _ in h}) < 2 or len(h) < 3 for h in halves):
        raise Untestable("a rise, then a fall needs runs at two or more --alpha on each side of "
                         "the grid's middle, three runs or more a side")
    return [slope_test(f'{what}, α {which} {10 ** middle:g}', h, sign)
            for which, h, sign in zip(('≤', '≥'), halves, (1, -1))]


def fig5_beta(r):
    return [slope_test('slope of macro-F1 over β', grid(r, 'beta', 'alpha'), -1)]


def relatives(runs_, name):
    """Each run's relatives.json (tools/similar.py --all-labels): (runs, len(K)), the share of
    relatives among each k nearest labels, in points, at 'init' and 'trained'."""
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
            out.append([[100 * float(shares[str(k)][s]) for k in K] for s in ('init', 'trained')])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f'{path}: not tools/similar.py --all-labels output ({e!r})') from None
    return dict(zip(('init', 'trained'), np.array(out).transpose(1, 0, 2)))


NEAREST = 'relatives among the ' + ' / '.join(map(str, K)) + ' nearest labels'


def fig6(r):
    lhmix = relatives(r.of('Prompt + LH-Mix'), 'Prompt + LH-Mix')
    return [paired_test(f'+ LH-Mix trained − at initialisation, {NEAREST}',
                        lhmix['trained'] - lhmix['init'], 'paired by run', RELATED)]


def fig6_prompt(r):
    lhmix, prompt = (relatives(r.of(name), name)['trained'] for name in ('Prompt + LH-Mix',
                                                                         'Prompt'))
    return [welch_test(f'+ LH-Mix − Prompt, both trained, {NEAREST}', lhmix, prompt, RELATED)]


def per_level(t, part):
    """A run's x of each depth, or each label-frequency quartile, and its test F1 there ((levels,
    2), in points): x is the depth, or minus the quartile (quartile 1 holds the rarest labels:
    rarer is larger)."""
    levels = ([(int(d), f) for d, f in t['per_depth'].items()] if part == 'depth' else
              [(-f['quartile'], f) for f in t['by_frequency']])
    return np.array([x for x, _ in levels]), f1([f for _, f in levels])


def fig7(part):
    def tests(r):
        mixup, lhmix, prompt = (r.of(name) for name in ('Prompt + Mixup', 'Prompt + LH-Mix',
                                                        'Prompt'))
        if len(per_level(prompt[0], part)[0]) < 2:
            raise Untestable(f'the data has one {part}')
        slopes = [np.array([np.polyfit(*per_level(t, part), 1)[0] for t in runs_])
                  for runs_ in (mixup, lhmix, prompt)]  # (runs, 2) each
        per = 'depth' if part == 'depth' else 'quartile toward the rarer'
        return [welch_test(f'{name} − Prompt, slope per {per}', slopes[i], slopes[2])
                for i, name in enumerate(('+ Mixup', '+ LH-Mix'))]
    return tests


def fig7_lhmix(r):
    lhmix, mixup = r.of('Prompt + LH-Mix'), r.of('Prompt + Mixup')
    out = []
    for part in ('depth', 'quartile'):
        xs = per_level(lhmix[0], part)[0].tolist()
        f = [np.array([per_level(t, part)[1] for t in runs_]) for runs_ in (lhmix, mixup)]
        out += [welch_test(f'+ LH-Mix − + Mixup at depth {x}' if part == 'depth' else
                           f'+ LH-Mix − + Mixup in quartile {-x}' + ' (the rarest)' * (x == -1),
                           *(g[:, i] for g in f)) for i, x in enumerate(xs)]
    return out


def control(fraction):
    """Our test: Prompt + LH-Mix against its control at one share of the training data."""
    def tests(r):
        if fraction == 1:
            return [r.welch('Prompt + LH-Mix', CONTROL, 'Prompt + LH-Mix − the control')]
        return [r.paired('Prompt + LH-Mix − the control', [('Prompt + LH-Mix', fraction),
                                                            (CONTROL, fraction)])]
    return tests


def cannot(why):
    def tests(r):
        raise Untestable(why)
    return tests


MIXUP = ('Prompt + Mixup', 'Prompt'), ('BERT + Mixup', 'BERT')
LHMIX = ('Prompt + LH-Mix', 'Prompt + Mixup'), ('BERT + LH-Mix', 'BERT + Mixup')
SHARES = (1.0, 0.5, 0.25, 0.1)
# Each claim of Sec. 5 in the paper's order: (the claim, the paper's figures, its tests)
PAPER = [
    ('Table 2: "LH-Mix achieves the best performance in five out of the total six metrics"',
     'LH-Mix: ' + ', '.join(f'{d} {x["Prompt + LH-Mix"][0]} / {x["Prompt + LH-Mix"][1]}'
                            for d, x in TABLE3.items()),
     cannot('the other models and the three data sets are not here')),
    ('Table 3: "Prompt is superior to the basic BERT model"', paper(('Prompt', 'BERT')),
     lambda r: [r.welch('Prompt', 'BERT')]),
    ('Table 3: "the performance of the +Mixup is better than its corresponding basic BERT or '
     'Prompt model"', paper(*MIXUP), lambda r: [r.welch(*pair) for pair in MIXUP]),
    ('Table 3: "+LH-Mix outperforms +Mixup, providing evidence for the capability of '
     'incorporating hierarchical label correlation in Mixup ratio controlling"', paper(*LHMIX),
     lambda r: [r.welch(*pair) for pair in LHMIX]),
    ('Table 4: "the gain from the graph encoder is limited"', '',
     cannot('no graph encoder is here')),
    ('Table 5: "both EDA and BT perform worse compared to LH-Mix"', '',
     cannot('neither augmentation is here')),
    *[(f'Fig. 4, {100 * f:g}% of the training data: ' + (
        '"+Mixup and +LH-Mix continue to perform better than Prompt with the decreasing of '
        'training samples"' if f == 0.5 else 'the same'), '', fig4(f)) for f in SHARES[1:]],
    ('Fig. 4: "as the dataset decreases extremely to 10%, the performance gap between +LH-Mix '
     'and +Mixup is enlarged"', '', fig4_gap),
    ('Fig. 5: "When β=1 is fixed, for NYT, the Macro-F1 initially increases and then decreases '
     'with increasing α. For RCV1-V2, the Macro-F1 gradually decreases."', '', fig5_alpha),
    ('Fig. 5: "when α=1 is fixed, the results for both NYT and RCV1-V2 gradually decrease with '
     'increasing β"', '', fig5_beta),
    ('Fig. 6: "better performance in hierarchical label correlation after learning with LH-Mix"',
     '"Hockey": "NHL" from the top 15 to the top 3, "Baseball", "Basketball", "NFL" from the top '
     '30 to the top 15', fig6),
    ('Fig. 7, with depth: "as the label hierarchy deepened and the label frequency decreased, the '
     'improvement of +Mixup and +LH-Mix compared to the baseline Prompt is larger and larger"',
     'NYT', fig7('depth')),
    ('Fig. 7, as labels get rarer: the same', 'NYT', fig7('quartile')),
    ('Fig. 7: "the improvement achieved by +LH-Mix is superior to that of +Mixup"', 'NYT',
     fig7_lhmix),
]
# Our own tests, which the paper does not make; the control's first, a line a share
OURS = [
    *[("LH-Mix's ratio (Eq. 4) above mixing every pair at λ = 0.5 (the control), "
       + ('with all the data' if f == 1 else f'{100 * f:g}% of the training data'),
       'the paper has no such control' if f == 1 else '', control(f)) for f in SHARES],
    ('Fig. 6: + LH-Mix moves the labels more than training without Mixup (Prompt)',
     'the paper compares + LH-Mix after and before training only', fig6_prompt),
]


def overall(verdicts):
    """A line's verdict from its measures' verdicts: theirs where they agree, else 'partly'."""
    words = {v.split()[0] for v in verdicts}
    return words.pop() if len(words) == 1 else 'partly'


def measure(rows, r):
    """Each row's (tests, why it cannot be tested or ''), Holm's correction over all its tests."""
    measured = []
    for _, _, tests in rows:
        try:
            measured.append((tests(r), ''))
        except Untestable as e:
            measured.append((list(e.tests), f'cannot be tested here: {e}'))
    correct([test for tests, _ in measured for test in tests])
    return measured


def table(first, rows, measured):
    """Prints a table of the claims `rows` (claim, the paper, tests), a line per measured test."""
    head = [first, 'the paper', 'comparison', 'test', 'difference [95% interval]', "Holm's p",
            'detectable', 'verdict per measure', 'verdict']
    print(markdown(head) + '\n' + markdown(['---'] * len(head)))
    for (claim, said, _), (tests, why) in zip(rows, measured):
        for i, test in enumerate(tests or [None]):
            cells = ([claim, said] if i == 0 else ['', '']) + (test.cells() if test else [''] * 5)
            verdicts = [] if why else test.verdicts()
            print(markdown(cells + ([why, ''] if why else [' / '.join(verdicts),
                                                            overall(verdicts)])))


def rerun_of(r, folders):
    """The setting of the runs `folders` made again, among r's: (its first runs, the rerun), each
    test_metrics.json by seed, each seed once in both."""
    again = settings(folders)
    first = [s for s in r.groups if s.args == again[0].args]
    if len(again) > 1 or not first:
        raise ValueError('--rerun takes the runs of one setting of the runs given (their train.py '
                         'arguments but the seed): ' + (f'it has {len(again)} settings' if
                                                        len(again) > 1 else 'no run given has its'))
    both = sorted(set(again[0].folders) & set(first[0].folders))
    if both:
        raise ValueError(f'--rerun takes runs made again, apart from the runs given: {both[0]} is '
                         'both')
    pair = [sorted(s.tests, key=lambda t: t['args']['seed']) for s in (first[0], again[0])]
    seeds = [[t['args']['seed'] for t in p] for p in pair]
    if seeds[0] != seeds[1] or len(set(seeds[0])) < len(seeds[0]):
        raise ValueError('--rerun needs the seeds of the first runs, once each: ' + '; '.join(
            f'{which} seeds ' + ', '.join(map(str, s))
            for which, s in zip(('the first runs have', 'the rerun has'), seeds)))
    return first[0], pair


def rerun(first, pair, tables, again):
    """Prints the rerun's spread seed by seed against its first runs, then each verdict of the
    tables (each (title, rows, measured)) that changes with the rerun in place of the first runs
    (`again`: the tables so measured)."""
    (a, b), name = (f1(p) for p in pair), first.name
    same = paired_test('rerun − first', b - a)
    lo, hi = same.interval()
    head = ['measure', 'first runs', 'rerun', 'rerun − first, paired by seed [95% interval]',
            'sd of one run, from the pairs']
    print(f'\n**The rerun** of {name}: its {len(a)} runs made again at their seeds, the same '
          'command; a row per measure (test F1, points; mean ± sd over the seeds):\n\n'
          + markdown(head) + '\n' + markdown(['---'] * len(head)))
    for i, m in enumerate(F1):
        print(markdown([WORDS[m], *(f'{x[:, i].mean():.2f} ± {x[:, i].std(ddof=1):.2f}'
                                    for x in (a, b)),
                        f'{same.value[i]:+.2f} [{lo[i]:+.2f}, {hi[i]:+.2f}]',
                        f'{(b - a)[:, i].std(ddof=1) / np.sqrt(2):.2f}']))
    changed = [(was, now, [title, test.what, WORDS.get(m, m), *(
        f"{v}: {t.value[i]:+.2f}, Holm's p {t.holm[i]:.2g}" for t, v in ((test, was),
                                                                         (later, now)))])
        for (title, _, measured), (_, _, measured_again) in zip(tables, again)
        for (tests, why), (tests_again, _) in zip(measured, measured_again) if not why
        for test, later in zip(tests, tests_again)
        for i, (m, was, now) in enumerate(zip(test.measures, test.verdicts(), later.verdicts()))
        if was != now]
    words = sum(was.split()[0] != now.split()[0] for was, now, _ in changed)
    print(f'\nWith the rerun in place of the first runs of {name}, {words or "no"} verdict'
          f'{"s" * (words > 1)} of a measure change{"s" * (words < 2)} its word (supported, '
          'contradicted, inconclusive)' + (
              f'; {len(changed)} lines change, with "(Holm)" where only the unadjusted interval '
              'clears 0:\n\n' + '\n'.join(map(markdown, [
                  ['table', 'comparison', 'measure', 'verdict with the first runs',
                   'with the rerun'], ['---'] * 5, *(line for *_, line in changed)]))
              if changed else '.'))


def claims(args):
    try:
        import scipy.stats  # noqa: F401
    except ImportError:
        raise ValueError('tools/claims.py needs scipy: pip install scipy') from None
    r = Runs(args.runs, args.alpha, args.beta)
    rows = (("The paper's claims", 'claim', PAPER), ('Our own tests', 'our test', OURS))
    tables = [(title, rows_, measure(rows_, r)) for title, _, rows_ in rows]
    if args.rerun:  # the first runs' folders out, the rerun's in
        first, pair = rerun_of(r, args.rerun)
        r_again = Runs([f for s in r.groups if s is not first for f in s.folders] + args.rerun,
                       args.alpha, args.beta)
        again = [(title, rows_, measure(rows_, r_again)) for title, _, rows_ in rows]
    n = sum(len(s.folders) for s in r.groups)
    print(f"The claims of the paper's Sec. 5 against {n} runs of --data {r.data}, then our own "
          'tests, apart. A line is one comparison; a / b: test micro- and macro-F1, in points, '
          'unless it says otherwise. The interval is the unadjusted 95% one; Holm\'s p is '
          "adjusted within the table, per measure; detectable: the smallest difference that the "
          "test finds with 80% power at its sd. Per measure: supported (contradicted) where Holm's "
          "p < 0.05 and the difference has the paper's sign (the other), else inconclusive, "
          "'(Holm)' where the interval alone clears 0; a line's verdict: partly where its "
          "measures differ. The paper's figures give no numbers in its text. The rules, the tests "
          "and how runs are chosen: tools/claims.py.")
    for (title, first_column, rows_), (_, _, measured) in zip(rows, tables):
        print(f'\n**{title}**' + (', in its words:' if rows_ is PAPER else
                                   ', not claims of the paper:') + '\n')
        table(first_column, rows_, measured)
    said = []
    for f, (tests, why) in zip(SHARES, tables[1][2]):  # the control's lines first
        if not why:
            (lo_micro, hi_micro), (lo, hi) = zip(*tests[0].interval())
            said.append(f'{"With all the data" if f == 1 else f"At {100 * f:g}% of the data"}, '
                        f'LH-Mix adds between {lo:+.2f} and {hi:+.2f} points of macro-F1 over '
                        f'mixing at λ = 0.5 (95%; micro-F1: between {lo_micro:+.2f} and '
                        f'{hi_micro:+.2f}).')
    if said:
        print('\n' + ' '.join(said))
    if args.rerun:
        rerun(first, pair, tables, again)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('runs', nargs='+', help='train.py run folders, or their records (metrics.jsonl, '
                   f'test_metrics.json, {RELATIVES})')
    p.add_argument('--alpha', type=float, default=DEFAULT.alpha,
                   help="+ LH-Mix's --alpha (Eq. 4; default: train.py's, %(default)s)")
    p.add_argument('--beta', type=float, default=DEFAULT.beta,
                   help="+ LH-Mix's --beta (Eq. 4; default: train.py's, %(default)s)")
    p.add_argument('--rerun', nargs='+', metavar='RUN', default=[],
                   help='the runs of one setting made again at its seeds: their spread against '
                   'the first runs, and the verdicts that change with them in their place')
    runs.exit_on_error(claims, p.parse_args(argv))


if __name__ == '__main__':
    main()
