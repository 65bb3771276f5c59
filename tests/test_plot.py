"""Tests of tools/plot.py on run folders written by hand (helpers.fake_run), reading its SVGs
as text: each setting's name, the series and points of each figure, and where they lie, checked
against the runs' numbers averaged here (statistics.mean and stdev, the 95% t interval with
scipy's quantile of t) and against Eq. 4; each row's colour; the skipped figures, PNGs, and the
one-line errors."""
import colorsys
import importlib.util
import math
import os
import re
import shutil
import statistics
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import runs
from helpers import error_of, fake_run, tree_state
from tools import claims, plot

SVG, XLINK = '{http://www.w3.org/2000/svg}', '{http://www.w3.org/1999/xlink}href'
# lambda quantiles (0, 5, 25, 50, 75, 95, 100%) of an epoch; the largest of A and B, a rounding
# above beta 0.75, is s = 0; NEAR lies within 2e-5 of 0.5, as the demo's do
A = [0.5, 0.51, 0.53, 0.56, 0.6, 0.68, 0.7500001]
B = [0.5, 0.52, 0.55, 0.58, 0.62, 0.7, 0.7500001]
MIX, HALF = [0.5, 0.53, 0.63, 0.75, 0.87, 0.97, 1.0], [0.5] * 7
NEAR = [0.5, 0.500003, 0.500008, 0.50001, 0.500012, 0.500014, 0.500015]
LH, BERT = {'mix': 'lhmix'}, {'arch': 'bert'}
# Table 3's rows: folder: (test micro, macro, macro per depth, per quartile, epochs (dev macro,
# dev micro, lambdas), best epoch, arguments). Mixup from epoch 1 (BERT + LH-Mix: 2); lhmix-s2
# stops an epoch early.
TABLE3 = {
    'lhmix-s0': (74, 49, (65, 48), (40, 41, 50, 66),
                 [(40, 50, None), (42, 53, A), (45, 54, B)], 2, {}),
    'lhmix-s1': (75, 50, (64, 47), (42, 40, 49, 65),
                 [(41, 51, None), (44, 52, B), (43, 55, A)], 1, {'seed': 1}),
    'lhmix-s2': (73, 48, (66, 46), (41, 42, 51, 67), [(39, 50, None), (43, 54, A)], 1,
                 {'seed': 2}),
    'half-s0': (74.2, 49.2, (64.8, 47.8), (41, 41, 48.5, 65.8),
                [(40, 50, None), (41, 52, HALF), (44, 53, HALF)], 2, {'beta': 0.5}),
    'half-s1': (74.1, 48.8, (64.6, 47.4), (41.5, 40.8, 48.9, 65.7),
                [(40, 51, None), (42, 52, HALF), (43, 52, HALF)], 1, {'beta': 0.5, 'seed': 1}),
    'mixup': (74.8, 48, (64.5, 46.5), (39.5, 39.5, 47.5, 65.8),
              [(40, 51, None), (43, 52, MIX), (42, 53, MIX)], 1, {'mix': 'mixup'}),
    'none-s0': (75.3, 48.3, (64, 45), (40, 39, 48, 66),
                [(41, 50, None), (42, 52, None), (44, 53, None)], 2, {'mix': 'none'}),
    'none-s1': (75.2, 47.8, (63, 46), (40.8, 39.4, 47.5, 66.1),
                [(41, 51, None), (42, 51, None), (41, 52, None)], 1, {'mix': 'none', 'seed': 1}),
    'bert-lhmix': (72.7, 45.5, (62, 44), (32, 35, 48, 66),
                   [(35, 48, None), (36, 49, None), (38, 50, NEAR)], 2, BERT),
    'bert': (74.7, 46.2, (63, 45), (32.5, 37.7, 48.7, 66.2),
             [(35, 48, None), (37, 49, None), (38, 51, None)], 2, {**BERT, 'mix': 'none'})}
T3 = [['lhmix-s0', 'lhmix-s1', 'lhmix-s2'], ['half-s0', 'half-s1'], ['mixup'],
      ['none-s0', 'none-s1'], ['bert-lhmix'], ['bert']]  # as plot.py groups TABLE3, in order
T3_NAMES = ['Prompt + LH-Mix', 'Prompt + LH-Mix, λ = 0.5 (control)', 'Prompt + Mixup', 'Prompt',
            'BERT + LH-Mix', 'BERT']
ARMS = {'none': {'mix': 'none'}, 'mixup': {'mix': 'mixup'}, 'lhmix': LH, 'half': {'beta': 0.5}}
# Fig. 4: each arm at 10% and 50% of the training data, beside Table 3's at 100%
FIG4 = {f'{arm}-{f}': (60 + 10 * f + k, 30 + 20 * f + k) for k, arm in enumerate(ARMS)
        for f in (0.1, 0.5)}
# Fig. 5: LH-Mix over the paper's alpha grid at beta 1 and its beta grid at alpha 1 (beta 0.75:
# Table 3's Prompt + LH-Mix); (1, 1) at two seeds
ALPHAS, BETAS = (0.1, 0.3, 0.6, 1, 2, 5, 10), (0.7, 0.8, 0.85, 0.9, 0.95)
FIG5 = {**{f'alpha{a}': (a, 1) for a in ALPHAS}, **{f'beta{b}': (1, b) for b in BETAS}}


def fig5_macro(alpha, beta, seed=0):
    return 45 + math.log10(alpha) + 4 * (1 - beta) + seed / 2


PLOTTING = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ('matplotlib',
                                                                               'scipy')),
                              reason='tools/plot.py needs matplotlib and scipy (pip install '
                                     'matplotlib scipy)')


@pytest.fixture(scope='module')
def records(tmp_path_factory):
    """TABLE3's, FIG4's and FIG5's runs, each in its folder."""
    root = tmp_path_factory.mktemp('records')
    for name, (micro, macro, depths, quartiles, history, best, args) in TABLE3.items():
        fake_run(root / name, micro, macro, depths, quartiles, history, best, **args)
    for name, (micro, macro) in FIG4.items():
        arm, f = name.split('-')
        fake_run(root / name, micro, macro, history=[(30, 40, None)], train_fraction=float(f),
                 **ARMS[arm])
    for name, (a, b) in FIG5.items():
        for seed in range(1 + (name == 'alpha1')):
            fake_run(root / f'{name}-s{seed}', 70, fig5_macro(a, b, seed), seed=seed,
                     history=[(40, 50, None), (41, 51, list(np.linspace(0.5, b, 7)))],
                     alpha=float(a), beta=float(b))
    return root


