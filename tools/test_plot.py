"""Tests of tools/plot.py on tiny demo runs, reading its SVGs as text: each setting's label, the
series and points of each figure, and where the points lie, checked against the runs' own files
averaged here (statistics.mean and stdev) and against Eq. 4; the skipped figures, PNGs, and the
one-line errors."""
import importlib.util
import json
import os
import re
import shutil
import statistics
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(TOOLS))
import plot  # noqa: E402
import runs  # noqa: E402
import train  # noqa: E402
from test_train import FAST, error_of, read_metrics, tree_state  # noqa: E402

SVG, XLINK = '{http://www.w3.org/2000/svg}', '{http://www.w3.org/1999/xlink}href'
# folder: flags. Three seeds of the first setting, one of the others; seed 2 at the grids' ends,
# as at one seed the demo's settings score alike (their best dev epoch is 0, before Mixup)
RUNS = {'lhmix-s0': [], 'lhmix-s1': ['--seed', '1'], 'lhmix-s2': None,  # s1 less its last epoch
        'mixup': ['--mix', 'mixup'], 'fraction': ['--train-fraction', '0.02'],
        'alpha2': ['--alpha', '2'], 'alpha0.5': ['--alpha', '0.5', '--seed', '2'],
        'beta0.5': ['--beta', '0.5'], 'beta1': ['--beta', '1', '--seed', '2']}
SETTINGS = [['lhmix-s0', 'lhmix-s1', 'lhmix-s2'], ['mixup'], ['fraction'],
            ['alpha2'], ['alpha0.5'], ['beta0.5'], ['beta1']]  # as plot.py groups RUNS, in order
NAMES = [f'alpha={a} beta={b} mix={m} train_fraction={f}' for a, b, m, f in [
    (1.0, 0.75, 'lhmix', 0.01), (1.0, 0.75, 'mixup', 0.01), (1.0, 0.75, 'lhmix', 0.02),
    (2.0, 0.75, 'lhmix', 0.01), (0.5, 0.75, 'lhmix', 0.01), (1.0, 0.5, 'lhmix', 0.01),
    (1.0, 1.0, 'lhmix', 0.01)]]
# alpha2's lambda quantiles in epochs 1 and 2, spread out (the demo's all lie near 0.5); the
# largest, a rounding above beta 0.75, is s = 0
LAMBDAS = [[0.5, 0.51, 0.53, 0.56, 0.6, 0.68, 0.7500001],
           [0.5, 0.52, 0.55, 0.58, 0.62, 0.7, 0.7500001]]


MATPLOTLIB = pytest.mark.skipif(importlib.util.find_spec('matplotlib') is None,
                                reason='matplotlib is not installed (pip install matplotlib)')


@pytest.fixture(scope='module')
def demo(tmp_path_factory):
    """RUNS: 3 epochs, Mixup from epoch 1. lhmix-s2 is lhmix-s1 less its last epoch; alpha2's
    ratios are LAMBDAS."""
    root = tmp_path_factory.mktemp('plot')
    for name, flags in RUNS.items():
        if flags is not None:
            train.main(FAST + ['--epochs', '3', '--warmup-epochs', '1', '--out', str(root / name),
                               *flags])
    (root / 'lhmix-s2').mkdir()
    lines = read_metrics(root / 'lhmix-s1')[:2]
    test = json.loads((root / 'lhmix-s1' / runs.TEST_METRICS).read_text())
    test['args']['seed'] = 2
    test['best_epoch'] = int(np.argmax([h['dev_macro_f1'] for h in lines]))
    (root / 'lhmix-s2' / runs.TEST_METRICS).write_text(json.dumps(test))
    write_metrics(root / 'lhmix-s2', lines)
    lines = read_metrics(root / 'alpha2')
    for line, lam in zip(lines[1:], LAMBDAS):
        line['lambda']['quantiles'] = dict(zip(line['lambda']['quantiles'], lam))
    write_metrics(root / 'alpha2', lines)
    return root


def write_metrics(folder, lines):
    (folder / runs.METRICS).write_text(''.join(json.dumps(h) + '\n' for h in lines))


