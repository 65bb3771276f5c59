"""Tests of the research tools: the bench runs, summaries of run folders written by hand (the
settings' names, Welch p-values and Fig. 7's columns worked by hand), prediction files scored, the
label case study's ranks (computed here)."""
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(TOOLS))
import data  # noqa: E402
import evaluate  # noqa: E402
import runs  # noqa: E402
import similar  # noqa: E402
import summary  # noqa: E402
import train  # noqa: E402
from test_train import FAST, error_of, read_metrics, tree_state  # noqa: E402


# train.py's arguments as a run records them, at the demo's defaults
ARGS = {k: v for k, v in vars(train.parse(['--data', 'demo'])[0]).items() if k not in train.CONTROL}
PERCENTS = ('0', '5', '25', '50', '75', '95', '100')  # metrics.jsonl's lambda quantiles


def fake_run(folder, micro, macro, depths=(60, 40), quartiles=(30, 40, 50, 60), history=(),
             best=0, **args):
    """A finished train.py run written by hand into `folder`: its test micro- and macro-F1 (%),
    macro-F1 (%) per depth (depth d: 10 d labels) and per label-frequency quartile (quartile q: 10
    labels of 10 q to 10 q + 9 training documents); its epochs in metrics.jsonl, each (dev
    macro-F1 %, dev micro-F1 %, the lambda quantiles or None without Mixup); its best epoch and
    arguments (ARGS but those given)."""
    os.makedirs(folder)
    lines = [{'epoch': e, 'mix': lam is not None, 'train_loss': 1.0, 'dev_micro_f1': mi / 100,
              'dev_macro_f1': ma / 100, 'seconds': 1.0, 'samples_per_s': 10.0,
              **({'lambda': {'mean': float(np.mean(lam)), 'quantiles': dict(zip(PERCENTS, lam))}}
                 if lam is not None else {})} for e, (ma, mi, lam) in enumerate(history)]
    test = {'micro_f1': micro / 100, 'macro_f1': macro / 100,
            'per_depth': {str(d): {'labels': 10 * d, 'micro_f1': 0.5, 'macro_f1': f / 100}
                          for d, f in enumerate(depths, 1)},
            'by_frequency': [{'quartile': q, 'labels': 10, 'train_docs_min': 10 * q,
                              'train_docs_max': 10 * q + 9, 'micro_f1': 0.5, 'macro_f1': f / 100}
                             for q, f in enumerate(quartiles, 1)],
            'best_epoch': best, 'checkpoint': os.path.join(folder, 'best'),
            'args': {**ARGS, **args}}
    with open(os.path.join(folder, runs.METRICS), 'w') as f:
        f.writelines(json.dumps(h) + '\n' for h in lines)
    with open(os.path.join(folder, runs.TEST_METRICS), 'w') as f:
        json.dump(test, f)
    return str(folder)


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp('tools') / 'run'
    train.main(FAST + ['--epochs', '2', '--out', str(out)])
    return out


def test_bench_runs_on_a_cpu_at_tiny_sizes_and_says_its_defaults():
    bench = [sys.executable, os.path.join(TOOLS, 'bench.py'), '--device', 'cpu']
    help = ' '.join(subprocess.run(bench + ['-h'], capture_output=True, text=True).stdout.split())
    for flag in ("--batch BATCH documents a step (default: 16, train.py's)",
                 '--steps STEPS batches per timed pass (default: 30 on a GPU, 3 on a CPU)',
                 '--rounds ROUNDS timed passes, the median reported (default: 9 on a GPU, 2 on a '
                 'CPU)'):
        assert flag in help, help
    p = subprocess.run(bench + ['--steps', '2', '--rounds', '1'], capture_output=True, text=True,
                       timeout=300)  # the default, tiny sizes on a CPU
    lines = p.stdout.splitlines()
    assert p.returncode == 0 and lines[0].startswith('CPU, torch'), p.stderr[-2000:]
    rows = [line.rsplit(None, 3) for line in lines[3:7]]
    assert [r[0] for r in rows] == ['floor, eager', 'Prompt, eager', 'LH-Mix, eager',
                                    'LH-Mix, eager, random batches']
    assert float(rows[0][2]) == 1.0 and all(float(r[1]) > 0 for r in rows)
    assert lines[7].startswith('evaluation: ')


