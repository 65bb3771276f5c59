"""The claims of a reproduction study, in Markdown: first, a line per comparison, its verdict,
a short label and its difference in each measure; the paper's claims (Sec. 5), then apart our own
tests, which the paper does not make; then the comparisons picked after seeing the results
(exploratory, no verdict); then each line's details: the paper's words and figures, the test,
Holm's p, the difference it could detect.

    python -m tools.claims results/records/*/*
    python -m tools.claims results/records/table3/* --rerun results/records/rerun/*

Runs. Told apart by their arguments (test_metrics.json's), never by their folders' names.
Prompt and BERT are --arch prompt and bert with --mix none; + Mixup is --mix mixup; + LH-Mix is
--mix lhmix at --alpha and --beta (default: train.py's DEFAULTS); the
control, Prompt + LH-Mix with lambda = 0.5, is --arch prompt --mix lhmix --beta 0.5 (Eq. 4 gives
0.5 for every pair at any --alpha). All at --train-fraction 1 but in Fig. 4. Fig. 5's grids are
the Prompt + LH-Mix runs at --beta 1 (over --alpha) and at --alpha 1 (over --beta, the control
aside). Fig. 6 reads each run's relatives.json (tools/similar.py --all-labels --out). The runs
must agree in every other argument (one data set, one protocol), and where their
test_metrics.json records a 'provenance', in its data digests; their seeds are the samples. The
commits and data digests that the runs record are listed, runs without as 'not recorded'.

Measures. Each line is one comparison in two measures, a / b: test micro- / macro-F1 in points;
Fig. 5's slopes are of macro-F1 alone (b), as the paper reads it; Fig. 6's, the share of each
label's 3 / 15 nearest labels that are its relatives, in points. Each with its unadjusted 95%
interval, from a t-test that the line names:
- Welch: a difference of two settings' means over their runs (or of the runs' slopes, Fig. 7),
  Welch's t with Welch-Satterthwaite's df (tools/summary.py's welch); interval: the difference
  +- t(0.975, df) SE.
- paired by seed: the mean of the per-seed differences, Student's t with n - 1 df, each arm at
  the same seeds, once each. One rule for the share of the data: below 100% a seed draws the
  --train-fraction subset that both arms train on (train.py), so the arms pair by seed; at 100%
  a seed shares no subset (only an initialisation that the arms use apart), so they are unpaired,
  Welch's.
- a gap's change (Fig. 4's "enlarged"): the gap at 10% (paired by seed) minus the gap at 100%
  (Welch), independent runs: SE sqrt(se1^2 + se2^2), df by Welch-Satterthwaite's rule,
  (se1^2 + se2^2)^2 / (se1^4 / df1 + se2^4 / df2).
- paired by run: Fig. 6, each run's labels after training against its own at initialisation.
- slope: Fig. 5, the least-squares slope of the runs' test macro-F1 over log10 alpha or over
  beta, its SE and t with n - 2 df (scipy.stats.linregress); Fig. 7, each run's least-squares
  slope over the depths, or over the label-frequency quartiles toward the rarer, compared between
  settings as any two settings are (Welch's at 100%).

Verdicts. Holm's step-down correction runs over the tests of a table in each column, a (micro-F1;
Fig. 6: 3 nearest) and b (macro-F1; Fig. 5; Fig. 6: 15 nearest): the paper's claims are one
family a column, our own tests another. Per measure, a test is 'supported' where Holm's adjusted
p < 0.05 and the difference has the paper's sign (ours: the sign the line names), 'contradicted'
where the adjusted p < 0.05 and it has the other sign, else 'inconclusive', written
'inconclusive (Holm)' where the unadjusted interval clears 0 but the adjusted p does not (the
interval clears 0 exactly where the unadjusted p < 0.05, and Holm's p is never below it). A
verdict that falls in one Holm family of the table's tests of both columns is marked
'(marginal)'. A line's verdict is its measures' where they agree, 'partly' where they differ.
The rule at 100% (Welch's) came after the runs: each verdict that pairing by seed at 100% (every
comparison of two settings, Fig. 6's and Fig. 7's included, and the gap's change by seed) would
give instead is shown beside it where it differs; 'Same-seed
r' is what pairing could use at each share. 'Cannot be tested here': the claim needs models or
data that are not here, or a setting lacks two runs; the line says which, and what it measured
all the same (outside Holm's families). Exploratory comparisons, chosen after seeing Fig. 5's
grid (its ends in alpha), get an interval and no verdict, outside the families.

Detectable: the smallest true difference that the test finds with 80% power at its observed SE,
(t(1 - level / 2, df) + t(0.80, df)) SE, the usual approximation (with the noncentral t, the
power at 5% is 0.77 at 2 df, 0.79 at 4 df): at the two-sided 5% level, and at Holm's strictest
step, 5% / m, m the tests of its family; a verdict needs Holm's p, so the second is the one that
a verdict could reach.

Checkpoints (--checkpoints): the micro-F1 tests of Table 3's and Fig. 4's lines on dev scores,
each run's dev micro-F1 at its best dev macro-F1 epoch (the checkpoint that train.py keeps and
tests) against at its best dev micro-F1 epoch, in the Holm family of the paper's claims' column
a, as the tables (its other tests, which keep no dev score, on test scores); the words that
change between the two, and those that differ from the test's. A test-level answer needs the
runs again.

Rerun (--rerun: one setting's runs made again at the seeds of its runs given): per measure, each
set's mean and sd, the mean of the same-seed differences with its interval (paired by seed), the
sd of one run that the pairs imply, sd(differences) / sqrt(2) (a pair's two runs differ by two
independent draws); then every verdict of a measure that changes with the rerun in place of the
first runs, each table measured and corrected again, and the lines that the rerun cannot test.
"""
import argparse
import copy
import json
import os
from collections import Counter
from dataclasses import dataclass