def drawn(path):
    """{gid: (its markers' positions, its paths' vertices)} of the artists plot.py names. A band
    (a collection) is a path defined once and placed, as a marker is, by a <use>."""
    def vertices(p):
        return [(float(x), float(y)) for x, y in re.findall(r'[ML] (\S+) (\S+)', p.get('d'))]
    root = ET.parse(path).getroot()
    defined = {p.get('id'): vertices(p) for p in root.iter(SVG + 'path') if p.get('id')}
    out = {}
    for g in root.iter(SVG + 'g'):
        if re.match(r'(macro|micro|lambda|eq4|fig[457])-', g.get('id', '')):
            uses = [(float(u.get('x')), float(u.get('y')), u.get(XLINK)[1:])
                    for u in g.iter(SVG + 'use')]
            out[g.get('id')] = ([(x, y) for x, y, _ in uses], [
                *(v for p in g.iter(SVG + 'path') if not p.get('id') for v in vertices(p)),
                *((x + dx, y + dy) for dx, dy, d in uses for x, y in defined[d])])
    return out


def figure(folder, name):
    """An SVG figure's text, and drawn() of it."""
    return (folder / f'{name}.svg').read_text(), drawn(folder / f'{name}.svg')


def same_scale(values, coordinates):
    """Whether the drawn coordinates are one affine map of the values (the axis' scale)."""
    a, b = np.polyfit(values, coordinates, 1)
    return a != 0 and np.abs(a * np.array(values) + b - coordinates).max() < 1e-3


def same_set(a, b):
    """Whether each coordinate in `a` is one in `b` and back, to a thousandth of a point."""
    return all((np.abs(np.subtract.outer(a, b)).min(axis) < 1e-3).all() for axis in (0, 1))


def mean(xs):
    return statistics.mean(xs), statistics.stdev(xs) if len(xs) > 1 else None


@pytest.fixture(scope='module')
def figures(demo, tmp_path_factory):
    out = tmp_path_factory.mktemp('figures')
    plot.main([str(demo / r) for s in SETTINGS for r in s] + ['--out', str(out)])
    for name in ('curves', 'lambda', 'fig4_train_fraction', 'fig5_alpha_beta',
                 'fig7_depth_frequency'):
        assert os.path.getsize(out / f'{name}.svg') < 200_000
    return out


@MATPLOTLIB
def test_training_curves_mean_over_seeds_with_sd_best_epochs_and_mixup_start(demo, figures):
    svg, ds = figure(figures, 'curves')
    assert all(f'>{name}<' in svg for name in NAMES)
    for f1 in ('macro', 'micro'):
        points = []  # (epoch, dev F1 or None, where it is drawn)
        for i, folders in enumerate(SETTINGS):
            dev = [[100 * h[f'dev_{f1}_f1'] for h in read_metrics(demo / r)] for r in folders]
            marks, band = ds[f'{f1}-mean-{i}'][0], ds.get(f'{f1}-sd-{i}', (0, []))[1]
            assert len(marks) == 3 and bool(band) == (len(folders) > 1)
            for e, (x, y) in enumerate(marks):  # epoch 2: the mean of the runs that reached it
                m, sd = mean([run[e] for run in dev if e < len(run)])
                points.append((e, m, (x, y)))
                if sd:  # the band's edges there: mean + sd above, mean - sd below
                    top, bottom = sorted({b for a, b in band if abs(a - x) < 1e-3})
                    points += [(e, m + sd, (x, top)), (e, m - sd, (x, bottom))]
            best = [json.loads((demo / r / runs.TEST_METRICS).read_text())['best_epoch']
                    for r in folders]
            stars = ds[f'{f1}-best-{i}'][0]
            assert len(stars) == len(folders)
            points += [(b, run[b], xy) for run, b, xy in zip(dev, best, stars)]
            points += [(1, None, xy) for xy in ds[f'{f1}-mixup-{i}'][1]]  # Mixup from epoch 1
        epochs, values, xy = zip(*points)
        x, y = np.array(xy).T
        assert same_scale(epochs, x)
        has = [v is not None for v in values]
        assert same_scale([v for v in values if v is not None], y[has])


