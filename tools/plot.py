"""Figures of finished train.py runs, grouped and named by setting as tools/summary.py groups and
names them, each into --out as NAME.svg (or .png):

  curves                dev macro- and micro-F1 per epoch, mean over seeds +- sd
  lambda                the mixing ratios per epoch, a panel a setting, and where they lie on
                        Eq. 4's curve at each LH-Mix setting's alpha and beta
  table3_f1             test micro- and macro-F1 of each setting, a row each in the order given:
                        each seed's beside their mean with its 95% interval over seeds (Table 3)
  fig4_train_fraction   test F1 against the share of the training data, each mean with its 95%
                        interval over seeds (Fig. 4)
  fig5_alpha_beta       test macro-F1 of each seed and their mean over the alpha grid and the
                        beta grid, the other settings as reference lines (Fig. 5)
  fig7_depth_frequency  test macro-F1 per depth and per label-frequency quartile, each mean with
                        its 95% interval over seeds and its gain over the setting without Mixup
                        (Fig. 7)
  claims                every tested line of tools/claims.py's two tables (only when named: its
                        runs must be one study's): each difference with its 95% interval, a panel
                        a measure, the verdict by marker and colour (hollow: marginal), the
                        paper's side shaded, our own tests below a line
  claims_headline       the same, of the headline claims alone (HEADLINE), larger (only when
                        named)

A setting has its row's colour (ROWS) in every figure; several settings of one row, shades of it.
A figure whose runs are not given is skipped, in a line saying what it needs. Needs matplotlib and
scipy (pip install matplotlib scipy); the reference does not.

    python -m tools.plot out/demo-prompt-lhmix-s? out/demo-prompt-mixup-s?
    python -m tools.plot runs/*-s? --out figures --format png
    python -m tools.plot results/records/*/* --figures claims claims_headline --out results/figures
"""
import argparse
import io
import json
import os

import numpy as np

from tools import claims
from tools.summary import (GREEK, LEVEL, METRICS, control, epochs, exit_on_error, fig7_columns,
                           finished_run, mean_sd, row_name, setting_names, settings)

START = {'svg': b'<?xml', 'png': b'\x89PNG'}  # how matplotlib's files of each format begin
MIXING = ('mix', 'alpha', 'beta', 'mix_alpha')  # the arguments of the mixing alone
# One colour for each row of Table 3 and each control, as row_name names them, in every figure:
# the Prompt rows in matplotlib's first four colours, the BERT rows in others
ROWS = {'Prompt + LH-Mix': 'C1', 'Prompt + LH-Mix, λ = 0.5 (control)': 'C0', 'Prompt + Mixup': 'C2',
        'Prompt': 'C3', 'BERT + LH-Mix': 'C5', 'BERT + LH-Mix, λ = 0.5 (control)': 'C9',
        'BERT + Mixup': 'C8', 'BERT': 'C4'}


def read_history(folder):
    """A run's metrics.jsonl, per epoch: the dev macro- and micro-F1 in %, the lambda quantiles
    {percent: lambda} (None in an epoch without Mixup)."""
    lines = epochs(folder)
    with finished_run(os.path.join(folder, METRICS)):  # a record without a field, so named
        return {'macro': [100 * h['dev_macro_f1'] for h in lines],
                'micro': [100 * h['dev_micro_f1'] for h in lines],
                'lambda': [h['lambda']['quantiles'] if h['mix'] else None for h in lines]}


def ragged(rows, shape=()):
    """Runs' rows of different lengths (early stopping) as one array, NaN past each run's end."""
    out = np.full((len(rows), max(map(len, rows)), *shape), np.nan)
    for o, row in zip(out, rows):
        o[:len(row)] = row
    return out


def mixed_epochs(s, history):
    """The epochs in which a setting's runs mixed (with a lambda in metrics.jsonl), any run's."""
    return [e for r in s.folders for e, q in enumerate(history[r]['lambda']) if q]