def test_settings_are_named_as_the_papers_rows():
    def names(*settings, without=()):
        return summary.setting_names([{**ARGS, **a} for a in settings], without)
    lh, half, mixup = {'mix': 'lhmix'}, {'mix': 'lhmix', 'beta': 0.5}, {'mix': 'mixup'}
    bert, none = {'arch': 'bert'}, {'mix': 'none'}
    assert names(none, mixup, lh, half, {**bert, **none}, {**bert, **mixup},
                 {**bert, **lh}) == [  # Table 3 and the control
        'Prompt', 'Prompt + Mixup', 'Prompt + LH-Mix', 'Prompt + LH-Mix, λ = 0.5 (control)',
        'BERT', 'BERT + Mixup', 'BERT + LH-Mix']
    grid = [{'alpha': 2.0, 'beta': 1.0}, {'alpha': 1.0, 'beta': 1.0}, {'alpha': 1.0, 'beta': 0.8}]
    assert names(*grid, {**half, 'alpha': 2.0}, mixup) == [  # Fig. 5: alpha, beta in the names
        'Prompt + LH-Mix (α 2, β 1)', 'Prompt + LH-Mix (α 1, β 1)',
        'Prompt + LH-Mix (α 1, β 0.8)', 'Prompt + LH-Mix, λ = 0.5 (control)', 'Prompt + Mixup']
    assert names(*grid, half, without=('alpha',)) == [  # a line over alpha at each beta
        'Prompt + LH-Mix (β 1)', 'Prompt + LH-Mix (β 1)', 'Prompt + LH-Mix (β 0.8)',
        'Prompt + LH-Mix, λ = 0.5 (control)']
    fractions = [{**none, 'train_fraction': 0.1}, {'train_fraction': 0.25}, {}]  # Fig. 4
    assert names(*fractions) == ['Prompt, 10% of the training data',
                                 'Prompt + LH-Mix, 25% of the training data',
                                 'Prompt + LH-Mix, 100% of the training data']
    assert names(*fractions, without=('train_fraction',)) == [
        'Prompt', 'Prompt + LH-Mix', 'Prompt + LH-Mix']
    assert names({'lr': 1e-4}, {'lr': 3e-5, 'no_mlm': True, 'train_fraction': 0.5}) == [
        'Prompt + LH-Mix, 100% of the training data, lr 0.0001',
        'Prompt + LH-Mix, 50% of the training data, lr 3e-05, no mlm']
    # alpha and beta do not act in Mixup, nor alpha in the control: named only to tell apart
    assert names({**mixup, 'alpha': 2.0}, mixup, {**half, 'alpha': 2.0}, half, lh) == [
        'Prompt + Mixup, α 2', 'Prompt + Mixup, α 1', 'Prompt + LH-Mix, λ = 0.5 (control), α 2',
        'Prompt + LH-Mix, λ = 0.5 (control), α 1', 'Prompt + LH-Mix']


