"""Tests of the research tools: the bench runs, summaries and their Welch p-values (worked by
hand), prediction files scored, the label case study's ranks (computed here)."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(TOOLS))
import data  # noqa: E402
import evaluate  # noqa: E402
import lhmix  # noqa: E402
import runs  # noqa: E402
import similar  # noqa: E402
import summary  # noqa: E402
import train  # noqa: E402
from test_train import FAST, error_of, tree_state  # noqa: E402


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


def test_summary_groups_by_setting_with_welch_p_values(tmp_path, capsys, monkeypatch):
    stats = pytest.importorskip('scipy.stats')

    def fake_run(name, micro, macro, **args):  # a finished run's test_metrics.json
        (tmp_path / name).mkdir()
        (tmp_path / name / runs.TEST_METRICS).write_text(json.dumps({
            'micro_f1': micro, 'macro_f1': macro, 'per_depth': {'1': {'macro_f1': macro}},
            'by_frequency': [{'macro_f1': macro / (q + 1)} for q in range(4)],
            'args': {'data': 'demo', 'mix': 'lhmix', 'seed': 0, **args}}))
        return str(tmp_path / name)

    noise = [{}, {'data_dir': 'd'}]  # arguments that do not change the result
    a = [fake_run(f'a{i}', v / 100, v / 200, seed=i, **noise[i % 2])
         for i, v in enumerate(range(1, 5))]
    b = [fake_run(f'b{i}', v / 100, v / 400, seed=i, mix='mixup', **noise[i % 2])
         for i, v in enumerate([2, 4, 6, 8, 10])]
    c = fake_run('c', 0.3, 0.2, mix='none')
    rows = summary.summary(a + [a[0], str(tmp_path / '.' / 'a0'), c] + b)  # a0 counted once
    out = capsys.readouterr().out.splitlines()
    assert [(r['setting'], r['n']) for r in rows] == [('mix=lhmix', 4), ('mix=none', 1),
                                                      ('mix=mixup', 5)]
    assert (*rows[0]['mean'], *rows[0]['sd']) == pytest.approx(
        (2.5, 1.25, math.sqrt(5 / 3), math.sqrt(5 / 12)))
    assert rows[1]['sd'] is None and rows[1]['p'] is None and '±' not in out[2]
    # Welch's t and df by hand: means 2.5 and 6; s^2/n: (5/3)/4 = 5/12 and 10/5 = 2
    t = (6 - 2.5) / math.sqrt(29 / 12)
    df = (29 / 12) ** 2 / ((5 / 12) ** 2 / 3 + 2 ** 2 / 4)  # = 2523 / 457
    assert rows[2]['p'][0] == pytest.approx(2 * stats.t.sf(t, df), rel=1e-9)
    assert out[3].split()[:4] == ['mix=mixup', '5', '6.00', '±']
    assert out[-1].split() == ['mix=mixup', '1.50', '1.50', '0.75', '0.50', '0.38']
    monkeypatch.setitem(sys.modules, 'scipy.stats', None)  # as if scipy were not installed
    rows = summary.summary(a + b)
    assert 'pip install scipy' in capsys.readouterr().out and rows[1]['p'] is None


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
    assert [(r['setting'], r['n']) for r in rows] == [('all runs', 1)]
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


def test_relatives_among_the_nearest_labels_by_hand():
    """A tree of 5 labels, A and B at depth 1, A1 and A2 under A, B1 under B, embedded in a plane
    at the angles below (lengths apart: the cosine ignores them), ranked by hand."""
    h = lhmix.Hierarchy({'A': None, 'B': None, 'A1': 'A', 'A2': 'A', 'B1': 'B'})
    # relatives: A: B (depth 1), A1, A2; B: A, B1; A1: A, A2; A2: A, A1; B1: B
    assert [similar.relatives(h, v) for v in range(5)] == [{1, 2, 3}, {0, 4}, {0, 3}, {0, 2}, {1}]

    def plane(degrees, lengths=(1, 1, 1, 1, 1)):
        return torch.tensor([[r * math.cos(math.radians(d)), r * math.sin(math.radians(d))]
                             for d, r in zip(degrees, lengths)])
    # A 0, B 210, A1 10, A2 100, B1 30 degrees; the nearest first:
    # A: A1 B1 A2 B; B: A2 A A1 B1; A1: A B1 A2 B; A2: B1 A1 A B; B1: A1 A A2 B
    # k 1: 1, 0, 1, 0, 0 relatives; k 3: 2, 1, 2, 2, 0 of 3; k 15 (all 4): 3, 2, 2, 2, 1 of 4
    assert similar.relatives_among_nearest(h, plane([0, 210, 10, 100, 30]), (1, 3, 15)) == \
        pytest.approx({1: 2 / 5, 3: 7 / 15, 15: 1 / 2}, abs=1e-12)
    # A 0, B 180, A1 5, A2 -8, B1 195: A: A1 A2 B1 B; B: B1 A2 A1 A; A1: A A2 B1 B;
    # A2: A A1 B1 B; B1: B A2 A A1; k 1: all relatives; k 3: 2, 1, 2, 2, 1 of 3
    assert similar.relatives_among_nearest(h, plane([0, 180, 5, -8, 195], (1, 3, 0.5, 2, 1)),
                                           (1, 3, 15)) == \
        pytest.approx({1: 1, 3: 8 / 15, 15: 1 / 2}, abs=1e-12)


def test_all_labels_on_a_demo_run_printed_and_written(run, tmp_path, capsys):
    """Fig. 6 over all labels, worked here in float64 from the checkpoint's embeddings; --out
    written whole, rewritten over its own earlier file, never over another."""
    model, _, meta = runs.load_checkpoint(str(run / 'best'))
    parent = model.hierarchy.parent
    n = len(parent)
    kin = [{u for u in range(n) if u != v and parent[u] == parent[v]}  # siblings
           | {u for u in range(n) if parent[u] == v} | ({parent[v]} - {-1}) for v in range(n)]

    def shares(emb):
        e = emb.double().numpy()
        e = e / np.linalg.norm(e, axis=1, keepdims=True)
        cos = e @ e.T
        order = [sorted((u for u in range(n) if u != v), key=lambda u: (-cos[v, u], u))
                 for v in range(n)]
        return {k: np.mean([len(kin[v] & set(order[v][:k])) / k for v in range(n)])
                for k in (3, 15)}
    want = {'init': shares(meta['extra']['labels_at_init']),
            'trained': shares(model.label_embeddings().detach())}
    chance = np.mean([len(kin[v]) / (n - 1) for v in range(n)])
    out = tmp_path / 'relatives.json'
    for _ in range(2):  # the second time over the first's file
        similar.main(['--ckpt', str(run / 'best'), '--all-labels', '--out', str(out)])
        lines = capsys.readouterr().out.splitlines()
        assert f'the share averaged over the {n} labels' in lines[1]
        assert [line.split() for line in lines[2:]] == [
            ['k', 'init', 'trained'],
            *[[str(k), f"{want['init'][k]:.3f}", f"{want['trained'][k]:.3f}"] for k in (3, 15)],
            ['by', 'chance', '(all', 'other', 'labels):', f'{chance:.3f}']]
        written = json.loads(out.read_text())
        assert written == {'relatives_among_nearest': {str(k): {s: pytest.approx(want[s][k])
                                                                for s in want} for k in (3, 15)},
                           'by_chance': pytest.approx(chance), 'labels': n}
    assert out.read_text().startswith(similar.START) and os.listdir(tmp_path) == [out.name]
    other = tmp_path / 'notes.json'
    other.write_text('{"mine": 1}\n')
    before = tree_state(tmp_path)
    assert error_of(lambda: similar.main(['--ckpt', str(run / 'best'), '--all-labels', '--out',
                                          str(other)])) == (
        f'error: --out {other}: exists and is not an earlier --out file (remove it or choose '
        'another name)')
    assert tree_state(tmp_path) == before
    for argv, message in [(['--all-labels', '--top', '3'], '--top is for --label'),
                          (['--label', 'optics', '--out', str(out)], '--out is for --all-labels')]:
        with pytest.raises(SystemExit) as e:
            similar.main(['--ckpt', str(run / 'best'), *argv])
        assert e.value.code == 2 and message in capsys.readouterr().err