import numpy as np

from tools.summary import (LEVEL, RELATIVES, K, epochs, exit_on_error, markdown, row_name,
                           settings, welch)

# + LH-Mix's alpha and beta, train.py's DEFAULTS (it imports torch; tests/test_tools.py holds
# them equal)
DEFAULTS = {'alpha': 1.0, 'beta': 0.75}
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
COLUMN = {F1[0]: 0, F1[1]: 1, RELATED[0]: 0, RELATED[1]: 1}  # a or b: Holm's family in a table
WORDS = {'micro_f1': 'micro-F1', 'macro_f1': 'macro-F1'}  # the measures in the text
POWER = 0.8  # at which 'detectable' is read


class Untestable(Exception):
    """A claim that cannot be tested here: why, and what was measured all the same."""

    def __init__(self, why, tests=()):
        super().__init__(why)
        self.tests = tests


@dataclass
class Test:
    """One comparison in each of its measures: the difference (or slope, in points), its two-sided
    p, standard error and degrees of freedom, each an array over the measures; how it was tested;
    the sign that the claim gives it (0: none); Holm's adjusted p and the size of its family, set
    by correct()."""
    what: str
    how: str
    value: np.ndarray
    p: np.ndarray
    se: np.ndarray
    df: np.ndarray
    measures: tuple = F1
    sign: int = 1
    holm: np.ndarray = None
    m: np.ndarray = None
    strict: np.ndarray = None  # Holm's p in one family of the table's tests of both measures

    def interval(self):
        """The unadjusted 95% interval per measure: value +- t(0.975, df) SE."""
        from scipy.stats import t
        half = t.ppf(1 - LEVEL / 2, self.df) * self.se
        return self.value - half, self.value + half

    def detectable(self, level=LEVEL):
        """The smallest true difference found with 80% power at the two-sided `level`."""
        from scipy.stats import t
        return (t.ppf(1 - level / 2, self.df) + t.ppf(POWER, self.df)) * self.se

    def verdicts(self):
        """Per measure: supported / contradicted where Holm's p < 0.05 (the sign says which),
        '(marginal)' where Holm's p in one family of both measures is not; else inconclusive,
        '(Holm)' where the unadjusted interval clears 0 all the same."""
        strict = self.holm if self.strict is None else self.strict
        return [('supported' if self.sign * v > 0 else 'contradicted')
                + ' (marginal)' * bool(s >= LEVEL) if h < LEVEL else
                'inconclusive (Holm)' if p < LEVEL else 'inconclusive'
                for v, p, h, s in zip(self.value, self.p, self.holm, strict)]

    def columns(self, words=()):
        """Its cells in columns a and b: difference [interval] per measure, each followed by
        its word of `words`; '' where the test has no such measure."""
        lo, hi = self.interval()
        out = ['', '']
        for i, m in enumerate(self.measures):
            out[COLUMN[m]] = ' '.join([f'{self.value[i]:+.2f} [{lo[i]:+.2f}, {hi[i]:+.2f}]',
                                       *words[i:i + 1]])
        return out


def welch_test(what, a, b, measures=F1):
    """Test: Welch's, of a − b (each (runs, measures), in points)."""
    return Test(what, 'Welch', *welch(a, b), measures)


def paired_test(what, d, how='paired by seed', measures=F1):
    """Test: Student's t of the mean of the per-pair differences d ((pairs, measures), points)."""
    from scipy.stats import ttest_1samp
    d = np.asarray(d, dtype=float)
    return Test(what, how, d.mean(0), ttest_1samp(d, 0).pvalue, d.std(0, ddof=1) / np.sqrt(len(d)),
                np.full(d.shape[1], len(d) - 1), measures)


