"""Figures of finished train.py runs, grouped by setting as tools/summary.py groups them, each
into --out as NAME.svg (or .png):

  curves                dev macro- and micro-F1 per epoch, mean over seeds +- sd
  lambda                the mixing ratios per epoch, and where they lie on Eq. 4's curve (Fig. 3)
  fig4_train_fraction   test F1 against --train-fraction (Fig. 4)
  fig5_alpha_beta       test macro-F1 over the --alpha grid and the --beta grid (Fig. 5)
  fig7_depth_frequency  test macro-F1 per depth and per label-frequency quartile (Fig. 7)

A figure whose runs are not given is skipped, in a line saying what it needs. Needs matplotlib
(pip install matplotlib); the reference does not.

    python tools/plot.py out/demo-prompt-lhmix-s? out/demo-prompt-mixup-s?
    python tools/plot.py runs/*-s? --out figures --format png
"""
import argparse
import io
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import data  # noqa: E402
import runs  # noqa: E402
from summary import finished_run, setting_name, settings  # noqa: E402

START = {'svg': b'<?xml', 'png': b'\x89PNG'}  # how matplotlib's files of each format begin


def read_history(folder):
    """A run's metrics.jsonl, per epoch: the dev macro- and micro-F1 in %, the lambda quantiles
    {percent: lambda} (None in an epoch without Mixup)."""
    path = os.path.join(folder, runs.METRICS)
    with finished_run(path):
        with open(path, encoding='utf-8') as f:
            lines = [json.loads(line) for line in f]
        return {'macro': [100 * h['dev_macro_f1'] for h in lines],
                'micro': [100 * h['dev_micro_f1'] for h in lines],
                'lambda': [h['lambda']['quantiles'] if h['mix'] else None for h in lines]}


def mean_sd(x):
    """Mean and sd (ddof 1) over axis 0 of the values that are not NaN: NaN where there are none,
    the sd NaN where there is one."""
    x = np.asarray(x, dtype=float)
    n = (~np.isnan(x)).sum(0)
    with np.errstate(invalid='ignore'):  # 0 / 0
        mean = np.nansum(x, 0) / n
        return mean, np.sqrt(np.nansum((x - mean) ** 2, 0) / (n - 1))


def ragged(rows, shape=()):
    """Runs' rows of different lengths (early stopping) as one array, NaN past each run's end."""
    out = np.full((len(rows), max(map(len, rows)), *shape), np.nan)
    for o, row in zip(out, rows):
        o[:len(row)] = row
    return out


def legend(fig, ax, *extra):
    """One legend for the whole figure, below it: the labelled artists of `ax`, then `extra`."""
    fig.legend(handles=ax.get_legend_handles_labels()[0] + list(extra), ncols=2,
               loc='outside lower center')


def curves(fig, groups, history):
    """Dev F1 per epoch: each setting's mean over the runs that reached the epoch, +- sd; each
    run's best dev epoch; the first epoch with Mixup."""
    from matplotlib.lines import Line2D
    for ax, f1 in zip(fig.subplots(1, 2), ('macro', 'micro')):
        for i, s in enumerate(groups):
            runs_f1 = [history[r][f1] for r in s.folders]
            mean, sd = mean_sd(ragged(runs_f1))
            epochs = np.arange(len(mean))
            ax.plot(epochs, mean, '.-', color=f'C{i}', label=s.name, gid=f'{f1}-mean-{i}')
            ax.fill_between(epochs, mean - sd, mean + sd, color=f'C{i}', alpha=0.2,
                            gid=f'{f1}-sd-{i}')  # none where one run reached the epoch
            best = [t['best_epoch'] for t in s.tests]
            ax.plot(best, [run[b] for run, b in zip(runs_f1, best)], '*', ms=10, color=f'C{i}',
                    gid=f'{f1}-best-{i}')
            mixed = [e for r in s.folders for e, q in enumerate(history[r]['lambda']) if q]
            if mixed:
                ax.axvline(min(mixed), ls=':', color=f'C{i}', gid=f'{f1}-mixup-{i}')
        ax.set(xlabel='epoch', ylabel=f'dev {f1}-F1 (%)', title=f'dev {f1}-F1')
        ax.xaxis.get_major_locator().set_params(integer=True)
    legend(fig, ax, Line2D([], [], ls='none', marker='*', ms=10, color='k',
                           label='best dev epoch, each run'),
           Line2D([], [], ls=':', color='k', label='Mixup starts (after the warm-up)'))
    fig.suptitle('Dev F1 per epoch: the mean over the seeds that reached it (line) ± sd (band)')