@pytest.fixture(scope='module')
def figures(records, tmp_path_factory):
    """The figures of Table 3's runs (t3), of Fig. 4's with them and BERT's, which has one share
    of the data (f4), of Fig. 5's with Table 3's Prompt rows (f5)."""
    out = tmp_path_factory.mktemp('figures')
    t3 = [r for s in T3 for r in s]
    fig5 = [*t3[:3], *(f'{n}-s{s}' for n in FIG5 for s in range(1 + (n == 'alpha1'))), *t3[3:8]]
    for name, folders in [('t3', t3), ('f4', [*t3[:8], *FIG4, 'bert']), ('f5', fig5)]:
        plot.main([str(records / r) for r in folders] + ['--out', str(out / name)])
    return out


def drawn(path):
    """{gid: (its markers' positions, its paths' vertices)} of the artists plot.py names. A band
    (a collection) is a path defined once and placed, as a marker is, by a <use>."""
    def vertices(p):
        return [(float(x), float(y)) for x, y in re.findall(r'[ML] (\S+) (\S+)', p.get('d', ''))]
    root = ET.parse(path).getroot()
    defined = {p.get('id'): vertices(p) for p in root.iter(SVG + 'path') if p.get('id')}
    out = {}
    for g in root.iter(SVG + 'g'):
        if re.match(r'(macro|micro|lambda|eq4|fig[457]|table3|claims)-', g.get('id', '')):
            uses = [(float(u.get('x')), float(u.get('y')), u.get(XLINK)[1:])
                    for u in g.iter(SVG + 'use')]
            out[g.get('id')] = ([(x, y) for x, y, _ in uses], [
                *(v for p in g.iter(SVG + 'path') if not p.get('id') for v in vertices(p)),
                *((x + dx, y + dy) for dx, dy, d in uses for x, y in defined[d])])
    return out


def texts(path):
    """Each text of an SVG figure: {its group's id or '': [its lines]}."""
    out = {}
    for g in ET.parse(path).getroot().iter(SVG + 'g'):
        for t in g.findall(SVG + 'text'):
            out.setdefault(g.get('id', ''), []).append(''.join(t.itertext()))
    return out


def ticks(path):
    """{axes' id: {'x': its x tick labels' lines, 'y': its y tick labels'}}."""
    axes = [a for a in ET.parse(path).getroot().iter(SVG + 'g')
            if re.fullmatch(r'axes_\d+', a.get('id', ''))]
    return {a.get('id'): {x: [''.join(t.itertext()) for g in a.iter(SVG + 'g')
                              if g.get('id', '').startswith(f'{x}tick_')
                              for t in g.iter(SVG + 'text')] for x in 'xy'} for a in axes}


def y_ticks(path, axes):
    """(value, y) of each labelled y tick of an axes."""
    a = next(g for g in ET.parse(path).getroot().iter(SVG + 'g') if g.get('id') == axes)
    return [(float(''.join(next(t.iter(SVG + 'text')).itertext())),
             float(next(t.iter(SVG + 'use')).get('y')))
            for t in a.iter(SVG + 'g') if t.get('id', '').startswith('ytick_')]


def frames(path):
    """The vertical extent (top, bottom) of each axes' frame and of the legend's, in SVG points
    (y downwards), by the ids matplotlib gives them."""
    out = {}
    for g in ET.parse(path).getroot().iter(SVG + 'g'):
        frame = next(g.iter(SVG + 'path'), None)  # none in an empty panel
        if re.fullmatch(r'(axes|legend)_\d+', g.get('id', '')) and frame is not None:
            ys = [float(y) for y in re.findall(r'[ML] \S+ (\S+)', frame.get('d'))]
            out[g.get('id')] = min(ys), max(ys)
    return out


def figure(folder, name):
    """An SVG figure's texts (all, flat), and drawn() of it."""
    path = folder / f'{name}.svg'
    return [t for ts in texts(path).values() for t in ts], drawn(path)


def same_scale(values, coordinates):
    """Whether the drawn coordinates are one affine map of the values (the axis' scale)."""
    a, b = np.polyfit(values, coordinates, 1)
    return a != 0 and np.abs(a * np.array(values) + b - coordinates).max() < 1e-3


def same_set(a, b):
    """Whether each coordinate in `a` is one in `b` and back, to a thousandth of a point."""
    return all((np.abs(np.subtract.outer(a, b)).min(axis) < 1e-3).all() for axis in (0, 1))


def mean(xs):
    return statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else None


def t_interval(xs):
    """The mean of xs and the half-width of its 95% interval, t_{0.975, n-1} s / sqrt(n) (None
    for one value)."""
    from scipy.stats import t
    n = len(xs)
    return statistics.mean(xs), (t.ppf(0.975, n - 1) * statistics.stdev(xs) / math.sqrt(n)
                                 if n > 1 else None)


def segments(artist):
    """Error bars, one artist of drawn(): (x, top, bottom) of each (y downwards)."""
    v = artist[1]
    return [(x, min(y, y1), max(y, y1)) for (x, y), (_, y1) in zip(v[::2], v[1::2])]


def same_points(a, b):
    """Whether each point (x, y) of `a` is one of `b` and back, to a thousandth of a point."""
    d = np.hypot(*(np.array(a)[:, None] - np.array(b)[None]).transpose(2, 0, 1))
    return d.shape[0] == d.shape[1] and (d.min(0) < 1e-3).all() and (d.min(1) < 1e-3).all()