@MATPLOTLIB
def test_mixing_ratios_per_epoch_and_on_eq_4s_curve(demo, figures):
    svg, ds = figure(figures, 'lambda')
    assert all(f'>{name}<' in svg for name in NAMES)
    assert 'α 1.0, β 0.5: λ = 0.5 for every s' in svg
    values, ys = [], []
    for i, folders in enumerate(SETTINGS):
        q = [[list(h['lambda']['quantiles'].values()) for h in read_metrics(demo / r)[1:]]
             for r in folders]
        medians = ds[f'lambda-median-{i}'][0]
        assert len(medians) == 2 and len([k for k in ds if k.startswith(f'lambda-{i}-')]) == 3
        values += [statistics.mean(run[e][3] for run in q if e < len(run)) for e in (0, 1)]
        ys += [y for _, y in medians]
        lhmix = i != 1
        assert (f'eq4-{i}' in ds) == lhmix
        assert (f'eq4-quantiles-{i}' in ds) == (lhmix and i != 5)  # 5: beta 0.5, no s to infer
    assert same_scale(values, ys)
    for lo, hi in [(0, 6), (1, 5), (2, 4)]:  # alpha2's bands per epoch
        edges = [y for _, y in ds[f'lambda-3-{lo}'][1]]
        assert same_set(edges, np.polyval(np.polyfit(values, ys, 1), [
            LAMBDAS[0][lo], LAMBDAS[1][lo], LAMBDAS[0][hi], LAMBDAS[1][hi]]))
    # Eq. 4's curve for alpha 2, beta 0.75 runs from (s 0, lambda beta) to (s 1, lambda 0.5):
    # its ends give the axes' scales; the dots and bands are read back through them
    curve = ds['eq4-3'][1]
    (x0, y0), (x1, y1) = curve[0], curve[-1]
    s_of = (lambda x: (x - x0) / (x1 - x0))
    lam = np.mean(LAMBDAS, 0)
    dots = [(s_of(x), 0.75 + (y - y0) / (y1 - y0) * (0.5 - 0.75)) for x, y in
            ds['eq4-quantiles-3'][0]]
    assert [d[1] for d in dots] == pytest.approx(lam, abs=1e-5)
    assert [d[1] for d in dots] == pytest.approx([0.75 - 0.25 * s ** 2 for s, _ in dots],
                                                 abs=1e-5)  # on Eq. 4
    s = np.sqrt(np.maximum(0.75 - lam, 0) / 0.25)  # Eq. 4 solved for s at alpha 2 (s >= 0)
    for lo, hi in [(0, 6), (1, 5), (2, 4)]:
        xs = [s_of(x) for x, _ in ds[f'eq4-3-{lo}'][1]]
        assert (min(xs), max(xs)) == pytest.approx((s[hi], s[lo]), abs=1e-5)


@MATPLOTLIB
def test_fig_4_test_f1_against_train_fraction(demo, figures):
    svg, ds = figure(figures, 'fig4_train_fraction')
    lines = [[0, 2], [1], [3], [4], [5], [6]]  # settings that differ only in --train-fraction
    assert all(f'>{NAMES[i].rsplit(" ", 1)[0]}<' in svg for i, *_ in lines)
    for f1 in ('micro', 'macro'):
        values, ys = [], []
        for j, line in enumerate(lines):
            points = ds[f'fig4-{f1}-{j}'][0]
            assert len(points) == len(line)
            values += [mean([json.loads((demo / r / runs.TEST_METRICS).read_text())[f'{f1}_f1']
                             * 100 for r in SETTINGS[i]])[0] for i in line]
            ys += [y for _, y in points]
        assert same_scale(values, ys)
        assert ds[f'fig4-{f1}-0'][0][0][0] < ds[f'fig4-{f1}-0'][0][1][0]  # 0.01 left of 0.02


@MATPLOTLIB
def test_fig_5_macro_f1_over_the_alpha_and_beta_grids(demo, figures):
    svg, ds = figure(figures, 'fig5_alpha_beta')
    assert '>beta=0.75 mix=lhmix train_fraction=0.01<' in svg
    assert '>alpha=1.0 mix=lhmix train_fraction=0.01<' in svg
    assert sorted(k for k in ds) == ['fig5-alpha-0', 'fig5-beta-0']  # one line a grid
    for grid, x, line in [('alpha', np.log([0.5, 1, 2]), [4, 0, 3]),  # alpha on a log scale
                          ('beta', [0.5, 0.75, 1], [5, 0, 6])]:
        points = np.array(ds[f'fig5-{grid}-0'][0])
        assert len(points) == 3 and same_scale(x, points[:, 0])
        assert same_scale([mean([100 * json.loads((demo / r / runs.TEST_METRICS).read_text())[
            'macro_f1'] for r in SETTINGS[i]])[0] for i in line], points[:, 1])