def ratios(fig, groups, history):
    """Each mixing setting's lambda quantiles per epoch, averaged over its runs, as bands; beside,
    Eq. 4's curve for each LH-Mix setting's alpha and beta (Fig. 3) and the similarities s that
    its lambda quantiles (averaged over epochs and runs) imply."""
    mixing = [(i, s) for i, s in enumerate(groups)
              if any(q for r in s.folders for q in history[r]['lambda'])]
    if not mixing:
        return 'needs runs that mixed (--mix lhmix or mixup, past --warmup-epochs)'
    lhmix = [(i, s) for i, s in mixing if s.args['mix'] == 'lhmix']
    axes = fig.subplots(1, 1 + bool(lhmix), squeeze=False)[0]
    for i, s in mixing:
        percents = next(list(q) for r in s.folders for q in history[r]['lambda'] if q)
        lam = ragged([[[q[p] for p in percents] if q else [np.nan] * len(percents)
                       for q in history[r]['lambda']] for r in s.folders], (len(percents),))
        per_epoch, m = mean_sd(lam)[0], len(percents) // 2  # m: the median's index
        epochs = np.arange(len(per_epoch))
        for lo in range(m):  # the outermost band first, so the inner ones lie on it
            axes[0].fill_between(epochs, per_epoch[:, lo], per_epoch[:, -1 - lo], alpha=0.2,
                                 color=f'C{i}', lw=0, gid=f'lambda-{i}-{lo}')
        axes[0].plot(epochs, per_epoch[:, m], '.-', color=f'C{i}', label=s.name,
                     gid=f'lambda-median-{i}')
        if s.args['mix'] != 'lhmix':
            continue
        alpha, beta = s.args['alpha'], s.args['beta']
        sim = np.linspace(0, 1, 201)
        axes[1].plot(sim, beta - (beta - 0.5) * sim ** alpha, color=f'C{i}', gid=f'eq4-{i}',
                     label=f'α {alpha}, β {beta}' + ': λ = 0.5 for every s' * (beta == 0.5))
        if beta > 0.5:  # Eq. 4 solved for s; a ratio rounded past 0.5 or beta is s = 1 or 0
            q = mean_sd(lam.reshape(-1, len(percents)))[0]
            implied = ((beta - np.clip(q, 0.5, beta)) / (beta - 0.5)) ** (1 / alpha)
            axes[1].plot(implied, q, 'o', color=f'C{i}', gid=f'eq4-quantiles-{i}')
            for lo in range(m):
                axes[1].axvspan(implied[-1 - lo], implied[lo], alpha=0.15, color=f'C{i}', lw=0,
                                gid=f'eq4-{i}-{lo}')
    bands = ', '.join(f'{percents[lo]}–{percents[-1 - lo]}%' for lo in range(m))
    axes[0].set(xlabel='epoch', ylabel='mixing ratio λ (folded to [0.5, 1])',
                title=f'λ per epoch: the median, bands {bands}')
    axes[0].xaxis.get_major_locator().set_params(integer=True)
    if lhmix:
        axes[1].set(xlabel='similarity s (Eq. 3); dots and bands: the s of the λ quantiles',
                    ylabel='λ', xlim=(0, 1),
                    title=r'Eq. 4 (Fig. 3): $\lambda = \beta - (\beta - 0.5)\,s^\alpha$')
        axes[1].legend()
    legend(fig, axes[0])
    fig.suptitle('Mixing ratios λ of the pairs: quantiles averaged over seeds (right: also over '
                 'epochs)')


def series(groups, keys, x):
    """The settings that differ only in argument `x`, as lines {name: settings in order of x},
    each named by its values of `keys`."""
    lines = {}
    for s in groups:
        lines.setdefault(setting_name(s.args, keys), []).append(s)
    return {name: sorted(ss, key=lambda s: s.args[x]) for name, ss in lines.items()}


def errorbars(ax, lines, x, f1, gid):
    """Test F1 (%) of each line's settings: mean +- sd over their runs; ticks at the x given."""
    for i, (name, ss) in enumerate(lines.items()):
        mean, sd = np.transpose([mean_sd([100 * t[f1] for t in s.tests]) for s in ss])
        drawn = ax.errorbar([s.args[x] for s in ss], mean, sd, marker='o', capsize=3, label=name)
        drawn.lines[0].set_gid(f'{gid}-{i}')
    grid = sorted({s.args[x] for ss in lines.values() for s in ss})
    ax.set_xticks(grid, [f'{v:g}' for v in grid])
    ax.minorticks_off()


def fig4(fig, groups, varying):
    """Test F1 against --train-fraction, a line for each setting of the other arguments."""
    if len({s.args['train_fraction'] for s in groups}) < 2:
        return 'needs runs at two or more --train-fraction'
    lines = series(groups, [k for k in varying if k != 'train_fraction'], 'train_fraction')
    for ax, f1 in zip(fig.subplots(1, 2), ('micro', 'macro')):
        errorbars(ax, lines, 'train_fraction', f'{f1}_f1', f'fig4-{f1}')
        ax.set(xlabel='--train-fraction (of the training documents)', ylabel=f'test {f1}-F1 (%)',
               title=f'test {f1}-F1')
    legend(fig, ax)
    fig.suptitle('Fig. 4: test F1 against the training data used, mean ± sd over seeds')