@PLOTTING
def test_every_figure_names_the_settings_as_the_paper_names_its_rows(figures):
    for name, settings in [('curves', range(6)), ('lambda', [0, 1, 2, 4]),  # those that mixed
                           ('table3_f1', range(6)), ('fig7_depth_frequency', range(6))]:
        text = figure(figures / 't3', name)[0]
        assert all(T3_NAMES[i] in text for i in settings), name
    fig4 = figure(figures / 'f4', 'fig4_train_fraction')[0]
    assert all(n in fig4 for n in T3_NAMES[:4])
    assert not [t for t in fig4 if 'BERT' in t or '% of the training' in t]  # no line at one share
    fig5 = figure(figures / 'f5', 'fig5_alpha_beta')[0]
    assert all(n in fig5 for n in ['Prompt + LH-Mix (β 1)', 'Prompt + LH-Mix (α 1)',
                                   *T3_NAMES[1:4]])
    for svg in figures.glob('*/*.svg'):  # no flag in any name, legend or title
        assert not [t for t in figure(svg.parent, svg.stem)[0] if re.search(r'\w=|--', t)]


@PLOTTING
def test_nothing_is_drawn_twice(figures):
    """Settings that share Eq. 4's alpha and beta share its curve; those that start Mixup in one
    epoch, its line: each named artist once in each figure."""
    for svg in figures.glob('*/*.svg'):
        ids = re.findall(r'<g id="((?:macro|micro|lambda|eq4|fig[457]|table3)-[^"]+)"',
                         svg.read_text())
        assert len(ids) == len(set(ids)), svg


@PLOTTING
def test_training_curves_mean_over_seeds_with_sd_best_epochs_and_mixup_start(records, figures):
    _, ds = figure(figures / 't3', 'curves')
    for f1 in ('macro', 'micro'):
        points = []  # (epoch, dev F1 or None, where it is drawn)
        for i, folders in enumerate(T3):
            dev = [[h[f1 == 'micro'] for h in TABLE3[r][4]] for r in folders]
            marks, band = ds[f'{f1}-mean-{i}'][0], ds.get(f'{f1}-sd-{i}', (0, []))[1]
            assert len(marks) == 3 and bool(band) == (len(folders) > 1)
            for e, (x, y) in enumerate(marks):  # epoch 2: the mean of the runs that reached it
                m, sd = mean([run[e] for run in dev if e < len(run)])
                points.append((e, m, (x, y)))
                if sd:  # the band's edges there: mean + sd above, mean - sd below
                    top, bottom = sorted({b for a, b in band if abs(a - x) < 1e-3})
                    points += [(e, m + sd, (x, top)), (e, m - sd, (x, bottom))]
            stars = ds[f'{f1}-best-{i}'][0]
            assert len(stars) == len(folders)
            points += [(TABLE3[r][5], run[TABLE3[r][5]], xy)
                       for r, run, xy in zip(folders, dev, stars)]
        # Mixup starts at epoch 1 for four settings, at 2 for BERT + LH-Mix: a line each epoch
        assert sorted(k for k in ds if k.startswith(f'{f1}-mixup')) == [f'{f1}-mixup-1',
                                                                       f'{f1}-mixup-2']
        points += [(e, None, xy) for e in (1, 2) for xy in ds[f'{f1}-mixup-{e}'][1]]
        epochs, values, xy = zip(*points)
        x, y = np.array(xy).T
        assert same_scale(epochs, x)
        has = [v is not None for v in values]
        assert same_scale([v for v in values if v is not None], y[has])


@PLOTTING
def test_mixing_ratios_per_epoch_a_panel_each_and_on_eq_4s_curve(figures):
    path = figures / 't3' / 'lambda.svg'
    text, ds = figure(figures / 't3', 'lambda')
    mixing = [0, 1, 2, 4]  # the settings that mixed
    assert all(text.count(T3_NAMES[i]) == 2 for i in mixing)  # its panel's title, the legend
    assert not [t for t in text if 'Fig. 3' in t]  # the runs' own curves, not Fig. 3's family
    # each panel has the first's scale, read from its tick labels (slope a), in its own place
    a = np.polyfit(*zip(*y_ticks(path, 'axes_1')), 1)[0]  # (offset b)
    for i in mixing:
        q = [[lam for *_, lam in TABLE3[r][4] if lam] for r in T3[i]]  # epochs with Mixup
        medians = ds[f'lambda-median-{i}'][0]
        assert len(medians) == len(max(q, key=len))
        per_epoch = [np.mean([run[e] for run in q if e < len(run)], 0)
                     for e in range(len(medians))]
        values, ys = [m[3] for m in per_epoch], [y for _, y in medians]
        b = statistics.mean(y - a * v for v, y in zip(values, ys))
        assert ys == pytest.approx([a * v + b for v in values], abs=1e-3)
        assert len([k for k in ds if k.startswith(f'lambda-{i}-')]) == 3
        for lo, hi in [(0, 6), (1, 5), (2, 4)]:  # the bands: the mean of the runs' quantiles
            assert same_set([y for _, y in ds[f'lambda-{i}-{lo}'][1]],
                            [a * m[k] + b for m in per_epoch for k in (lo, hi)])
    # Eq. 4's curve once for the two settings at alpha 1, beta 0.75, once for the control
    assert sorted(k for k in ds if re.fullmatch(r'eq4-[\d.]+-[\d.]+', k)) == ['eq4-1-0.5',
                                                                              'eq4-1-0.75']
    assert sorted(k for k in ds if k.startswith('eq4-quantiles')) == ['eq4-quantiles-0',
                                                                      'eq4-quantiles-4']
    # the curve runs from (s 0, lambda 0.75) to (s 1, lambda 0.5): its ends give the axes'
    # scales, through which the dots are read back
    curve = ds['eq4-1-0.75'][1]
    (x0, y0), (x1, y1) = curve[0], curve[-1]
    for i, lam in [(0, np.mean([A, B, B, A, A], 0)), (4, NEAR)]:  # over epochs and runs
        dots = [((x - x0) / (x1 - x0), 0.75 + (y - y0) / (y1 - y0) * (0.5 - 0.75))
                for x, y in ds[f'eq4-quantiles-{i}'][0]]
        assert [d[1] for d in dots] == pytest.approx(lam, abs=1e-5)
        s = np.maximum(0.75 - np.array(lam), 0) / 0.25  # Eq. 4 solved for s at alpha 1
        assert [d[0] for d in dots] == pytest.approx(s, abs=1e-5)