def colours(all_args):
    """Each setting's colour, by its train.py arguments: its row's (ROWS); several settings of one
    row (a grid) in shades of it, dark to light in the order given, which show that order."""
    from matplotlib.colors import to_rgb
    rows, out = [row_name(a) for a in all_args], []
    for i, r in enumerate(rows):
        n, k = rows.count(r), rows[:i].count(r)
        t = 0.8 * k / (n - 1) - 0.45 if n > 1 else 0  # -1 black, 0 the row's colour, 1 white
        c = np.array(to_rgb(ROWS[r]))
        out.append(c * (1 + min(t, 0)) + (1 - c) * max(t, 0))
    return out


def interval(x):
    """Mean over axis 0 of the values that are not NaN, and the half-width of its 95% t interval,
    t_{0.975, n-1} sd / sqrt(n): NaN where there is one value (no spread to tell)."""
    from scipy.stats import t
    n = (~np.isnan(np.asarray(x, dtype=float))).sum(0)
    mean, sd = mean_sd(x)
    with np.errstate(divide='ignore', invalid='ignore'):
        return mean, t.ppf(1 - LEVEL / 2, n - 1) * sd / np.sqrt(n)


def legend(fig, *extra):
    """One legend for the whole figure, below it: each label of its axes once, then `extra`."""
    labelled = {}
    for ax in fig.get_axes():
        labelled.update(zip(*ax.get_legend_handles_labels()[::-1]))
    fig.legend(handles=[*labelled.values(), *extra], ncols=3, loc='outside lower center')


def curves(fig, groups, history):
    """Dev F1 per epoch: each setting's mean over the runs that reached the epoch, +- sd; each
    run's best dev epoch; the first epoch with Mixup (once for the settings that share it)."""
    from matplotlib.lines import Line2D
    colour = colours([s.args for s in groups])
    starts = sorted({min(e) for e in (mixed_epochs(s, history) for s in groups) if e})
    for ax, f1 in zip(fig.subplots(1, 2), ('macro', 'micro')):
        for i, s in enumerate(groups):
            runs_f1 = [history[r][f1] for r in s.folders]
            mean, sd = mean_sd(ragged(runs_f1))
            epochs = np.arange(len(mean))
            ax.plot(epochs, mean, '.-', color=colour[i], label=s.name, gid=f'{f1}-mean-{i}')
            ax.fill_between(epochs, mean - sd, mean + sd, color=colour[i], alpha=0.2,
                            gid=f'{f1}-sd-{i}')  # none where one run reached the epoch
            best = [t['best_epoch'] for t in s.tests]
            ax.plot(best, [run[b] for run, b in zip(runs_f1, best)], '*', ms=10,
                    color=colour[i], gid=f'{f1}-best-{i}')
        for e in starts:
            ax.axvline(e, ls=':', color='k', gid=f'{f1}-mixup-{e}')
        ax.set(xlabel='epoch', ylabel=f'dev {f1}-F1 (%)', title=f'dev {f1}-F1')
        ax.xaxis.get_major_locator().set_params(integer=True)
    legend(fig, Line2D([], [], ls='none', marker='*', ms=10, color='k',
                       label='best dev epoch, each run'),
           Line2D([], [], ls=':', color='k', label='Mixup starts (after the warm-up)'))
    fig.suptitle('Dev F1 per epoch: the mean over the seeds that reached it (line) ± sd (band)')