def change_test(what, x, y):
    """Test: x − y of two tests of independent runs: SE sqrt(se_x^2 + se_y^2), df by
    Welch-Satterthwaite's rule."""
    from scipy.stats import t
    se = np.hypot(x.se, y.se)
    df = se ** 4 / (x.se ** 4 / x.df + y.se ** 4 / y.df)
    value = x.value - y.value
    return Test(what, f'{x.how} − {y.how}', value, 2 * t.sf(abs(value) / se, df), se, df,
                x.measures)


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
    """Sets each test's Holm's p and family size: per column (COLUMN), over the tests given that
    claim a sign; and its Holm's p in one family of those tests of both columns (strict)."""
    family = {}
    for test in tests:
        test.holm, test.m, test.strict = (np.full(len(test.p), np.nan) for _ in range(3))
        for i, m in enumerate(test.measures if test.sign else ()):
            family.setdefault(COLUMN[m], []).append((test, i))
    for members in family.values():
        for (test, i), h in zip(members, holm([test.p[i] for test, i in members])):
            test.holm[i], test.m[i] = h, len(members)
    members = [x for column in family.values() for x in column]
    for (test, i), h in zip(members, holm([test.p[i] for test, i in members])):
        test.strict[i] = h


def f1(runs_):
    """(runs, 2): each run's test micro- and macro-F1, in points."""
    return np.array([[100 * t[m] for m in F1] for t in runs_])


class Runs:
    """The runs given, by setting; + LH-Mix at --alpha `alpha` and --beta `beta`."""

    def __init__(self, groups, alpha, beta):
        self.groups = groups
        other = sorted({k for s in groups for k in s.args if k not in VARIED
                        and len({json.dumps(t.args.get(k)) for t in groups}) > 1})
        if other:
            raise ValueError(f'the runs differ in --{other[0].replace("_", "-")} (' + ', '.join(
                sorted({json.dumps(s.args.get(other[0])) for s in groups})) + '): the claims '
                'compare the settings of one data set and one protocol; give those runs only')
        self.alpha, self.beta = alpha, beta
        self.data = groups[0].args['data']
        self.paired = False  # at 100% too: the other rule, shown beside the verdicts it moves

    def replaced(self, old, new):
        """These runs with the setting `old` (a Setting of them) made again: `new`'s runs."""
        out = copy.copy(self)
        out.groups = [new if s is old else s for s in self.groups]
        return out

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

    def compare(self, a, b, fraction=1.0, what=None, of=f1, measures=F1):
        """Test: row a − row b at a share of the training data, in the `measures` that `of`
        gives a row's runs ((runs, 2), in points): paired by seed below 100%, where the seed
        draws the subset that both train on; Welch's at 100%, where it does not (unless
        self.paired)."""
        what = what or f'{a} − {b}'
        if fraction == 1 and not self.paired:
            return welch_test(what, of(self.of(a)), of(self.of(b)), measures)
        return paired_test(what, self.by_seed(a, b, fraction, of)[1], measures=measures)

    def by_seed(self, a, b, fraction=1.0, of=f1):
        """(the seeds, (seeds, 2) row a's run's measures − row b's at each), at a share."""
        found = [sorted(self.of(name, fraction), key=lambda t: t['args']['seed'])
                 for name in (a, b)]
        seeds = [[t['args']['seed'] for t in f] for f in found]
        if seeds[0] != seeds[1] or len(set(seeds[0])) < len(seeds[0]):
            raise Untestable('a test paired by seed needs the same seeds, once each: ' + '; '.join(
                f'{name} at {100 * fraction:g}% has seeds ' + ', '.join(map(str, s))
                for name, s in zip((a, b), seeds)))
        return seeds[0], of(found[0]) - of(found[1])


def paper(*pairs):
    """The paper's Table 3 differences a − b of each pair, micro / macro, per data set."""
    return '; '.join(f'{a} − {b}: ' + ', '.join(
        f'{d} {x[a][0] - x[b][0]:+.2f} / {x[a][1] - x[b][1]:+.2f}' for d, x in TABLE3.items())
        for a, b in pairs)


def fig4(fraction):
    def tests(r):
        return [r.compare(name, 'Prompt', fraction) for name in ('Prompt + Mixup',
                                                                  'Prompt + LH-Mix')]
    return tests


GAP = 'Prompt + LH-Mix', 'Prompt + Mixup'


def fig4_generally(r):
    return [r.compare(*GAP, f, f'+ LH-Mix − + Mixup at {100 * f:g}%') for f in SHARES[1:]]


def fig4_enlarged(r):
    """Independent runs at 10% and 100%; paired at 100% too (r.paired), the seed's gap at 10%
    minus its gap at 100%."""
    what = '(+ LH-Mix − + Mixup) at 10% − at 100%'
    if not r.paired:
        return [change_test(what, r.compare(*GAP, 0.1), r.compare(*GAP))]
    (seeds, low), (at_full, full) = r.by_seed(*GAP, 0.1), r.by_seed(*GAP)
    if seeds != at_full:
        raise Untestable('pairing the gaps by seed needs the same seeds at 10% and 100%')
    return [paired_test(what, low - full)]


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