@PLOTTING
def test_ratios_at_about_one_half_read_without_an_offset(records, tmp_path):
    """The control mixes at exactly 0.5, BERT + LH-Mix here within 2e-5 of it: alone, their axes
    once read 1e-5+5e-1."""
    plot.main([str(records / 'half-s0'), str(records / 'bert-lhmix'), '--out', str(tmp_path)])
    path = tmp_path / 'lambda.svg'
    assert not [t for ts in texts(path).values() for t in ts if re.search(r'\de[-−]?\d', t)]
    labels = ticks(path)
    for k in ('axes_1', 'axes_3'):  # the panels' shared axis (on the first) and Eq. 4's
        assert labels[k]['y'] == ['0.5', '0.6', '0.7', '0.8', '0.9', '1.0']


def colour_of(path, gid, key='stroke'):
    """The colour of an artist's line (its `key`: 'fill' for a bar), as '#rrggbb'."""
    g = next(g for g in ET.parse(path).getroot().iter(SVG + 'g') if g.get('id') == gid)
    return re.search(key + r': (#\w+)', next(g.iter(SVG + 'path')).get('style')).group(1)


def hls(colour):
    """'#rrggbb' as (hue, lightness, saturation)."""
    return colorsys.rgb_to_hls(*(int(colour[k:k + 2], 16) / 255 for k in (1, 3, 5)))


@PLOTTING
def test_a_row_has_one_colour_in_every_figure_and_a_grid_of_it_shades_of_it(records, figures,
                                                                             tmp_path):
    """By the row's name, whatever else is drawn and in whatever order the runs are given."""
    from matplotlib.colors import to_hex
    plot.main([str(records / r) for s in T3[::-1] for r in s] + [
        '--figures', 'curves', 'table3_f1', 'fig7_depth_frequency', '--out', str(tmp_path)])
    seen = {name: [] for name in T3_NAMES}
    for i, name in enumerate(T3_NAMES):
        for folder, k in ((figures / 't3', i), (tmp_path, 5 - i)):  # as given, and reversed
            seen[name] += [colour_of(folder / 'curves.svg', f'macro-mean-{k}'),
                           colour_of(folder / 'table3_f1.svg', f'table3-micro-{k}'),
                           colour_of(folder / 'fig7_depth_frequency.svg', f'fig7-depth-{k}-1',
                                  'fill')]
    for j, name in enumerate(T3_NAMES[:4]):  # Fig. 4: the Prompt rows, in Table 3's order
        seen[name].append(colour_of(figures / 'f4' / 'fig4_train_fraction.svg', f'fig4-micro-{j}'))
    fig5 = figures / 'f5' / 'fig5_alpha_beta.svg'
    for grid in ('alpha', 'beta'):  # the grid's line: LH-Mix's; the other rows' lines
        seen[T3_NAMES[0]].append(colour_of(fig5, f'fig5-{grid}-0'))
        seen[T3_NAMES[1]].append(colour_of(fig5, f'fig5-{grid}-reference-0'))
        seen[T3_NAMES[2]].append(colour_of(fig5, f'fig5-{grid}-reference-1'))
        seen[T3_NAMES[3]].append(colour_of(fig5, f'fig5-{grid}-reference-2'))
    ratios = figures / 'f5' / 'lambda.svg'  # its settings: LH-Mix at 13 points, control, Mixup
    seen[T3_NAMES[1]].append(colour_of(ratios, 'lambda-median-13'))
    seen[T3_NAMES[2]].append(colour_of(ratios, 'lambda-median-14'))
    assert [len(set(c)) for c in seen.values()] == [1] * 6, seen
    assert len({c[0] for c in seen.values()}) == 6  # each row its own: ROWS' where it is alone
    assert [c[0] for c in seen.values()] == [to_hex(plot.ROWS[n]) for n in T3_NAMES]
    # Fig. 5's grid in the mixing ratios: LH-Mix's hue, lighter in the order given
    shades = [hls(colour_of(ratios, f'lambda-median-{i}')) for i in range(13)]
    assert [h for h, _, _ in shades] == pytest.approx([hls(seen[T3_NAMES[0]][0])[0]] * 13,
                                                      abs=0.01)
    assert (np.diff([lightness for _, lightness, _ in shades]) > 0).all()


@PLOTTING
def test_the_mixing_ratios_of_a_whole_fig_5_grid_stay_readable(figures):
    path = figures / 'f5' / 'lambda.svg'
    text, ds = figure(figures / 'f5', 'lambda')
    medians = [k for k in ds if k.startswith('lambda-median-')]
    assert len(medians) == 15  # 13 LH-Mix settings, the control, Mixup: a panel each
    assert len({colour_of(path, k) for k in medians}) == 15  # each its own colour or shade
    names = [f'Prompt + LH-Mix (α {a:g}, β 1)' for a in ALPHAS] + [
        f'Prompt + LH-Mix (α 1, β {b:g})' for b in (0.75, *BETAS)] + T3_NAMES[1:3]
    assert all(text.count(n) == 2 for n in names)  # its panel's title, the legend
    assert len([k for k in ds if k.startswith('eq4-') and 'quantiles' not in k]) == 14  # curves
    box = frames(path)
    legend = box.pop('legend_1')
    assert len(box) == 15 + 1 and legend[0] > max(bottom for _, bottom in box.values())  # below


@PLOTTING
def test_table_3_each_row_its_mean_with_its_95_percent_interval_and_each_seed(figures):
    path = figures / 't3' / 'table3_f1.svg'
    text, ds = figure(figures / 't3', 'table3_f1')
    assert [t for t in text if '95% interval over seeds' in t]
    for f1, column, axes in (('micro', 0, 'axes_1'), ('macro', 1, 'axes_2')):
        rings = [ds[f'table3-{f1}-{i}'][0] for i in range(6)]
        assert all(len(r) == 1 for r in rings)
        xs, ys = [r[0][0] for r in rings], [r[0][1] for r in rings]
        values = [statistics.mean(TABLE3[r][column] for r in s) for s in T3]
        assert same_scale(values, xs)
        assert (np.diff(ys) > 0).all()  # a row each, the first on top (SVG's y grows downwards)
        scale = np.polyfit(values, xs, 1)
        for i, folders in enumerate(T3):
            m, half = t_interval([TABLE3[r][column] for r in folders])
            bars = [(min(x, x1), max(x, x1)) for (x, _), (x1, _) in zip(
                ds[f'table3-{f1}-interval-{i}'][1][::2], ds[f'table3-{f1}-interval-{i}'][1][1::2])]
            assert len(bars) == (half is not None)
            for left, right in bars:
                assert (right - left) / 2 / abs(scale[0]) == pytest.approx(half, rel=1e-5)
                assert (left + right) / 2 == pytest.approx(np.polyval(scale, m), abs=1e-3)
            dots = ds[f'table3-{f1}-seeds-{i}'][0]  # each run's, just below its row's ring
            assert sorted(x for x, _ in dots) == pytest.approx(sorted(
                np.polyval(scale, [TABLE3[r][column] for r in folders])), abs=1e-3)
            assert all(ys[i] < y < (ys[i + 1] if i < 5 else np.inf) for _, y in dots)
        assert ticks(path)[axes]['y'] == (T3_NAMES if f1 == 'micro' else [])  # named once