def test_summary_tables_in_markdown_with_welch_p_values_and_fig_7s_columns(tmp_path, capsys,
                                                                         monkeypatch):
    stats = pytest.importorskip('scipy.stats')
    noise = [{}, {'data_dir': 'd'}]  # arguments that do not change the result
    a = [fake_run(tmp_path / f'a{i}', i + 1, (i + 1) / 2, (60 + i, 40 + 2 * i), seed=i,
                  **noise[i % 2]) for i in range(4)]
    b = [fake_run(tmp_path / f'b{i}', 2 * (i + 1), (i + 1) / 2, (62, 44 + i),
                  (31, 41 + i, 51, 61), seed=i, mix='mixup', **noise[i % 2]) for i in range(5)]
    c = fake_run(tmp_path / 'c', 30, 20, (64.25, 41.5, 20.25), mix='none')  # a deeper tree
    test = json.loads((tmp_path / 'c' / runs.TEST_METRICS).read_text())
    test['by_frequency'][3]['train_docs_max'] = 99  # Q4's range differs: not in its head
    (tmp_path / 'c' / runs.TEST_METRICS).write_text(json.dumps(test))
    rows = summary.summary(a + [a[0], str(tmp_path / '.' / 'a0'), c] + b)  # a0 counted once
    out = capsys.readouterr().out
    assert [(r['setting'], r['n']) for r in rows] == [('Prompt + LH-Mix', 4), ('Prompt', 1),
                                                      ('Prompt + Mixup', 5)]
    # Welch's t and df by hand. micro: means 2.5 and 6, s^2/n (5/3)/4 = 5/12 and 10/5 = 2;
    # macro: means 1.25 and 1.5, s^2/n (5/12)/4 = 5/48 and (5/8)/5 = 6/48
    p = [2 * stats.t.sf(t, df) for t, df in [((6 - 2.5) / math.sqrt(29 / 12), 2523 / 457),
                                            (0.25 / math.sqrt(11 / 48), 363 / 52)]]
    assert rows[2]['p'] == pytest.approx(p, rel=1e-9)
    q = ' | '.join(f'Q{q}: {10 * q}–{10 * q + 9} training docs (10 labels)' for q in (1, 2, 3))
    assert out.splitlines() == [
        "| setting | n | test micro-F1 (%) | test macro-F1 (%) | Welch's p against Prompt + "
        'LH-Mix (micro, macro) |',
        '| --- | --- | --- | --- | --- |',
        '| Prompt + LH-Mix | 4 | 2.50 ± 1.29 | 1.25 ± 0.65 |  |',  # sd: sqrt(5/3), sqrt(5/12)
        '| Prompt | 1 | 30.00 | 20.00 |  |',
        f'| Prompt + Mixup | 5 | 6.00 ± 3.16 | 1.50 ± 0.79 | {p[0]:.3g}, {p[1]:.3g} |',
        '',
        '| test macro-F1 (%), mean over the runs | depth 1 (10 labels) | depth 2 (20 labels) | '
        f'depth 3 (30 labels) | {q} | Q4 |',
        '| --- | --- | --- | --- | --- | --- | --- | --- |',
        '| Prompt + LH-Mix | 61.50 | 43.00 |  | 30.00 | 40.00 | 50.00 | 60.00 |',
        '| Prompt | 64.25 | 41.50 | 20.25 | 30.00 | 40.00 | 50.00 | 60.00 |',
        '| Prompt + Mixup | 62.00 | 46.00 |  | 31.00 | 43.00 | 51.00 | 61.00 |']
    moved = tmp_path / 'moved'  # the same records elsewhere, in another order within a setting
    for r in a + [c] + b:
        shutil.copytree(r, moved / os.path.basename(r))
    summary.summary([str(moved / n) for n in ['a3', 'a1', 'a2', 'a0', 'c', 'b4', 'b0', 'b2',
                                              'b1', 'b3']])
    assert capsys.readouterr().out == out
    monkeypatch.setitem(sys.modules, 'scipy.stats', None)  # as if scipy were not installed
    rows = summary.summary(a + b)
    assert 'pip install scipy' in capsys.readouterr().out and rows[1]['p'] is None


def test_fake_runs_have_the_files_and_keys_of_train_pys_runs(run, tmp_path):
    def keys(x):  # the tree of keys of a JSON value, each list by its first item
        if isinstance(x, dict):
            return {k: keys(v) for k, v in x.items()}
        return [keys(x[0])] if isinstance(x, list) else None
    fake_run(tmp_path / 'fake', 50, 40, (60, 40, 20), history=[(40, 50, [0.5] * 7)])  # 3 deep
    real, made = [{'line': read_metrics(r)[-1],
                   'test': json.loads((r / runs.TEST_METRICS).read_text())}
                  for r in (run, tmp_path / 'fake')]
    assert keys(made) == keys(real)


def test_a_closed_pipe_ends_every_script_quietly(run, tmp_path):
    """`... | head -1` on train.py, evaluate.py --texts, tools/summary.py, tools/similar.py, side
    by side: exit 1, no error on stderr (transformers 4 warns of BertForMaskedLM there)."""
    root = os.path.dirname(TOOLS)
    (tmp_path / 'in.txt').write_text('\n'.join(['quantum optics'] * 300))
    commands = [[os.path.join(root, 'train.py'), *FAST, '--epochs', '1', '--out',
                 str(tmp_path / 'run')],
                [os.path.join(root, 'evaluate.py'), '--ckpt', str(run / 'best'), '--texts',
                 str(tmp_path / 'in.txt'), '--device', 'cpu'],
                [os.path.join(TOOLS, 'summary.py'), str(run)],
                [os.path.join(TOOLS, 'similar.py'), '--ckpt', str(run / 'best'), '--label',
                 'optics']]
    procs = [subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env={**os.environ, 'HF_HUB_OFFLINE': '1'})
             for argv in commands]
    for p in procs:
        p.stdout.close()
    for argv, p in zip(commands, procs):
        err = p.stderr.read().decode()
        assert p.wait() == 1 and 'Traceback' not in err and 'Error' not in err, (argv[0], err)