def relatives(runs_):
    """Each run's relatives.json (tools/similar.py --all-labels), the runs of one row: (runs,
    len(K)), the share of relatives among each k nearest labels, in points, at 'init' and
    'trained'."""
    name = row_name(runs_[0]['args'])
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
    lhmix = relatives(r.of('Prompt + LH-Mix'))
    return [paired_test(f'+ LH-Mix trained − at initialisation, {NEAREST}',
                        lhmix['trained'] - lhmix['init'], 'paired by run', RELATED)]


def fig6_prompt(r):
    return [r.compare('Prompt + LH-Mix', 'Prompt', what=f'+ LH-Mix − Prompt, both trained, '
                      f'{NEAREST}', of=lambda runs_: relatives(runs_)['trained'],
                      measures=RELATED)]


def per_level(t, part):
    """A run's x of each depth, or each label-frequency quartile, and its test F1 there ((levels,
    2), in points): x is the depth, or minus the quartile (quartile 1 holds the rarest labels:
    rarer is larger)."""
    levels = ([(int(d), f) for d, f in t['per_depth'].items()] if part == 'depth' else
              [(-f['quartile'], f) for f in t['by_frequency']])
    return np.array([x for x, _ in levels]), f1([f for _, f in levels])


def fig7(part):
    def tests(r):
        if len(per_level(r.of('Prompt')[0], part)[0]) < 2:
            raise Untestable(f'the data has one {part}')

        def slopes(runs_):  # (runs, 2)
            return np.array([np.polyfit(*per_level(t, part), 1)[0] for t in runs_])
        per = 'depth' if part == 'depth' else 'quartile toward the rarer'
        return [r.compare(f'Prompt {name}', 'Prompt', what=f'{name} − Prompt, slope per {per}',
                          of=slopes) for name in ('+ Mixup', '+ LH-Mix')]
    return tests


def fig7_lhmix(r):
    out = []
    for part in ('depth', 'quartile'):
        xs = per_level(r.of('Prompt + LH-Mix')[0], part)[0].tolist()
        out += [r.compare('Prompt + LH-Mix', 'Prompt + Mixup', what=(
            f'+ LH-Mix − + Mixup at depth {x}' if part == 'depth' else
            f'+ LH-Mix − + Mixup in quartile {-x}' + ' (the rarest)' * (x == -1)),
            of=lambda runs_, i=i: np.array([per_level(t, part)[1][i] for t in runs_]))
            for i, x in enumerate(xs)]
    return out


def control(fraction):
    """Our test: Prompt + LH-Mix against its control at one share of the training data."""
    def tests(r):
        return [r.compare('Prompt + LH-Mix', CONTROL, fraction, 'Prompt + LH-Mix − the control')]
    return tests


def cannot(why):
    def tests(r):
        raise Untestable(why)
    return tests


def grid_ends(r):
    """Exploratory, chosen after seeing Fig. 5's grid: the Prompt + LH-Mix runs at beta 1 and
    the grid's largest alpha against the control, and against those at its smallest alpha."""
    found = r.select('Prompt + LH-Mix', beta=1.0)
    alphas = sorted({t['args']['alpha'] for t in found})
    ends = [[t for t in found if t['args']['alpha'] == a] for a in (alphas or [0])[::-1]]
    if len(alphas) < 2 or min(len(ends[0]), len(ends[-1])) < 2:
        raise Untestable("Fig. 5's grid in alpha needs two runs or more at both ends")
    hi, lo = (f'+ LH-Mix at α {a:g}, β 1' for a in (alphas[-1], alphas[0]))
    return [welch_test(f'{hi} − the control', f1(ends[0]), f1(r.of(CONTROL))),
            welch_test(f'{hi} − {lo}', f1(ends[0]), f1(ends[-1]))]


MIXUP = ('Prompt + Mixup', 'Prompt'), ('BERT + Mixup', 'BERT')
LHMIX = ('Prompt + LH-Mix', 'Prompt + Mixup'), ('BERT + LH-Mix', 'BERT + Mixup')
SHARES = (1.0, 0.5, 0.25, 0.1)
FEWER = ('"+Mixup and +LH-Mix continue to perform better than Prompt with the decreasing of '
         'training samples"')