@PLOTTING
def test_fig_4_test_f1_against_the_share_each_mean_with_its_95_percent_interval(figures):
    text, ds = figure(figures / 'f4', 'fig4_train_fraction')
    assert {'10%', '50%', '100%'} <= set(text)
    assert [t for t in text if '95% interval over seeds' in t]
    arms = [('lhmix', T3[0]), ('half', T3[1]), ('mixup', T3[2]), ('none', T3[3])]  # as given
    for f1, column in (('micro', 0), ('macro', 1)):
        assert sorted(k for k in ds if k.startswith(f'fig4-{f1}')) == [
            *(f'fig4-{f1}-{j}' for j in range(4)), *(f'fig4-{f1}-interval-{j}' for j in range(4))]
        values, shares, lines, xs, ys = [], [], [], [], []  # no line for BERT's one share
        for j, (arm, full) in enumerate(arms):
            points = ds[f'fig4-{f1}-{j}'][0]
            assert len(points) == 3
            values += [FIG4[f'{arm}-0.1'][column], FIG4[f'{arm}-0.5'][column],
                       statistics.mean(TABLE3[r][column] for r in full)]
            shares += [0.1, 0.5, 1]
            lines += [j] * 3
            xs += [x for x, _ in points]
            ys += [y for _, y in points]
        assert same_scale(values, ys)
        # shares on a log scale, each line a little right of the last: x = a log share + b + c j
        design = np.column_stack([np.log(shares), np.ones(len(xs)), lines])
        abc = np.linalg.lstsq(design, xs, rcond=None)[0]
        assert np.abs(design @ abc - xs).max() < 1e-3 and 0 < abc[2] < 0.05 * abc[0]
        scale = np.polyfit(values, ys, 1)
        for j, (arm, full) in enumerate(arms):  # 10% and 50%: one run, no interval; all: Table 3
            m, half = t_interval([TABLE3[r][column] for r in full])
            bars = segments(ds[f'fig4-{f1}-interval-{j}'])
            assert len(bars) == (half is not None)
            for x, top, bottom in bars:
                assert x == pytest.approx(xs[3 * j + 2], abs=1e-3)  # at its line's 100%
                assert (bottom - top) / 2 / abs(scale[0]) == pytest.approx(half, rel=1e-5)
                assert (top + bottom) / 2 == pytest.approx(np.polyval(scale, m), abs=1e-3)


@PLOTTING
def test_fig_5_macro_f1_of_each_seed_and_their_mean_over_the_grids_beside_the_others(figures):
    text, ds = figure(figures / 'f5', 'fig5_alpha_beta')
    assert 'each seed' in text and [t for t in text if '95% interval over seeds' in t]
    one = [fig5_macro(1, 1), fig5_macro(1, 1, 1)]  # (1, 1): two seeds
    for grid, x, seeds in [
            ('alpha', np.log(ALPHAS), [one if a == 1 else [fig5_macro(a, 1)] for a in ALPHAS]),
            ('beta', [0.7, 0.75, *BETAS[1:], 1], [[fig5_macro(1, 0.7)], [
                TABLE3[r][1] for r in T3[0]], *([fig5_macro(1, b)] for b in BETAS[1:]), one])]:
        assert sorted(k for k in ds if k.startswith(f'fig5-{grid}-') and 'reference' not in k
                      ) == [f'fig5-{grid}-0', f'fig5-{grid}-seeds-0']  # one line a grid
        points = np.array(ds[f'fig5-{grid}-0'][0])
        assert same_scale(x, points[:, 0])
        values, ys = [statistics.mean(v) for v in seeds], list(points[:, 1])
        for j, folders in enumerate(T3[1:4]):  # the control, Mixup, Prompt: at their mean,
            m, half = t_interval([TABLE3[r][1] for r in folders])  # their interval a band
            values.append(m)
            ys.append(ds[f'fig5-{grid}-reference-{j}'][1][0][1])
            assert (f'fig5-{grid}-reference-interval-{j}' in ds) == (half is not None)
            if half:
                band = sorted({y for _, y in ds[f'fig5-{grid}-reference-interval-{j}'][1]})
                values += [m + half, m - half]
                ys += band
        assert same_scale(values, ys)
        # each run a dot at its grid point, at the scales of the means
        at = [np.polyval(np.polyfit(x, points[:, 0], 1), x), np.polyfit(values, ys, 1)]
        assert same_points([(x0, np.polyval(at[1], v)) for x0, vs in zip(at[0], seeds)
                            for v in vs], ds[f'fig5-{grid}-seeds-0'][0])