def test_a_missing_prediction_file_is_named_before_any_data_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(data, 'load_data', lambda *a: pytest.fail('read the data first'))
    msg = error_of(lambda: summary.main(['--predictions', str(tmp_path / 'p.jsonl'), '--data',
                                         'wos']))
    assert msg == f'error: {tmp_path}/p.jsonl: No such file or directory'


def test_summary_of_a_run_and_of_its_saved_predictions(run, tmp_path, capsys):
    p = tmp_path / 'p.jsonl'
    evaluate.main(['--ckpt', str(run / 'best'), '--data', 'demo', '--device', 'cpu',
                   '--save-predictions', str(p)])
    test = json.loads((run / runs.TEST_METRICS).read_text())
    capsys.readouterr()
    summary.main(['--predictions', str(p), '--data', 'demo'])
    first = capsys.readouterr().out.splitlines()[0]
    assert first == (f"test: micro-F1 {100 * test['micro_f1']:.2f}  "
                     f"macro-F1 {100 * test['macro_f1']:.2f}")
    rows = summary.summary([str(run), str(run) + '/', str(run / 'best' / '..')])  # one run
    assert [(r['setting'], r['n']) for r in rows] == [('Prompt + LH-Mix', 1)]
    assert rows[0]['mean'] == pytest.approx([100 * test['micro_f1'], 100 * test['macro_f1']])
    assert '/test_metrics.json: not a finished train.py run' in error_of(
        lambda: summary.main([str(run / 'best')]))


@pytest.mark.parametrize('bad_line, message', [
    *[(line, ':2: `labels` must be a list of label names (strings)') for line in
      (b'{"labels": "Sci"}', b'{"labels": [1]}', b'{"labels": null}', b'{"labels": [["a"]]}')],
    *[(line, ':2: expected {"labels": [...]}') for line in (b'[1, 2]', b'{"label": []}')],
    (b'{"labels": ["no such label"]}', ":2: label 'no such label' is not in the hierarchy"),
    (b'{"labels": ["\xff"]}', ': not UTF-8 text (invalid start byte)'),
    (b'', ': 299 predictions for 300 documents'),
])
def test_bad_prediction_lines(tmp_path, bad_line, message):
    path = tmp_path / 'p.jsonl'
    path.write_bytes(b'{"labels": []}\n' + bad_line + b'\n{"labels": []}\n' * 298)
    msg = error_of(lambda: summary.main(['--predictions', str(path), '--data', 'demo']))
    assert msg == f'error: {path}{message}'


def test_label_case_study_on_a_demo_run(run, capsys):
    """Fig. 6: ranks by cosine at initialisation (kept in the checkpoint) and after training."""
    model, _, meta = runs.load_checkpoint(str(run / 'best'))
    h, v, top = model.hierarchy, model.hierarchy.names.index('optics'), 3

    def ranks(emb):  # by hand: sort by cosine to v (ties by id), 1 = nearest
        e = emb.double().numpy()
        cos = e @ e[v] / (np.linalg.norm(e, axis=1) * np.linalg.norm(e[v]))
        order = sorted((u for u in range(len(h)) if u != v), key=lambda u: (-cos[u], u))
        return {u: i for i, u in enumerate(order, 1)}, cos
    init, _ = ranks(meta['extra']['labels_at_init'])
    trained, cos = ranks(model.label_embeddings().detach())
    assert init != trained  # training moved the labels
    similar.main(['--ckpt', str(run / 'best'), '--label', 'optics', '--top', str(top)])
    out = capsys.readouterr().out.splitlines()
    want = [[str(trained[u]), str(init[u]), 'new' if init[u] > top else
             f'{init[u] - trained[u]:+d}', f'{cos[u]:.3f}', h.labels[u]]
            for u in sorted(trained, key=trained.get) if min(trained[u], init[u]) <= top]
    assert [x.split()[:5] for x in out[2:-1]] == want
    kept = sum(max(trained[u], init[u]) <= top for u in trained)
    assert out[-1] == f'{kept} of the top 3 after training were in the top 3 at initialisation'
    before = tree_state(run)
    for label, message in [('Hockey', "label 'Hockey' is not in the checkpoint's hierarchy")]:
        assert error_of(lambda: similar.main(['--ckpt', str(run / 'best'), '--label', label])
                        ) == f'error: {message}'
    assert tree_state(run) == before