# Each claim of Sec. 5 in the paper's order: (a short label, the claim in its words, the paper's
# figures, its tests)
PAPER = [
    ('Table 2: LH-Mix best in 5 of 6 metrics',
     'Table 2: "LH-Mix achieves the best performance in five out of the total six metrics"',
     'LH-Mix: ' + ', '.join(f'{d} {x["Prompt + LH-Mix"][0]} / {x["Prompt + LH-Mix"][1]}'
                            for d, x in TABLE3.items()),
     cannot('the other models and the three data sets are not here')),
    ('Table 3: Prompt above BERT', 'Table 3: "Prompt is superior to the basic BERT model"',
     paper(('Prompt', 'BERT')), lambda r: [r.compare('Prompt', 'BERT')]),
    ('Table 3: + Mixup above its base', 'Table 3: "the performance of the +Mixup is better '
     'than its corresponding basic BERT or Prompt model"', paper(*MIXUP),
     lambda r: [r.compare(*pair) for pair in MIXUP]),
    ('Table 3: + LH-Mix above + Mixup', 'Table 3: "+LH-Mix outperforms +Mixup, providing '
     'evidence for the capability of incorporating hierarchical label correlation in Mixup '
     'ratio controlling"', paper(*LHMIX), lambda r: [r.compare(*pair) for pair in LHMIX]),
    ('Table 4: little gain from a graph encoder',
     'Table 4: "the gain from the graph encoder is limited"', '',
     cannot('no graph encoder is here')),
    ('Table 5: EDA and BT below LH-Mix',
     'Table 5: "both EDA and BT perform worse compared to LH-Mix"', '',
     cannot('neither augmentation is here')),
    *[(f'Fig. 4: mixing above Prompt at {100 * f:g}%', f'Fig. 4, {100 * f:g}% of the training '
       'data: ' + (FEWER if f == 0.5 else 'the same'), '', fig4(f)) for f in SHARES[1:]],
    ('Fig. 4: + LH-Mix above + Mixup', 'Fig. 4: "+LH-Mix is better than +Mixup generally"', '',
     fig4_generally),
    ('Fig. 4: that gap larger at 10%', 'Fig. 4: "as the dataset decreases extremely to 10%, the '
     'performance gap between +LH-Mix and +Mixup is enlarged"', '', fig4_enlarged),
    ('Fig. 5: macro-F1 over α', 'Fig. 5: "When β=1 is fixed, for NYT, the Macro-F1 initially '
     'increases and then decreases with increasing α. For RCV1-V2, the Macro-F1 gradually '
     'decreases."', '', fig5_alpha),
    ('Fig. 5: macro-F1 falls with β', 'Fig. 5: "when α=1 is fixed, the results for both NYT and '
     'RCV1-V2 gradually decrease with increasing β"', '', fig5_beta),
    ('Fig. 6: labels nearer their relatives after training', 'Fig. 6: "better performance in '
     'hierarchical label correlation after learning with LH-Mix"', '"Hockey": "NHL" from the '
     'top 15 to the top 3, "Baseball", "Basketball", "NFL" from the top 30 to the top 15', fig6),
    ('Fig. 7: gain over Prompt grows with depth', 'Fig. 7, with depth: "as the label hierarchy '
     'deepened and the label frequency decreased, the improvement of +Mixup and +LH-Mix '
     'compared to the baseline Prompt is larger and larger"', 'NYT', fig7('depth')),
    ('Fig. 7: gain over Prompt grows toward rarer labels',
     'Fig. 7, as labels get rarer: the same', 'NYT', fig7('quartile')),
    ("Fig. 7: + LH-Mix's gain above + Mixup's",
     'Fig. 7: "the improvement achieved by +LH-Mix is superior to that of +Mixup"', 'NYT',
     fig7_lhmix),
]
# Our own tests, which the paper does not make; the control's first, a line a share
OURS = [
    *[(f'LH-Mix above the λ = 0.5 control at {100 * f:g}%', "LH-Mix's ratio (Eq. 4) above "
       'mixing every pair at λ = 0.5 (the control), ' + (
           'with all the data' if f == 1 else f'{100 * f:g}% of the training data'),
       'the paper has no such control' if f == 1 else '', control(f)) for f in SHARES],
    ('Fig. 6: + LH-Mix moves labels more than Prompt',
     'Fig. 6: + LH-Mix moves the labels more than training without Mixup (Prompt)',
     'the paper compares + LH-Mix after and before training only', fig6_prompt),
]


def overall(verdicts):
    """A line's verdict from its measures' verdicts: theirs where they agree, else 'partly'."""
    words = {v.split()[0] for v in verdicts}
    return words.pop() if len(words) == 1 else 'partly'


def measure(rows, r):
    """Each row's (tests, why it cannot be tested or ''), Holm's correction over all its tests."""
    measured = []
    for *_, tests in rows:
        try:
            measured.append((tests(r), ''))
        except Untestable as e:
            measured.append((list(e.tests), f'cannot be tested here: {e}'))
    correct([test for tests, _ in measured for test in tests])
    return measured