def ratios(fig, groups, history):
    """Each mixing setting's lambda quantiles per epoch, averaged over its runs, as bands in a
    panel of its own; beside, Eq. 4's curve at each alpha and beta of the LH-Mix settings (once
    for the settings that share them), and the similarities s that each setting's lambda
    quantiles (averaged over epochs and runs) imply on it."""
    mixing = [(i, s) for i, s in enumerate(groups) if mixed_epochs(s, history)]
    if not mixing:
        return 'needs runs that mixed (--mix lhmix or mixup, past --warmup-epochs)'
    colour = colours([s.args for s in groups])
    lhmix = [(i, s) for i, s in mixing if s.args['mix'] == 'lhmix']
    cols = min(len(mixing), 3)  # room for a title of 35 characters
    rows = -(-len(mixing) // cols)
    fig.set_size_inches(12, 2.5 + 1.7 * rows)
    left, right = fig.subfigures(1, 2, width_ratios=(2, 1)) if lhmix else (fig.subfigures(), None)
    axes = left.subplots(rows, cols, sharex=True, sharey=True, squeeze=False).ravel()
    for ax in axes[len(mixing):]:
        ax.set_axis_off()
    quantiles = {}  # each LH-Mix setting's, over its epochs and runs
    for ax, (i, s) in zip(axes, mixing):
        percents = next(list(q) for r in s.folders for q in history[r]['lambda'] if q)
        lam = ragged([[[q[p] for p in percents] if q else [np.nan] * len(percents)
                       for q in history[r]['lambda']] for r in s.folders], (len(percents),))
        per_epoch, m = mean_sd(lam)[0], len(percents) // 2  # m: the median's index
        epochs = np.arange(len(per_epoch))
        for lo in range(m):  # the outermost band first, so the inner ones lie on it
            ax.fill_between(epochs, per_epoch[:, lo], per_epoch[:, -1 - lo], alpha=0.2,
                            color=colour[i], lw=0, gid=f'lambda-{i}-{lo}')
        ax.plot(epochs, per_epoch[:, m], '.-', color=colour[i], label=s.name,
                gid=f'lambda-median-{i}')
        ax.set_title(s.name, fontsize='small', color=colour[i])
        quantiles[i] = mean_sd(lam.reshape(-1, len(percents)))[0]
    # lambda, folded, lies in [0.5, 1]; fixed, ratios all at about 0.5 read without an offset
    axes[0].set_ylim(0.48, 1.02)
    axes[0].xaxis.get_major_locator().set_params(integer=True)
    left.supxlabel('epoch')
    left.supylabel('mixing ratio λ (folded to [0.5, 1])')
    bands = ', '.join(f'{percents[lo]}–{percents[-1 - lo]}%' for lo in range(m))
    left.suptitle(f'λ per epoch: the median (line), bands {bands} of the pairs')
    if lhmix:
        ax, sim = right.subplots(), np.linspace(0, 1, 201)
        pairs = dict.fromkeys((s.args['alpha'], s.args['beta']) for _, s in lhmix)
        for alpha, beta in pairs:
            ax.plot(sim, beta - (beta - 0.5) * sim ** alpha, color='0.6', lw=1,
                    gid=f'eq4-{alpha:g}-{beta:g}')
        for i, s in lhmix:
            alpha, beta, q = s.args['alpha'], s.args['beta'], quantiles[i]
            if beta > 0.5:  # Eq. 4 solved for s; a ratio rounded past 0.5 or beta is s = 1 or 0
                implied = ((beta - np.clip(q, 0.5, beta)) / (beta - 0.5)) ** (1 / alpha)
                ax.plot(implied, q, 'o', ms=4, color=colour[i], gid=f'eq4-quantiles-{i}')
        grid = [ab for ab in pairs if ab[1] > 0.5]  # the control's names itself
        at = (f'α {grid[0][0]:g}, β {grid[0][1]:g}' if len(grid) == 1 else
              "each LH-Mix setting's α, β")
        ax.set(xlabel='similarity s (Eq. 3)', ylabel='λ', xlim=(0, 1), ylim=(0.48, 1.02),
               title=f'Eq. 4 at {at} (grey);\ndots: the s of the λ quantiles')
    legend(fig)
    fig.suptitle('Mixing ratios λ of the pairs: quantiles averaged over the seeds'
                 + ' (right: also over the epochs)' * bool(lhmix))


def series(groups, x):
    """The settings that differ only in argument `x`, as lines {name: settings in order of x},
    each named as setting_names names its settings without x."""
    lines = {}
    for s, name in zip(groups, setting_names([s.args for s in groups], without=(x,))):
        lines.setdefault(name, []).append(s)
    return {name: sorted(ss, key=lambda s: s.args[x]) for name, ss in lines.items()}


def means(ax, lines, x, f1, gid, colour, tick='{:g}', seeds=False, dodge=1):
    """Test F1 (%) of each line's settings: the mean over their runs with its 95% interval, or
    with `seeds`, beside it each run's (a dot); ticks at the x given. Each line is moved along
    a log x by a factor `dodge` from the last, so that intervals at one x stand apart."""
    for i, (name, ss) in enumerate(lines.items()):
        shift = dodge ** (i - (len(lines) - 1) / 2)
        at, f = [s.args[x] * shift for s in ss], [[100 * t[f1] for t in s.tests] for s in ss]
        mean, half = np.transpose([interval(v) for v in f])
        drawn = ax.errorbar(at, mean, None if seeds else half, marker='o', capsize=3,
                            color=colour[name], mfc='white' if seeds else None, label=name)
        drawn.lines[0].set_gid(f'{gid}-{i}')
        if seeds:  # above the line; a lone seed's dot lies in its mean's ring
            ax.plot([a for a, v in zip(at, f) for _ in v], sum(f, []), '.', color=colour[name],
                    zorder=3, gid=f'{gid}-seeds-{i}')
        else:
            drawn.lines[2][0].set_gid(f'{gid}-interval-{i}')
    grid = sorted({s.args[x] for ss in lines.values() for s in ss})
    ax.set_xticks(grid, [tick.format(v) for v in grid])
    ax.minorticks_off()


def table3(fig, groups):
    """Test micro- and macro-F1 of each setting given, a row each, top down in the order given
    (Table 3 lists its rows): the mean over its runs (a ring) with its 95% interval, and below it
    each run's (a dot)."""
    colour = colours([s.args for s in groups])
    for ax, f1 in zip(fig.subplots(1, 2, sharey=True), ('micro', 'macro')):
        for i, s in enumerate(groups):
            f = [100 * t[f'{f1}_f1'] for t in s.tests]
            mean, half = interval(f)
            drawn = ax.errorbar(mean, i, xerr=half, marker='o', mfc='white', capsize=3,
                                color=colour[i])
            drawn.lines[0].set_gid(f'table3-{f1}-{i}')
            drawn.lines[2][0].set_gid(f'table3-{f1}-interval-{i}')
            ax.plot(f, [i + 0.2] * len(f), '.', color=colour[i], gid=f'table3-{f1}-seeds-{i}')
        ax.set_yticks(range(len(groups)), [s.name for s in groups])
        ax.set(xlabel=f'test {f1}-F1 (%)', title=f'test {f1}-F1')
    ax.invert_yaxis()  # the axes share y: the first row on top in both
    fig.suptitle('Table 3: test F1 of each row: each seed (dot), their mean (ring), bars its 95% '
                 'interval over seeds')


def fig4(fig, groups):
    """Test F1 against the share of the training data, a line for each setting of the other
    arguments given at two or more shares (Table 3's runs give the full data's point)."""
    lines = {n: ss for n, ss in series(groups, 'train_fraction').items() if len(ss) > 1}
    if not lines:
        return 'needs a setting at two or more --train-fraction'
    colour = dict(zip(lines, colours([ss[0].args for ss in lines.values()])))
    for ax, f1 in zip(fig.subplots(1, 2), ('micro', 'macro')):
        ax.set_xscale('log')  # the paper's shares: 10%, 25%, 50% and all
        means(ax, lines, 'train_fraction', f'{f1}_f1', f'fig4-{f1}', colour, '{:.0%}',
              dodge=1.03)
        ax.set(xlabel='share of the training data', ylabel=f'test {f1}-F1 (%)',
               title=f'test {f1}-F1')
    legend(fig)
    fig.suptitle('Fig. 4: test F1 against the training data used: the mean over the seeds, '
                 'bars its 95% interval over seeds')


def fig5(fig, groups):
    """Test macro-F1 of the LH-Mix settings over the alpha grid at a fixed beta, and over the beta
    grid at a fixed alpha, each run's beside their mean (a grid point has one seed or a few);
    every other setting given (the lambda = 0.5 control, Prompt) as a horizontal line at its
    mean, its 95% interval as a band."""
    from matplotlib.lines import Line2D
    grids = {}
    for x in GREEK:
        lines = {n: ss for n, ss in series(groups, x).items() if len(ss) > 1
                 and ss[0].args['mix'] == 'lhmix' and not control(ss[0].args)}
        if lines:
            grids[x] = lines
    if not grids:
        return 'needs LH-Mix runs at two or more --alpha (one --beta) or --beta (one --alpha)'
    on_lines = {s.name for lines in grids.values() for ss in lines.values() for s in ss}
    references = [s for s in groups if s.name not in on_lines]
    for ax, (x, lines) in zip(fig.subplots(1, len(grids), squeeze=False)[0], grids.items()):
        # a panel's lines and the references: shades only where a panel has two of one row
        colour = dict(zip([*lines, *(s.name for s in references)], colours(
            [*(ss[0].args for ss in lines.values()), *(s.args for s in references)])))
        ax.set_xscale('log' if x == 'alpha' else 'linear')  # the paper's alpha grid: 0.1 to 10
        means(ax, lines, x, 'macro_f1', f'fig5-{x}', colour, seeds=True)
        for j, s in enumerate(references):
            mean, half = interval([100 * t['macro_f1'] for t in s.tests])
            ax.axhline(mean, ls='--', color=colour[s.name], label=s.name,
                       gid=f'fig5-{x}-reference-{j}')
            if len(s.tests) > 1:
                ax.axhspan(mean - half, mean + half, color=colour[s.name], alpha=0.15, lw=0,
                           gid=f'fig5-{x}-reference-interval-{j}')
        other = GREEK[next(k for k in GREEK if k != x)]
        ax.set(xlabel=f'{GREEK[x]} (Eq. 4)', ylabel='test macro-F1 (%)',
               title=f'over {GREEK[x]}, {other} fixed')
    legend(fig, Line2D([], [], ls='none', marker='.', color='k', label='each seed'))
    fig.suptitle("Fig. 5: test macro-F1 over Eq. 4's parameters: each seed (dot), their mean "
                 '(ring);\ndashed: the other settings given, shaded: their 95% interval over seeds')


def fig7(fig, groups):
    """Test macro-F1 per depth (of the deepest tree given) and per label-frequency quartile, a bar
    for each setting, the mean over its runs with its 95% interval, on an axis that starts near
    the lowest bar; above each bar the setting's gain over the setting without Mixup (Prompt,
    BERT) of its other arguments, as the paper's Fig. 7 writes + Mixup's and + LH-Mix's over
    Prompt's."""
    heads, depths, by = fig7_columns([t for s in groups for t in s.tests])
    ends = np.cumsum([0, *(len(s.tests) for s in groups)])
    stats = [interval(by[a:b]) for a, b in zip(ends, ends[1:])]
    rest = [json.dumps({k: v for k, v in s.args.items() if k not in MIXING}, sort_keys=True)
            for s in groups]
    # the first setting without Mixup given of each arch and other arguments
    unmixed = {r: i for i, r in reversed(list(enumerate(rest))) if groups[i].args['mix'] == 'none'}
    colour, width = colours([s.args for s in groups]), 0.8 / len(groups)
    for ax, part in zip(fig.subplots(1, 2, width_ratios=(depths, len(heads) - depths)),
                        ('depth', 'quartile')):
        cols = slice(0, depths) if part == 'depth' else slice(depths, None)
        at = np.arange(1, len(heads[cols]) + 1)
        tops = []
        for i, s in enumerate(groups):
            mean, half = stats[i][0][cols], stats[i][1][cols]  # half: NaN, no bar, for one run
            has = ~np.isnan(mean)  # none past the setting's own depth
            x = at + (i - (len(groups) - 1) / 2) * width
            bars = ax.bar(x[has], mean[has], width, yerr=half[has], capsize=2, color=colour[i],
                          label=s.name)
            bars.errorbar.lines[2][0].set_gid(f'fig7-{part}-interval-{i}')
            for k, bar in zip(at[has], bars):
                bar.set_gid(f'fig7-{part}-{i}-{k}')
            half = np.nan_to_num(half)
            tops += [*(mean - half)[has], *(mean + half)[has]]
            if unmixed.get(rest[i], i) != i:
                gain = mean - stats[unmixed[rest[i]]][0][cols]
                for k in at[has & ~np.isnan(gain)]:
                    ax.annotate(f'{gain[k - 1]:+.2f}', (x[k - 1], (mean + half)[k - 1]), (0, 2),
                                textcoords='offset points', rotation=90, ha='center',
                                va='bottom', fontsize=7, gid=f'fig7-{part}-gain-{i}-{k}')
        lo, hi = min(tops), max(tops)
        span = hi - lo or 1
        ax.set_ylim(lo - 0.1 * span, hi + 0.35 * span)  # room for the gains above the bars
        ax.set_xticks(at, [h.replace(': ', '\n').replace(' (', '\n(') for h in heads[cols]])
        ax.set(ylabel='test macro-F1 (%)', xlabel='depth in the hierarchy' if part == 'depth'
               else 'label-frequency quartile (by training documents; Q1: the rarest)')
    legend(fig)
    fig.suptitle('Fig. 7: test macro-F1 per depth and per label frequency: the mean over the '
                 'seeds, bars its 95% interval over seeds;\nabove a bar: its gain over the '
                 'setting without Mixup, in points')


# The claims figure's verdicts: (marker, colour), each told apart by both; a marginal one (it
# falls in one Holm family of both measures) hollow; and the markers' size
VERDICTS = {'supported': ('o', 'C2'), 'contradicted': ('X', 'C3'),
            'inconclusive (Holm)': ('D', 'C1'), 'inconclusive': ('s', '0.55')}
MS = 7
# The README's figure: the lines of these claims, at most 14
HEADLINE = ('Table 3: Prompt above BERT', 'Table 3: + Mixup above its base',
            'Table 3: + LH-Mix above + Mixup', 'Fig. 4: mixing above Prompt at 10%',
            'Fig. 4: + LH-Mix above + Mixup', 'Fig. 4: that gap larger at 10%',
            'Fig. 6: labels nearer their relatives after training',
            'LH-Mix above the λ = 0.5 control at 100%')


def forest(fig, groups, headline=False):
    """Every line of tools/claims.py's two tables that has a verdict (headline: of HEADLINE's
    claims), a row each, top down in the tables' order, ours after the paper's below a line and
    a heading; in panel a (micro-F1; Fig. 6: the 3 nearest) and b (macro-F1; Fig. 6: the 15
    nearest) its difference (a marker of its verdict, hollow where marginal) and 95% interval;
    0 as a line; the side that the claim predicts shaded; a measure that the line lacks, said in
    its place."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    r = claims.Runs(groups, claims.DEFAULTS['alpha'], claims.DEFAULTS['beta'])
    rows = [(table is claims.OURS, short, test) for table in (claims.PAPER, claims.OURS)
            for (short, *_), test, why in claims.lines(table, claims.measure(table, r))
            if test and not why and (not headline or short in HEADLINE)]
    if not rows:
        return "needs the runs of a claim's test (tools/claims.py)"
    ys = [y + ours for y, (ours, *_) in enumerate(rows)]  # a row's gap before ours
    size = 9 if headline else 10  # points: 9 px or more when shown 830 px wide
    fig.set_size_inches(9 if headline else 12, 1.6 + 0.42 * ys[-1])
    axes, drawn = fig.subplots(1, 2, sharey=True), set()  # drawn: the verdicts, for the legend
    for c, ax in enumerate(axes):
        spans = [x for *_, t in rows for i, m in enumerate(t.measures) if claims.COLUMN[m] == c
                 for x in (t.interval()[0][i], t.interval()[1][i])]
        lo, hi = min(0, *spans), max(0, *spans)
        lo, hi = lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo)
        for y, (*_, t) in zip(ys, rows):
            at = [i for i, m in enumerate(t.measures) if claims.COLUMN[m] == c]
            if not at:
                ax.text(0, y, f'({"macro" if c == 0 else "micro"}-F1 only)', ha='center',
                        va='center', fontsize=size, color='0.4', gid=f'claims-{c}-none-{y}')
                continue
            i, (low, high) = at[0], (x[at[0]] for x in t.interval())
            ax.barh(y, hi if t.sign > 0 else lo, 0.9, color='C2', alpha=0.12, lw=0,
                    gid=f'claims-{c}-side-{y}')
            ax.plot([low, high], [y, y], color='k', lw=1, gid=f'claims-{c}-interval-{y}')
            verdict = t.verdicts()[i]
            drawn.add(verdict)
            marker, colour = VERDICTS[verdict.removesuffix(' (marginal)')]
            ax.plot([t.value[i]], [y], marker, color=colour, ms=MS, gid=f'claims-{c}-{y}',
                    mfc='white' if verdict.endswith('(marginal)') else colour)
        if any(ours for ours, *_ in rows):  # ours apart
            split = ys[[ours for ours, *_ in rows].index(True)] - 1
            ax.axhline(split, color='k', lw=0.8, ls='--', gid=f'claims-{c}-split')
            if c == 0:
                ax.text(lo, split, "our own tests, not the paper's claims, below", va='center',
                        fontsize=size, backgroundcolor='white', gid='claims-ours')
        ax.axvline(0, color='k', lw=0.8, gid=f'claims-{c}-zero')
        ax.set_xlim(lo, hi)
        ax.set(xlabel='difference, points' + ' (slopes: points per unit)' * any(
                   'slope' in t.what for *_, t in rows),
               title=f'{"ab"[c]}: {claims.WORDS[claims.F1[c]]} (Fig. 6: {claims.K[c]} nearest)')
    labels = [f'{short}\n{t.what}'.replace(f', {claims.NEAREST}', '') for _, short, t in rows]
    axes[0].set_yticks(ys, labels, fontsize=size)
    axes[0].invert_yaxis()  # the axes share y: the first line on top in both
    fig.legend(handles=[*(Line2D([], [], ls='none', marker=m, color=c, ms=MS, label=v + marked,
                                 mfc='white' if marked else c)
                          for v, (m, c) in VERDICTS.items() for marked in ('', ' (marginal)')
                          if v + marked in drawn),
                        Patch(color='C2', alpha=0.12, label="the claim's side of 0")],
               ncols=4, loc='outside lower center', fontsize=size)
    fig.suptitle(f'The claims against {sum(len(s.folders) for s in groups)} runs of --data '
                 f"{r.data}: each difference with its 95% interval; verdict after Holm's "
                 'correction (marker, colour)' if not headline else 'Headline claims against '
                 f'{sum(len(s.folders) for s in groups)} runs of --data {r.data}: difference, '
                 "95% interval, verdict", fontsize=size + 2)


def plot(args):
    """Each figure whose runs are given, drawn into --out once every run has been read."""
    try:  # the tools' own dependencies: the reference imports neither
        import matplotlib
        import scipy.stats  # noqa: F401 (interval's)
        from matplotlib.figure import Figure  # not pyplot: off-screen (PNGs by Agg), no window
    except ImportError:
        raise ValueError('tools/plot.py needs matplotlib and scipy: pip install matplotlib scipy'
                         ) from None
    groups = settings(args.runs)
    history = {r: read_history(r) for s in groups for r in s.folders}
    figures = {'curves': lambda fig: curves(fig, groups, history),
               'lambda': lambda fig: ratios(fig, groups, history),
               'table3_f1': lambda fig: table3(fig, groups),
               'fig4_train_fraction': lambda fig: fig4(fig, groups),
               'fig5_alpha_beta': lambda fig: fig5(fig, groups),
               'fig7_depth_frequency': lambda fig: fig7(fig, groups),
               'claims': lambda fig: forest(fig, groups),
               'claims_headline': lambda fig: forest(fig, groups, headline=True)}
    unknown = set(args.figures or ()) - set(figures)
    if unknown:
        raise ValueError(f'--figures {" ".join(sorted(unknown))}: not one of {", ".join(figures)}')
    named = {'claims', 'claims_headline'}  # drawn only when named
    figures = {k: v for k, v in figures.items() if k in (args.figures or set(figures) - named)}
    os.makedirs(args.out, exist_ok=True)
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
            with open(paths[name] + '.tmp', 'wb') as f:  # whole or not at all
                f.write(out.getvalue())
            os.replace(paths[name] + '.tmp', paths[name])
            print(f'{name}: {paths[name]}')


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('runs', nargs='+', help='train.py run folders')
    p.add_argument('--out', default=os.path.join('out', 'plots'),
                   help='the folder of the figures (default: %(default)s)')
    p.add_argument('--figures', nargs='+', metavar='NAME',
                   help='draw only these figures, by the names above (default: all)')
    p.add_argument('--format', default='svg', choices=list(START),
                   help='svg (text, small) or png (default: %(default)s)')
    exit_on_error(plot, p.parse_args(argv))


if __name__ == '__main__':
    main()