@PLOTTING
def test_fig_7_bars_with_95_percent_intervals_and_the_gains_over_prompt_written(figures):
    path = figures / 't3' / 'fig7_depth_frequency.svg'
    text, ds = figure(figures / 't3', 'fig7_depth_frequency')
    assert [t for t in text if '95% interval over seeds' in t]
    gains = texts(path)
    box = frames(path)
    base = {0: 3, 1: 3, 2: 3, 4: 5}  # the setting without Mixup of each one's arch
    for axes, (part, column, n) in zip(('axes_1', 'axes_2'),
                                       [('depth', 2, 2), ('quartile', 3, 4)]):
        bars = {(i, k): ds.pop(f'fig7-{part}-{i}-{k}')[1] for i in range(6)
                for k in range(1, n + 1)}
        foot = statistics.mode(y for v in bars.values() for _, y in v)  # the bars' foot: 0
        values, ys, means = [0], [foot], {}
        for (i, k), v in bars.items():
            f = [TABLE3[r][column][k - 1] for r in T3[i]]
            means[i, k] = t_interval(f)
            values.append(means[i, k][0])
            ys.append(min((y for _, y in v), key=lambda y: -abs(y - foot)))  # the bar's top
        assert same_scale(values, ys)
        a, b = np.polyfit(values, ys, 1)
        tops = {}  # each interval's top (y downwards)
        for i in range(6):  # each bar's interval at its centre; none for one run
            intervals = segments(ds.pop(f'fig7-{part}-interval-{i}'))
            assert len(intervals) == n * (len(T3[i]) > 1)
            for k, (x, top, bottom) in enumerate(intervals, 1):
                m, half = means[i, k]
                tops[i, k] = top
                assert x == pytest.approx(np.mean([x for x, _ in bars[i, k]]), abs=1e-3)
                assert (bottom - top) / 2 / abs(a) == pytest.approx(half, rel=1e-5)
                assert (top + bottom) / 2 == pytest.approx(a * m + b, abs=1e-3)
        lowest = min(m - (half or 0) for m, half in means.values())
        bottom = (box[axes][1] - b) / a  # the value at the axis' foot
        assert lowest - (max(values) - lowest) / 2 < bottom < lowest  # not 0, no bar cut
        centres = [np.mean([x for x, _ in bars[i, k]]) for k in range(1, n + 1) for i in range(6)]
        assert (np.diff(centres) > 0).all()  # by depth (quartile), then in the settings' order
        for (i, k), v in bars.items():
            gid = f'fig7-{part}-gain-{i}-{k}'
            assert (ds.pop(gid, None) is not None) == (gid in gains) == (i in base)
            if i in base:  # the gain, written above the bar and its interval
                assert gains[gid] == [f'{means[i, k][0] - means[base[i], k][0]:+.2f}']
                g = next(g for g in ET.parse(path).getroot().iter(SVG + 'g')
                         if g.get('id') == gid)
                x, y = map(float, re.search(r'translate\((\S+) (\S+)\)', ET.tostring(
                    g).decode()).groups())
                xs = [x for x, _ in v]
                assert min(xs) < x < max(xs) and y < min(y for _, y in v)
                assert y < tops.get((i, k), np.inf)
    assert not [k for k in ds if k.startswith('fig7')]  # no other bar


@PLOTTING
def test_fig_7s_depths_come_from_the_deepest_tree_given(records, tmp_path):
    fake_run(tmp_path / 'deep', 70, 45, (60, 45, 30), history=[(40, 50, None)],
             mix='mixup')  # given first
    out = tmp_path / 'out'
    plot.main([str(tmp_path / 'deep'), str(records / 'none-s0'), '--out', str(out)])
    _, ds = figure(out, 'fig7_depth_frequency')
    assert ticks(out / 'fig7_depth_frequency.svg')['axes_1']['x'] == [
        'depth 1', '(10 labels)', 'depth 2', '(20 labels)', 'depth 3', '(30 labels)']
    assert sorted(k for k in ds if k.startswith('fig7-depth-')) == [
        'fig7-depth-0-1', 'fig7-depth-0-2', 'fig7-depth-0-3', 'fig7-depth-1-1', 'fig7-depth-1-2',
        'fig7-depth-gain-0-1', 'fig7-depth-gain-0-2',  # Prompt has no depth 3 to gain over
        'fig7-depth-interval-0', 'fig7-depth-interval-1']  # (empty: one run each)