def lines(rows, measured):
    """Each (row, test or None, why it cannot be tested or ''), a test a line."""
    return [(row, test, why) for row, (tests, why) in zip(rows, measured)
            for test in tests or [None]]


def head(*cells):
    return markdown(cells) + '\n' + markdown(['---'] * len(cells))


def glance(rows, measured, paired):
    """Prints a line per test: its verdict, the claim's label (once a claim), the comparison, and
    a / b each with its verdict, and beside it the verdict paired at 100% (`paired`: the tables so
    measured) where that differs; a claim that cannot be tested, so."""
    print(head('verdict', 'claim', 'comparison', 'a: micro-F1 [95% interval]',
               'b: macro-F1 [95% interval]'))
    last = None
    for (short, *_), (tests, why), (others, other_why) in zip(rows, measured, paired):
        for test, other in zip(tests or [None], (tests if other_why else others) or [None]):
            words = [] if why else [w + f'; paired at 100%: {o}' * (o != w) for w, o in zip(
                test.verdicts(), other.verdicts())]
            print(markdown([why.split(':')[0] if why else overall(test.verdicts()),
                            short * (short != last), test.what if test else '',
                            *(test.columns(words) if test else ['', ''])]))
            last = short


def details(rows, measured):
    """Prints a line per test: the claim in the paper's words and its figures (once a claim),
    how tested, Holm's p, the detectable difference at 5% and at Holm's strictest step; a / b."""
    print(head('claim', 'the paper', 'comparison', 'test', "Holm's p", 'one family',
               'detectable at 5%', 'at 5% / m'))
    last = None
    for (short, words, said, _), test, why in lines(rows, measured):
        first = [words, said] if short != last else ['', '']
        last = short
        if not test:
            print(markdown([*first, '', why, '', '', '', '']))
            continue
        tested = test.sign and not why
        print(markdown([*first, test.what, test.how + (f' ({why})' if why else ''),
                        *(' / '.join(f'{h:.2g}' for h in x) if tested else ''
                          for x in (test.holm, test.strict)),
                        ' / '.join(f'{d:.2f}' for d in test.detectable()),
                        ' / '.join(f'{d:.2f}' for d in test.detectable(LEVEL / test.m))
                        if tested else '']))


def provenance(groups):
    """Where the runs come from, from test_metrics.json's 'provenance' ('not recorded' where a
    run has none): a line listing the commits and the data digests, each with its runs. Runs
    whose data digests differ are refused, named."""
    found = [(f, t.get('provenance') or {}) for s in groups for f, t in zip(s.folders, s.tests)]
    data = {}
    for f, p in found:
        if p.get('data'):
            data.setdefault(json.dumps(p['data'], sort_keys=True), []).append(f)
    if len(data) > 1:
        raise ValueError("the runs' data digests (provenance) differ: " + '; against '.join(
            f'{fs[0]}' + f' and {len(fs) - 1} more' * (len(fs) > 1) for fs in data.values())
            + '; the claims compare runs on the same data')

    def commit(p):
        if 'commit' not in p:
            return 'not recorded'
        return ((p['commit'] or '')[:7] or 'none (not a git checkout)') + ' (uncommitted)' * bool(
            p.get('dirty'))

    def digests(p):
        return 'the same' if p.get('data') else 'not recorded'
    print('Provenance (test_metrics.json): ' + '; '.join(
        f'{what}: {", ".join(f"{v} {n}" for v, n in Counter(map(of, found)).items())}'
        for what, of in (('runs by commit', lambda fp: commit(fp[1])),
                         ('data digests', lambda fp: digests(fp[1])))) + '.')


ROWS = ('Prompt', 'Prompt + Mixup', 'Prompt + LH-Mix', CONTROL, 'BERT', 'BERT + Mixup',
        'BERT + LH-Mix')


def same_seed(r):
    """Prints, per share of the data, the median over pairs of rows at the same seeds of the
    Pearson r between their runs' F1 seed by seed, micro / macro: what pairing by seed can use."""
    out = []
    for f in SHARES:
        found = {}
        for name in ROWS:
            try:
                runs_ = sorted(r.of(name, f), key=lambda t: t['args']['seed'])
            except Untestable:
                continue
            found.setdefault(tuple(t['args']['seed'] for t in runs_), []).append(f1(runs_))
        rs = [[np.corrcoef(x[:, i], y[:, i])[0, 1] for i in range(2)] for group in
              found.values() for j, x in enumerate(group) for y in group[j + 1:]]
        if rs:
            out.append(f'{100 * f:g}% ' + ' / '.join(f'{x:+.2f}' for x in np.median(rs, 0))
                       + f' ({len(rs)} pairs)')
    if out:
        print('\nSame-seed r (median over the pairs of rows at a share, micro / macro): '
              + '; '.join(out) + '.')