def fig5(fig, groups, varying):
    """Test macro-F1 over the alpha grid at a fixed beta, and over the beta grid at a fixed alpha,
    of the LH-Mix settings."""
    grids = {}
    for x, fixed in (('alpha', 'beta'), ('beta', 'alpha')):
        keys = [fixed] + [k for k in varying if k not in ('alpha', 'beta')]
        lines = series([s for s in groups if s.args['mix'] == 'lhmix'], keys, x)
        if any(len(ss) > 1 for ss in lines.values()):
            grids[x, fixed] = {name: ss for name, ss in lines.items() if len(ss) > 1}
    if not grids:
        return 'needs LH-Mix runs at two or more --alpha (one --beta) or --beta (one --alpha)'
    for ax, ((x, fixed), lines) in zip(fig.subplots(1, len(grids), squeeze=False)[0],
                                       grids.items()):
        ax.set_xscale('log' if x == 'alpha' else 'linear')  # the paper's alpha grid: 0.1 to 10
        errorbars(ax, lines, x, 'macro_f1', f'fig5-{x}')
        ax.set(xlabel=f'--{x} (Eq. 4)', ylabel='test macro-F1 (%)',
               title=f'over {x}, {fixed} fixed')
        ax.legend()
    fig.suptitle("Fig. 5: test macro-F1 over Eq. 4's parameters, mean ± sd over seeds")


def fig7(fig, groups):
    """Test macro-F1 per depth and per label-frequency quartile, a bar for each setting."""
    width = 0.8 / len(groups)
    for ax, part in zip(fig.subplots(1, 2), ('depth', 'quartile')):
        for i, s in enumerate(groups):
            mean, sd = mean_sd([[100 * f['macro_f1'] for f in (
                t['per_depth'].values() if part == 'depth' else t['by_frequency'])]
                for t in s.tests])
            at = np.arange(1, len(mean) + 1)
            bars = ax.bar(at + (i - (len(groups) - 1) / 2) * width, mean, width, yerr=sd,
                          capsize=2, color=f'C{i}', label=s.name)
            for k, bar in zip(at, bars):
                bar.set_gid(f'fig7-{part}-{i}-{k}')
        ax.set_xticks(at, at)
        ax.set(ylabel='test macro-F1 (%)', xlabel='depth in the hierarchy' if part == 'depth'
               else 'label-frequency quartile (by training documents; 1: the rarest)')
    legend(fig, ax)
    fig.suptitle('Fig. 7: test macro-F1 per depth and per label frequency, mean ± sd over seeds')


def plot(args):
    """Each figure whose runs are given, drawn into --out once every run has been read."""
    try:  # the tools' own dependency: the reference does not import it
        import matplotlib
        from matplotlib.figure import Figure  # not pyplot: off-screen (PNGs by Agg), no window
    except ImportError:
        raise ValueError('tools/plot.py needs matplotlib: pip install matplotlib') from None
    groups, varying = settings(args.runs)
    history = {r: read_history(r) for s in groups for r in s.folders}
    figures = {'curves': lambda fig: curves(fig, groups, history),
               'lambda': lambda fig: ratios(fig, groups, history),
               'fig4_train_fraction': lambda fig: fig4(fig, groups, varying),
               'fig5_alpha_beta': lambda fig: fig5(fig, groups, varying),
               'fig7_depth_frequency': lambda fig: fig7(fig, groups)}
    why = runs.unwritable(os.path.abspath(args.out))
    if why:
        raise ValueError(f'--out {args.out}: {why}')
    paths = {name: os.path.join(args.out, f'{name}.{args.format}') for name in figures}
    for path in paths.values():  # replace only the figures of an earlier call
        if os.path.lexists(path):
            with open(path, 'rb') as f:
                if f.read(len(START[args.format])) != START[args.format]:
                    raise ValueError(f'--out {path}: exists and is not an earlier figure '
                                     '(remove it or choose another --out)')
    # labels as SVG text (not glyph outlines): small files; the same runs give the same bytes
    with matplotlib.rc_context({'svg.fonttype': 'none', 'svg.hashsalt': 'lhmix'}):
        for name, draw in figures.items():
            fig = Figure(figsize=(12, 4.5), layout='constrained')
            why = draw(fig)
            if why:
                print(f'{name}: skipped, {why}')
                continue
            out = io.BytesIO()
            fig.savefig(out, format=args.format, metadata={'Date': None})
            data.write_whole(paths[name], out.getvalue())
            print(f'{name}: {paths[name]}')


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('runs', nargs='+', help='train.py run folders')
    p.add_argument('--out', default=os.path.join('out', 'plots'),
                   help='the folder of the figures (default: %(default)s)')
    p.add_argument('--format', default='svg', choices=list(START),
                   help='svg (text, small) or png (default: %(default)s)')
    runs.exit_on_error(plot, p.parse_args(argv))


if __name__ == '__main__':
    main()