@PLOTTING
def test_a_figure_without_its_runs_is_skipped_in_one_line_and_png_on_request(records, tmp_path,
                                                                             capsys):
    out = tmp_path / 'png'
    plot.main([str(records / 'lhmix-s0'), str(records / 'lhmix-s1'), '--out', str(out),
               '--format', 'png'])
    assert capsys.readouterr().out.splitlines() == [
        f'curves: {out}/curves.png', f'lambda: {out}/lambda.png',
        f'table3_f1: {out}/table3_f1.png',
        'fig4_train_fraction: skipped, needs a setting at two or more --train-fraction',
        'fig5_alpha_beta: skipped, needs LH-Mix runs at two or more --alpha (one --beta) or '
        '--beta (one --alpha)', f'fig7_depth_frequency: {out}/fig7_depth_frequency.png']
    assert sorted(os.listdir(out)) == ['curves.png', 'fig7_depth_frequency.png', 'lambda.png',
                                       'table3_f1.png']
    assert (out / 'curves.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    plot.main([str(records / 'none-s0'), '--out', str(out), '--format', 'png'])  # replaces
    assert capsys.readouterr().out.splitlines()[1] == (
        'lambda: skipped, needs runs that mixed (--mix lhmix or mixup, past --warmup-epochs)')
    chosen = tmp_path / 'chosen'
    plot.main([str(records / 'lhmix-s0'), '--figures', 'fig7_depth_frequency', 'curves', '--out',
               str(chosen)])
    assert capsys.readouterr().out.splitlines() == [
        f'curves: {chosen}/curves.svg', f'fig7_depth_frequency: {chosen}/fig7_depth_frequency.svg']
    assert sorted(os.listdir(chosen)) == ['curves.svg', 'fig7_depth_frequency.svg']


@PLOTTING
def test_bad_input_named_in_one_line_before_anything_is_written(records, tmp_path):
    out, run = tmp_path / 'out', str(records / 'lhmix-s0')
    assert error_of(lambda: plot.main([str(records / 'nowhere'), '--out', str(out)])
                    ).startswith(f'error: {records}/nowhere/test_metrics.json: not a finished '
                                 'train.py run (FileNotFoundError(')
    (tmp_path / 'half').mkdir()
    shutil.copy(records / 'lhmix-s0' / runs.TEST_METRICS, tmp_path / 'half')
    assert error_of(lambda: plot.main([run, str(tmp_path / 'half'), '--out', str(out)])
                    ).startswith(f'error: {tmp_path}/half/metrics.jsonl: not a finished train.py '
                                 'run (FileNotFoundError(')
    (tmp_path / 'file').write_text('')
    assert error_of(lambda: plot.main([run, '--out', str(tmp_path / 'file' / 'out')])) == (
        f'error: {tmp_path}/file/out: Not a directory')
    assert error_of(lambda: plot.main([run, '--figures', 'curves', 'fig9', '--out', str(out)])) == (
        'error: --figures fig9: not one of curves, lambda, table3_f1, fig4_train_fraction, '
        'fig5_alpha_beta, fig7_depth_frequency, claims, claims_headline')
    assert not out.exists()
    out.mkdir()
    (out / 'lambda.svg').write_text('my notes')
    before = tree_state(tmp_path)
    assert error_of(lambda: plot.main([run, '--out', str(out)])) == (
        f'error: --out {out}/lambda.svg: exists and is not an earlier figure (remove it or '
        'choose another --out)')
    assert tree_state(tmp_path) == before


@pytest.mark.parametrize('missing', ['matplotlib', 'scipy'])
def test_without_matplotlib_or_scipy_one_line_says_how_to_install(tmp_path, monkeypatch, missing):
    for name in [m for m in sys.modules if m.split('.')[0] == missing] + [missing]:
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    assert error_of(lambda: plot.main([str(tmp_path), '--out', str(tmp_path / 'out')])) == (
        'error: tools/plot.py needs matplotlib and scipy: pip install matplotlib scipy')
    assert os.listdir(tmp_path) == []


def marker_colour(path, gid):
    """The fill of an artist's marker (drawn by a <use>; its shape is defined once a figure)."""
    g = next(g for g in ET.parse(path).getroot().iter(SVG + 'g') if g.get('id') == gid)
    return re.search(r'fill: (#\w+)', next(g.iter(SVG + 'use')).get('style')).group(1)


# The claims figure: Prompt, BERT and their + Mixup rows, three seeds each (micro, macro), which
# make three lines of tools/claims.py's first table
CLAIMED = {'none': [(75, 48), (75.2, 48.5), (75.4, 47.5)],
           'bert': [(74, 49), (74.3, 47), (74.1, 46)],
           'mixup': [(73, 48.1), (73.1, 47.9), (72.9, 48.3)],
           'bert-mixup': [(74.2, 46.9), (73.9, 47.9), (74.0, 48.4)]}


@PLOTTING
def test_the_claims_figure_draws_each_line_its_interval_verdict_and_side(tmp_path):
    from matplotlib.colors import to_hex
    from scipy import stats
    args = {'none': {'mix': 'none'}, 'bert': {'arch': 'bert', 'mix': 'none'},
            'mixup': {'mix': 'mixup'}, 'bert-mixup': {'arch': 'bert', 'mix': 'mixup'}}
    folders = [fake_run(tmp_path / f'{name}-s{s}', micro, macro, history=[(40, 50, None)],
                        seed=s, **args[name])
               for name, runs_ in CLAIMED.items() for s, (micro, macro) in enumerate(runs_)]
    # Fig. 5's alpha grid: a slope measured, but no claim for this data: no line of the figure
    folders += [fake_run(tmp_path / f'alpha{a}', 70, 48 + a, history=[(40, 50, None)],
                         mix='lhmix', alpha=a, beta=1.0) for a in (0.1, 1.0, 10.0)]
    plot.main([*folders, '--figures', 'claims', '--out', str(tmp_path / 'out')])
    path = tmp_path / 'out' / 'claims.svg'
    art = drawn(path)
    # the lines top down, Welch's by scipy; Holm's over the three in each column, by hand
    pairs = [('none', 'bert'), ('mixup', 'none'), ('bert-mixup', 'bert')]
    tests = [stats.ttest_ind(*(np.array(CLAIMED[k]) for k in pair), equal_var=False)
             for pair in pairs]
    for c in range(2):
        ps = [t.pvalue[c] for t in tests]
        order = sorted(range(3), key=lambda i: ps[i])
        holm, most = [0.0] * 3, 0
        for rank, i in enumerate(order):
            most = holm[i] = max(most, min(1, (3 - rank) * ps[i]))
        values, xs = [], []
        for y, (t, pair) in enumerate(zip(tests, pairs)):
            a, b = (np.array(CLAIMED[k])[:, c] for k in pair)
            ci = t.confidence_interval(0.95)
            (x, _), = art[f'claims-{c}-{y}'][0]
            (lo, _), (hi, _) = art[f'claims-{c}-interval-{y}'][1]
            values += [a.mean() - b.mean(), ci.low[c], ci.high[c]]
            xs += [x, lo, hi]
            verdict = (('supported' if a.mean() > b.mean() else 'contradicted') if holm[y] < 0.05
                       else 'inconclusive (Holm)' if ps[y] < 0.05 else 'inconclusive')
            assert marker_colour(path, f'claims-{c}-{y}') == to_hex(plot.VERDICTS[verdict][1])
            side = [x for x, _ in art[f'claims-{c}-side-{y}'][1]]
            zero = art[f'claims-{c}-zero'][1][0][0]
            assert min(side) == pytest.approx(zero, abs=1e-3) and max(side) > zero  # +: right
        assert same_scale(values + [0], xs + [zero])
    # the records were made to give each verdict: micro-F1 Prompt − BERT supported, Prompt +
    # Mixup − Prompt contradicted; the rest inconclusive; every verdict its marker and colour
    assert [marker_colour(path, f'claims-0-{y}') for y in range(3)][:2] == [
        to_hex(plot.VERDICTS[v][1]) for v in ('supported', 'contradicted')]
    assert len({m for m, _ in plot.VERDICTS.values()}) == len(
        {to_hex(c) for _, c in plot.VERDICTS.values()}) == 4
    assert ticks(path)['axes_1']['y'] == [
        'Table 3: Prompt above BERT', 'Prompt − BERT', 'Table 3: + Mixup above its base',
        'Prompt + Mixup − Prompt', 'Table 3: + Mixup above its base', 'BERT + Mixup − BERT']


def rows_and_split(path):
    """(the SVG y of each line's tick, top down; of the line between the paper's claims and
    ours, or None)."""
    a = next(g for g in ET.parse(path).getroot().iter(SVG + 'g') if g.get('id') == 'axes_1')
    rows = sorted(float(next(t.iter(SVG + 'use')).get('y')) for t in a.iter(SVG + 'g')
                  if t.get('id', '').startswith('ytick_'))
    split = drawn(path).get('claims-0-split')
    return rows, split and split[1][0][1]


def font_px(path, width=830):
    """The smallest text of an SVG figure in pixels, the figure shown `width` pixels wide."""
    root = ET.parse(path).getroot()
    sizes = [float(s) for s in re.findall(r'font-size: ([\d.]+)px', ET.tostring(root, 'unicode'))]
    return min(sizes) * width / float(root.get('width').removesuffix('pt'))


def markers(path):
    """({(shape, style)} of the claims' markers drawn in the panels, and of the legend's)."""
    groups = {g.get('id'): g for g in ET.parse(path).getroot().iter(SVG + 'g')}

    def uses(gs):
        return {(u.get(XLINK), u.get('style')) for g in gs for u in g.iter(SVG + 'use')}
    return (uses(g for k, g in groups.items() if re.fullmatch(r'claims-[01]-\d+', k or '')),
            uses([groups['legend_1']]))


@PLOTTING
def test_the_claims_figures_keep_our_tests_apart_and_the_headline_readable(tmp_path):
    """Beside CLAIMED, Prompt + LH-Mix and the control (our test): the full figure has the
    paper's 13 lines that these runs test (Table 3's three, Fig. 7's ten), then below a line and
    its heading our one; the headline figure the three of Table 3 and ours, apart the same way,
    its smallest text 9 px or more at 830 px wide, as is the README's copy, of at most 14 lines;
    slopes named in the x axis' label where a line is one. RESULTS' full figure too: 9 px or more,
    and in both the legend has each marker that the panels draw."""
    args = {'none': {'mix': 'none'}, 'bert': {'arch': 'bert', 'mix': 'none'},
            'mixup': {'mix': 'mixup'}, 'bert-mixup': {'arch': 'bert', 'mix': 'mixup'},
            'lhmix': {'mix': 'lhmix'}, 'half': {'mix': 'lhmix', 'beta': 0.5}}
    both = dict(CLAIMED, lhmix=[(73.5, 49), (73.8, 48.2), (73.2, 48.9)],
                half=[(73.4, 48.4), (73.6, 48.0), (73.9, 48.8)])
    folders = [fake_run(tmp_path / f'{name}-s{s}', micro, macro, history=[(40, 50, None)],
                        seed=s, **args[name])
               for name, runs_ in both.items() for s, (micro, macro) in enumerate(runs_)]
    plot.main([*folders, '--figures', 'claims', 'claims_headline', '--out', str(tmp_path)])
    ours = ['LH-Mix above the λ = 0.5 control at 100%', 'Prompt + LH-Mix − the control']
    table3 = ['Table 3: Prompt above BERT', 'Prompt − BERT', 'Table 3: + Mixup above its base',
              'Prompt + Mixup − Prompt', 'Table 3: + Mixup above its base', 'BERT + Mixup − BERT']
    for name, paper in (('claims', 13), ('claims_headline', 3)):
        path = tmp_path / f'{name}.svg'
        labels, (rows, split) = ticks(path)['axes_1']['y'], rows_and_split(path)
        assert labels[:6] == table3 and labels[-2:] == ours and len(rows) == paper + 1
        assert split is not None and rows[paper - 1] < split < rows[paper]
        assert texts(path)['claims-ours'] == ["our own tests, not the paper's claims, below"]
        xlabels = [x for xs in texts(path).values() for x in xs if x.startswith('difference')]
        assert xlabels == ['difference, points' + ' (slopes: points per unit)' * (
            name == 'claims')] * 2  # Fig. 7's slopes in the full figure only
    assert font_px(tmp_path / 'claims_headline.svg') >= 9
    shown = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'results',
                         'figures')
    assert len(rows_and_split(os.path.join(shown, 'claims_headline.svg'))[0]) <= 14
    for name in ('claims', 'claims_headline'):
        drawn, legend = markers(os.path.join(shown, f'{name}.svg'))
        assert font_px(os.path.join(shown, f'{name}.svg')) >= 9 and drawn and drawn <= legend