def at_dev(r, key):
    """These runs, each run's test F1 replaced by its dev F1 at the epoch of its best `key`
    (metrics.jsonl's dev_micro_f1 or dev_macro_f1; the first of equal ones)."""
    out = copy.copy(r)
    out.groups = []
    for s in r.groups:
        s = copy.copy(s)
        s.tests = [dict(t, **{m: best[f'dev_{m}'] for m in F1}) for t, best in zip(s.tests, (
            max(epochs(f), key=lambda e: e[key]) for f in s.folders))]
        out.groups.append(s)
    return out


def checkpoints(r, measured):
    """Prints the micro-F1 verdicts of Table 3's and Fig. 4's lines at dev level, each run's dev
    F1 at its best dev macro-F1 epoch (its checkpoint) and at its best dev micro-F1 epoch, in the
    Holm family that the paper's claims' table uses (`measured`: its tests on test scores; those
    of the others, which keep no dev score, stay so): the words at each epoch, those that change
    between the two, and those that differ from the test's."""
    dev = {key: at_dev(r, f'dev_{key}') for key in F1}  # each reads every run's metrics.jsonl
    gain = [100 * (b['micro_f1'] - a['micro_f1']) for a, b in zip(*(
        [t for s in dev[key].groups for t in s.tests] for key in F1[::-1]))]

    def micro(found):  # {line: its micro-F1 test} of Table 3's and Fig. 4's lines
        return {f'{row[0]}, {test.what}': test for row, test, why in lines(PAPER, found)
                if test and not why and row[0].startswith(('Table 3', 'Fig. 4'))}
    test = {k: t.verdicts()[0] for k, t in micro(measured).items()}
    at = [{k: t.verdicts()[0] for k, t in micro(measure(PAPER, dev[key])).items()}
          for key in F1[::-1]]
    m = max([int(t.m[0]) for t in micro(measured).values()], default=0)  # the family's size
    changed = [k for k in test if at[0][k].split()[0] != at[1][k].split()[0]]
    unlike = [f'{k}: {w} → {at[0][k]} / {at[1][k]}' for k, w in test.items()
              if {x[k].split()[0] for x in at} != {w.split()[0]}]
    print(f'\n**Checkpoints** (dev level): the best dev micro-F1 epoch is {np.median(gain):.2f} '
          f'points of dev micro-F1 (median; at most {max(gain):.2f}) above the best dev macro-F1 '
          f"epoch (the checkpoint tested). Table 3's and Fig. 4's {len(test)} micro-F1 verdicts "
          f"on dev scores, in the tables' Holm family (column a of the paper's claims, m = {m}: "
          f'the other {m - len(test)} on test scores, as no dev score of theirs is kept), best '
          'macro / micro epoch: ' + ', '.join(
              f'{w} {sum(v.split()[0] == w for v in at[0].values())} / '
              f'{sum(v.split()[0] == w for v in at[1].values())}'
              for w in ('supported', 'contradicted', 'inconclusive'))
          + f'; between the two, {len(changed) or "no"} word{"s" * (len(changed) > 1)} '
          f'change{"s" * (len(changed) < 2)}' + (f' ({"; ".join(changed)})' if changed else '')
          + '. ' + ('Unlike the test words (test → best macro / micro epoch): '
                     + '; '.join(unlike) if unlike else 'Each word is the test\'s') + '.')


def rerun_of(r, folders):
    """The setting of the runs `folders` made again, among r's: (its first runs, its runs made
    again, both test_metrics.json by seed), each seed once in both."""
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
    return first[0], again[0], pair