@MATPLOTLIB
def test_fig_7_a_bar_per_setting_per_depth_and_quartile(demo, figures):
    svg, ds = figure(figures, 'fig7_depth_frequency')
    assert all(f'>{name}<' in svg for name in NAMES)
    for part, key, n in [('depth', 'per_depth', 3), ('quartile', 'by_frequency', 4)]:
        bars = {(i, k): ds.pop(f'fig7-{part}-{i}-{k}')[1]
                for i in range(7) for k in range(1, n + 1)}
        base = statistics.mode(y for v in bars.values() for _, y in v)  # the bars' foot: 0
        values, ys = [0], [base]
        for (i, k), v in bars.items():
            tests = [json.loads((demo / r / runs.TEST_METRICS).read_text()) for r in SETTINGS[i]]
            f = [t[key][str(k)] if key == 'per_depth' else t[key][k - 1] for t in tests]
            values.append(statistics.mean(100 * x['macro_f1'] for x in f))
            ys.append(min((y for _, y in v), key=lambda y: -abs(y - base)))  # the bar's top
        assert same_scale(values, ys)
        centres = [np.mean([x for x, _ in bars[i, k]]) for k in range(1, n + 1) for i in range(7)]
        assert (np.diff(centres) > 0).all()  # by depth (quartile), then in the settings' order
    assert not [k for k in ds if k.startswith('fig7')]  # no other bar


@MATPLOTLIB
def test_a_figure_without_its_runs_is_skipped_in_one_line_and_png_on_request(demo, tmp_path,
                                                                             capsys):
    out = tmp_path / 'png'
    plot.main([str(demo / 'lhmix-s0'), str(demo / 'lhmix-s1'), '--out', str(out),
               '--format', 'png'])
    assert capsys.readouterr().out.splitlines() == [
        f'curves: {out}/curves.png', f'lambda: {out}/lambda.png',
        'fig4_train_fraction: skipped, needs runs at two or more --train-fraction',
        'fig5_alpha_beta: skipped, needs LH-Mix runs at two or more --alpha (one --beta) or '
        '--beta (one --alpha)', f'fig7_depth_frequency: {out}/fig7_depth_frequency.png']
    assert sorted(os.listdir(out)) == ['curves.png', 'fig7_depth_frequency.png', 'lambda.png']
    assert (out / 'curves.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    run = tmp_path / 'unmixed'  # a run whose Mixup never started
    shutil.copytree(demo / 'lhmix-s0', run, ignore=shutil.ignore_patterns('best', 'last'))
    write_metrics(run, [{**h, 'mix': False} for h in read_metrics(run)])
    plot.main([str(run), '--out', str(out), '--format', 'png'])  # replaces its figures
    assert capsys.readouterr().out.splitlines()[1] == (
        'lambda: skipped, needs runs that mixed (--mix lhmix or mixup, past --warmup-epochs)')


@MATPLOTLIB
def test_bad_input_named_in_one_line_before_anything_is_written(demo, tmp_path, monkeypatch):
    out, run = tmp_path / 'out', str(demo / 'lhmix-s0')
    assert error_of(lambda: plot.main([str(demo / 'lhmix-s0' / 'best'), '--out', str(out)])
                    ).startswith(f'error: {demo}/lhmix-s0/best/test_metrics.json: not a finished '
                                 'train.py run (FileNotFoundError(')
    (tmp_path / 'half').mkdir()
    shutil.copy(demo / 'lhmix-s0' / runs.TEST_METRICS, tmp_path / 'half')
    assert error_of(lambda: plot.main([run, str(tmp_path / 'half'), '--out', str(out)])
                    ).startswith(f'error: {tmp_path}/half/metrics.jsonl: not a finished train.py '
                                 'run (FileNotFoundError(')
    (tmp_path / 'file').write_text('')
    assert error_of(lambda: plot.main([run, '--out', str(tmp_path / 'file' / 'out')])) == (
        f'error: --out {tmp_path}/file/out: {tmp_path}/file is a file, not a folder')
    assert not out.exists()
    out.mkdir()
    (out / 'lambda.svg').write_text('my notes')
    before = tree_state(tmp_path)
    assert error_of(lambda: plot.main([run, '--out', str(out)])) == (
        f'error: --out {out}/lambda.svg: exists and is not an earlier figure (remove it or '
        'choose another --out)')
    assert tree_state(tmp_path) == before


def test_without_matplotlib_one_line_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, 'matplotlib', None)  # as if it were not installed
    assert error_of(lambda: plot.main([str(tmp_path), '--out', str(tmp_path / 'out')])) == (
        'error: tools/plot.py needs matplotlib: pip install matplotlib')
    assert os.listdir(tmp_path) == []