@PLOTTING
def test_a_marginal_verdict_is_drawn_hollow(tmp_path):
    """Prompt − BERT alone: micro-F1's Welch p (scipy) under 0.05, a family of one, but not when
    doubled in one Holm family with macro-F1's (by hand): its marker hollow, edged in its
    verdict's colour; macro-F1's inconclusive, filled."""
    from matplotlib.colors import to_hex
    from scipy import stats
    prompt, bert = [(70, 40), (71, 45), (72, 41)], [(67.7, 42), (68.9, 40), (69.3, 44)]
    folders = [fake_run(tmp_path / f'{name}-s{s}', micro, macro, history=[(40, 50, None)],
                        seed=s, **args)
               for name, runs_, args in (('prompt', prompt, {'mix': 'none'}),
                                         ('bert', bert, {'arch': 'bert', 'mix': 'none'}))
               for s, (micro, macro) in enumerate(runs_)]
    plot.main([*folders, '--figures', 'claims', '--out', str(tmp_path)])
    p = stats.ttest_ind(np.array(prompt), np.array(bert), equal_var=False).pvalue
    assert p[0] < 0.05 and max(2 * p[0], p[1]) >= 0.05 and p[1] >= 0.05  # marginal, inconclusive
    g = next(g for g in ET.parse(tmp_path / 'claims.svg').getroot().iter(SVG + 'g')
             if g.get('id') == 'claims-0-0')
    style = next(g.iter(SVG + 'use')).get('style')
    assert 'fill: #ffffff' in style and f'stroke: {to_hex(plot.VERDICTS["supported"][1])}' in style
    drawn, legend = markers(tmp_path / 'claims.svg')
    assert len(drawn) == 2 and drawn <= legend  # the hollow one and macro-F1's, in the legend
    legend_texts = [''.join(t.itertext()) for g in ET.parse(tmp_path / 'claims.svg').getroot()
                    .iter(SVG + 'g') if g.get('id') == 'legend_1' for t in g.iter(SVG + 'text')]
    assert legend_texts == ['supported (marginal)', 'inconclusive', "the claim's side of 0"]
    assert marker_colour(tmp_path / 'claims.svg', 'claims-1-0') == to_hex(
        plot.VERDICTS['inconclusive'][1])