def rerun(first, pair, tables, again):
    """Prints the rerun's spread seed by seed against its first runs, then each verdict of the
    tables (each (title, rows, measured)) that changes with the rerun in place of the first runs
    (`again`: the tables so measured), and the lines that the rerun leaves untested."""
    (a, b), name = (f1(p) for p in pair), first.name
    same = paired_test('rerun − first', b - a)
    lo, hi = same.interval()
    print(f'\n**The rerun** of {name}: its {len(a)} runs made again at their seeds, the same '
          'command; a row per measure (test F1, points; mean ± sd over the seeds):\n\n'
          + head('measure', 'first runs', 'rerun', 'rerun − first, paired by seed [95% interval]',
                 'sd of one run, from the pairs'))
    for i, m in enumerate(F1):
        print(markdown([WORDS[m], *(f'{x[:, i].mean():.2f} ± {x[:, i].std(ddof=1):.2f}'
                                    for x in (a, b)),
                        f'{same.value[i]:+.2f} [{lo[i]:+.2f}, {hi[i]:+.2f}]',
                        f'{(b - a)[:, i].std(ddof=1) / np.sqrt(2):.2f}']))
    changed, untested = [], []
    for (_, rows, measured), (_, _, measured_again) in zip(tables, again):
        for row, (tests, why), (tests_again, why_again) in zip(rows, measured, measured_again):
            if why_again and not why:
                untested.append(f'{row[0]}: {why_again.removeprefix("cannot be tested here: ")}')
            for test, later in zip(tests if not why_again else (), tests_again):
                for i, (m, was, now) in enumerate(zip(test.measures, test.verdicts(),
                                                      later.verdicts())):
                    if was != now:
                        changed.append((was, now, [row[0], test.what, WORDS.get(m, m), *(
                            f"{v}: {t.value[i]:+.2f}, Holm's p {t.holm[i]:.2g}"
                            for t, v in ((test, was), (later, now)))]))
    words = sum(was.split()[0] != now.split()[0] for was, now, _ in changed)
    print(f'\nWith the rerun in place of the first runs of {name}, {words or "no"} verdict'
          f'{"s" * (words > 1)} of a measure change{"s" * (words < 2)} its word (supported, '
          'contradicted, inconclusive)' + (
              f'; {len(changed)} lines change, with "(Holm)" where only the unadjusted interval '
              'clears 0:\n\n' + '\n'.join([head('claim', 'comparison', 'measure',
                                                'verdict with the first runs', 'with the rerun'),
                                           *(markdown(line) for *_, line in changed)])
              if changed else '.') + (' Not compared, as the rerun cannot test them: '
                                      + '; '.join(untested) + '.' if untested else ''))


def claims(args):
    try:
        import scipy.stats  # noqa: F401
    except ImportError:
        raise ValueError('tools/claims.py needs scipy: pip install scipy') from None
    r = Runs(settings(args.runs), args.alpha, args.beta)
    if args.rerun:
        first, again_runs, pair = rerun_of(r, args.rerun)
    provenance(r.groups + ([again_runs] if args.rerun else []))
    tables = [(title, rows, measure(rows, r)) for title, rows in (
        ("The paper's claims", PAPER), ('Our own tests', OURS))]
    both = copy.copy(r)
    both.paired = True  # paired by seed at 100% too
    paired = [measure(rows, both) for _, rows, _ in tables]
    n = sum(len(s.folders) for s in r.groups)
    print(f'\n{n} runs of --data {r.data}. a / b: test micro- / macro-F1 in points (unless the '
          'line says otherwise), unadjusted 95% interval, verdict (rules: python -m tools.claims '
          '-h).')
    same_seed(r)
    for (title, rows, measured), other in zip(tables, paired):
        print(f'\n**{title}**' + (', in short (its words: below):' if rows is PAPER else
                                   ', not claims of the paper:') + '\n')
        glance(rows, measured, other)
    try:
        picked = grid_ends(r)
        print('\n**Exploratory**, picked after seeing the grid of Fig. 5: no verdict, outside '
              "Holm's families:\n\n" + head('comparison', 'test', 'a: micro-F1 [95% interval]',
                                            'b: macro-F1 [95% interval]'))
        for test in picked:
            print(markdown([test.what, test.how, *test.columns()]))
    except Untestable:
        pass  # no grid given
    m = [' and '.join(f'{n:g}' for n in dict.fromkeys(  # x == x: not NaN, a test in a family
        x for tests, _ in measured for t in tests for x in t.m if x == x))
        for *_, measured in tables]
    print("\n**The details**: the paper's words and figures, each test, Holm's p (per column; "
          'one family: of both), the difference detectable with 80% power at 5% and at 5% / m '
          f"(m: a and b, the paper's claims {m[0]}, ours {m[1]}); a / b:")
    for title, rows, measured in tables:
        print()
        details(rows, measured)
    if args.checkpoints:
        checkpoints(r, tables[0][2])
    if args.rerun:
        again = [(title, rows, measure(rows, r.replaced(first, again_runs)))
                 for title, rows, _ in tables]
        rerun(first, pair, tables, again)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('runs', nargs='+', help='train.py run folders, or their records (metrics.jsonl, '
                   f'test_metrics.json, {RELATIVES})')
    for k in ('alpha', 'beta'):
        p.add_argument(f'--{k}', type=float, default=DEFAULTS.get(k), required=k not in DEFAULTS,
                       help=f"+ LH-Mix's --{k} (Eq. 4; default: train.py's DEFAULTS', "
                       '%(default)s)')
    p.add_argument('--rerun', nargs='+', metavar='RUN', default=[],
                   help='the runs of one setting made again at its seeds: their spread against '
                   'the first runs, and the verdicts that change with them in their place')
    p.add_argument('--checkpoints', action='store_true',
                   help="Table 3's and Fig. 4's micro-F1 verdicts at dev level, each run at its "
                   'best dev macro-F1 epoch and at its best dev micro-F1 epoch (metrics.jsonl)')
    exit_on_error(claims, p.parse_args(argv))


if __name__ == '__main__':
    main()
