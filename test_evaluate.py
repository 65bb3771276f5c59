"""Tests of evaluate.py, by behaviour; expected values worked by hand or computed independently."""
import json
import math
import os
import subprocess
import sys

os.environ['HF_HUB_OFFLINE'] = '1'  # never reach the hub, whatever a test does
os.environ['TRANSFORMERS_OFFLINE'] = '1'

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import data  # noqa: E402
import evaluate  # noqa: E402
import lhmix  # noqa: E402
import train  # noqa: E402
from test_data import TEXTS, tiny_model  # noqa: E402
from test_lhmix import PARENTS  # noqa: E402
from test_train import FAST, error_of, tree_state  # noqa: E402


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp('evaluate') / 'run'
    train.main(FAST + ['--epochs', '1', '--out', str(out)])
    return out


# F1 (HiAGM convention) and scoring a checkpoint or a prediction file
def test_f1_hand_worked():
    gold, pred = [[0, 1], [0], [2]], [[0], [0, 2], [1, 2]]
    # label 0: tp 2 of 2 predicted, 2 gold -> 1; label 1: 0; label 2: P 1/2, R 1 -> 2/3; label 3: 0
    # micro: tp 3, predicted 5, gold 4 -> P .6, R .75 -> 2/3
    f = evaluate.f1_scores(pred, gold, 4)
    assert (f['micro_f1'], f['macro_f1']) == pytest.approx((2 / 3, (1 + 0 + 2 / 3 + 0) / 4))
    m = np.array([[1, 0, 0, 0], [1, 0, 1, 0], [0, 1, 1, 0]], bool)  # pred as a 0/1 matrix
    assert evaluate.f1_scores(m, gold, 4)['macro_f1'] == pytest.approx(5 / 12)
    # labels 0 and 2 only: tp 3, predicted 4, gold 3 -> micro 6/7; macro (1 + 2/3) / 2
    sub = evaluate.f1_scores(pred, gold, 4, labels=[0, 2])
    assert sub['micro_f1'] == pytest.approx(6 / 7) and sub['macro_f1'] == pytest.approx(5 / 6)
    assert evaluate.f1_scores(pred, gold, 4, labels=[3])['macro_f1'] == 0.0


def test_evaluate_reproduces_test_metrics_and_rescores_its_predictions(run, tmp_path):
    e, p = tmp_path / 'e.json', tmp_path / 'p.jsonl'
    argv = ['--ckpt', str(run / 'best'), '--data', 'demo', '--device', 'cpu', '--out', str(e),
            '--save-predictions', str(p)]
    for _ in range(2):  # the second time over its own earlier outputs
        evaluate.main(argv)
    test, ev = (json.loads(x.read_text()) for x in (run / evaluate.TEST_METRICS, e))
    assert ev == {k: test[k] for k in ev}  # test_metrics.json has the run's epoch and args too
    h, splits = data.load_demo()
    pred = [[h.index[v] for v in json.loads(x)['labels']] for x in p.read_text().splitlines()]
    f1 = evaluate.f1_scores(pred, [ls for _, ls in splits['test']], len(h))
    assert (f1['micro_f1'], f1['macro_f1']) == pytest.approx((test['micro_f1'], test['macro_f1']))
    evaluate.main(['--predictions', str(p), '--data', 'demo', '--out', str(tmp_path / 'a/e.json')])
    assert json.loads((tmp_path / 'a/e.json').read_text())['macro_f1'] == test['macro_f1']
    rows = evaluate.summary([str(run), str(run) + '/', str(run / 'best' / '..')])  # one run
    assert [(r['setting'], r['n']) for r in rows] == [('all runs', 1)]
    assert rows[0]['mean'] == pytest.approx([100 * test['micro_f1'], 100 * test['macro_f1']])


@pytest.mark.parametrize('bad_line, message', [
    *[(line, ':2: `labels` must be a list of label names (strings)') for line in
      (b'{"labels": "Sci"}', b'{"labels": [1]}', b'{"labels": null}', b'{"labels": [["a"]]}',
       b'{"labels": {"a": 1}}')],
    *[(line, ':2: expected {"labels": [...]}') for line in (b'[1, 2]', b'{"label": []}')],
    (b'{"labels": ["no such label"]}', ":2: label 'no such label' is not in the hierarchy"),
    (b'{"labels": ["\xff"]}', ':2: not UTF-8 text (invalid start byte at byte 14 of the line)'),
    (b'', ': 299 predictions for 300 documents'),
])
def test_bad_prediction_lines(tmp_path, bad_line, message):
    path = tmp_path / 'p.jsonl'
    path.write_bytes(b'{"labels": []}\n' + bad_line + b'\n{"labels": []}\n' * 298)
    msg = error_of(lambda: evaluate.main(['--predictions', str(path), '--data', 'demo',
                                          '--out', str(tmp_path / 'ev' / 'e.json')]))
    assert msg == f'error: {path}{message}' and not (tmp_path / 'ev').exists()


# One error line, the user's files unchanged; outputs never over what evaluate.py did not write,
# refused before anything is computed
@pytest.mark.parametrize('argv, message', [
    *[(['--ckpt', '{c}', '--data', 'demo', flag, path], f'{flag} {path}: {why}')
      for flag, path, why in [
        ('--save-predictions', '{c}/model.safetensors', 'is inside the checkpoint folder {c}'),
        ('--out', '{c}/e.json', 'is inside the checkpoint folder {c} being read'),
        ('--out', '{t}/link.json', 'is inside the checkpoint folder {c} being read'),
        ('--out', '{t}/notes.txt', 'exists and is not an earlier --out file'),
        ('--out', '{t}/p.jsonl', 'exists and is not an earlier --out file'),
        ('--save-predictions', '{t}/notes.txt', 'exists and is not an earlier --save-predictions'),
        ('--save-predictions', '{t}/e.json', 'exists and is not an earlier --save-predictions'),
        ('--out', '{t}', 'is a folder, not a file'),
        ('--out', '{r}/test_metrics.json', "is a train.py run's own file")]],
    (['--ckpt', '{r}', '--data', 'demo'], '{r}: a run, not a checkpoint: pass {r}/best'),
    (['--ckpt', '{c}', '--texts', '{t}'], '{t}: Is a directory'),
    (['--ckpt', '{c}', '--texts', '{t}/no.txt'], '{t}/no.txt: No such file or directory'),
    (['--ckpt', '{c}', '--similar', 'Hockey'], "label 'Hockey' is not in the checkpoint's"),
    (['--ckpt', '{c}', '--similar', 'optics'], "{c}: the run's pretrained model is unknown (tiny)"),
    (['--ckpt', '{c}', '--similar', 'optics', '--model', '{t}/nope'], "could not load model '{t}/"),
    (['--summary', '{c}'], '{c}/test_metrics.json: not a finished train.py run'),
    (['--ckpt', '{c}', '--data', 'demo', '--out', '{r}/metrics.jsonl/e.json'],
     '{r}/metrics.jsonl: File exists'),  # what the OS refuses, after computing
])
def test_mistakes_end_in_one_error_line(run, tmp_path, monkeypatch, argv, message):
    for name, text in (('notes.txt', 'keep me'), ('p.jsonl', '{"labels": []}\n'),
                       ('e.json', '{"micro_f1": 0.5, "macro_f1": 0.25}')):
        (tmp_path / name).write_text(text)
    (tmp_path / 'link.json').symlink_to(run / 'best' / data.WEIGHTS)
    before = tree_state(tmp_path), tree_state(run)
    if argv[4:5] in (['--out'], ['--save-predictions']) and 'File exists' not in message:
        monkeypatch.setattr(data, 'load_data', lambda *a, **k: pytest.fail('computed first'))
    fill = dict(t=tmp_path, c=run / 'best', r=run)
    msg = error_of(lambda: evaluate.main([a.format(**fill) for a in argv]))
    assert msg.startswith('error: ' + message.format(**fill)), msg
    assert (tree_state(tmp_path), tree_state(run)) == before


def test_broken_pipe_ends_quietly(run, tmp_path):
    (tmp_path / 'in.txt').write_text('\n'.join(TEXTS * 100))  # `evaluate.py ... | head -2`
    p = subprocess.Popen([sys.executable, evaluate.__file__, '--ckpt', str(run / 'best'),
                          '--texts', str(tmp_path / 'in.txt')], stdout=-1, stderr=-1)  # PIPEs
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait() == 1 and 'Error' not in err and 'Exception' not in err, err


# --summary: mean +- sd per setting, n, Welch's p-value against the first setting
def test_summary_groups_by_setting_with_welch_p_values(tmp_path, capsys, monkeypatch):
    stats = pytest.importorskip('scipy.stats')

    def fake_run(name, micro, macro, **args):  # a finished run's test_metrics.json
        (tmp_path / name).mkdir()
        (tmp_path / name / evaluate.TEST_METRICS).write_text(json.dumps({
            'micro_f1': micro, 'macro_f1': macro, 'per_depth': {'1': {'macro_f1': macro}},
            'by_frequency': [{'macro_f1': macro / (q + 1)} for q in range(4)],
            'args': {'data': 'demo', 'mix': 'lhmix', 'seed': 0, 'out': name, **args}}))
        return str(tmp_path / name)

    noise = [{}, {'device': 'cuda'}, {'no_cuda_graphs': True}, {'overwrite': True, 'resume': True},
             {'data_dir': 'd'}]  # arguments that do not change the result
    a = [fake_run(f'a{i}', v / 100, v / 200, seed=i, **noise[i]) for i, v in enumerate(range(1, 5))]
    b = [fake_run(f'b{i}', v / 100, v / 400, seed=i, mix='mixup', **noise[i])
         for i, v in enumerate([2, 4, 6, 8, 10])]
    c = fake_run('c', 0.3, 0.2, mix='none')
    rows = evaluate.summary(a + [a[0], str(tmp_path / '.' / 'a0'), c] + b)  # a0 counted once
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
    rows = evaluate.summary(a + b)
    assert 'pip install scipy' in capsys.readouterr().out and rows[1]['p'] is None


# --texts: one JSON line per input line; --similar: the paper's label case study
def test_texts_one_json_line_per_input_line(tmp_path, capsys):
    h = lhmix.Hierarchy(PARENTS)
    torch.manual_seed(4)
    model, tok = tiny_model(h)
    model.max_length = 32
    with torch.no_grad():  # Sci and optics on, quantum physics (between them) off
        model.label_bias.copy_(torch.tensor([9.0, -9.0, -9.0, -9.0, -9.0, 9.0]))
    data.save_checkpoint(tmp_path / 'ck', model, tok, {})
    lines = [TEXTS[0], '', ' '.join(['light waves bend in glass'] * 20), TEXTS[2]]
    (tmp_path / 'in.txt').write_text('\n'.join(lines) + '\n', encoding='utf-8')
    evaluate.main(['--ckpt', str(tmp_path / 'ck'), '--texts', str(tmp_path / 'in.txt'),
                   '--device', 'cpu'])  # fp32, as the scores computed below
    cap = capsys.readouterr()
    out = [json.loads(line) for line in cap.out.splitlines()]
    assert out[1] == {'labels': [], 'paths': [], 'scores': {}, 'truncated': False}
    assert [r['truncated'] for r in out] == [False, False, True, False]
    assert '1 of 4 texts truncated to max_length 32' in cap.err
    model.eval()
    for text, r in zip(lines[:1] + lines[2:], out[:1] + out[2:]):
        ids = tok(text, add_special_tokens=False)['input_ids'][:model.text_budget(32)]
        x = torch.tensor([model.prefix + ids + [tok.sep_token_id]])
        s = model.label_scores(x, torch.ones_like(x))[0]
        assert [r['scores'][v] for v in h.labels] == pytest.approx(s.tolist(), abs=1e-3)
        assert r['labels'] == ['Sci', 'Sci/quantum_physics/optics'] == [
            h.labels[v] for v in range(len(h)) if s[v] > 0]
        assert r['paths'] == [[h.names[0], h.names[5]]]  # the unpredicted ancestor left out


def test_similar_ranks_at_init_and_after_training(tmp_path, capsys):
    h = lhmix.Hierarchy(PARENTS)
    torch.manual_seed(3)
    mlm, tok = data.tiny_bert(TEXTS + h.names)
    for x in (mlm, tok):
        x.save_pretrained(tmp_path / 'pre')
    word_emb = mlm.get_input_embeddings().weight.detach().clone()
    model = lhmix.build_model(mlm, tok, h, 'prompt')
    # "trained": optics (label 5) along e0, label u at cosine cos[u] to it in the plane (e0, e_u+1),
    # each row scaled differently so that a dot product would rank them otherwise
    cos, rank_trained = [0.95, 0.2, 0.85, 0.8, -0.5], {0: 1, 2: 2, 3: 3, 1: 4, 4: 5}
    rows = torch.zeros(6, model.label_embeddings().shape[1])
    rows[5, 0] = 3.0
    for u, c in enumerate(cos):
        rows[u, 0], rows[u, u + 1] = (0.3 + 2 * u) * c, (0.3 + 2 * u) * math.sqrt(1 - c * c)
    with torch.no_grad():
        model.label_embeddings().copy_(rows)
    data.save_checkpoint(tmp_path / 'ck', model, tok, {'args': {'model': str(tmp_path / 'pre')}})
    outs = []
    for label in ('optics', 'Sci/quantum_physics/optics'):  # by name or key
        evaluate.main(['--similar', label, '--ckpt', str(tmp_path / 'ck'), '--top', '3'])
        outs.append(capsys.readouterr().out.splitlines())
    # at init, independently: a label's row = the mean of its name's word-pieces' embeddings
    init = torch.stack([word_emb[tok.convert_tokens_to_ids(n.lower().split())].mean(0)
                        for n in h.names])
    c = torch.nn.functional.cosine_similarity(init, init[5:6], dim=1)
    order = [u for u in torch.argsort(c, descending=True, stable=True).tolist() if u != 5]
    rank_init = {u: i + 1 for i, u in enumerate(order)}
    # change = rank at init - rank after training; 'new': not in the top 3 at init
    want = [[str(rank_trained[u]), str(rank_init[u]), 'new' if rank_init[u] > 3 else
             f'{rank_init[u] - rank_trained[u]:+d}', f'{cos[u]:.3f}', h.labels[u]]
            for u in (0, 2, 3, 1, 4) if min(rank_trained[u], rank_init[u]) <= 3]
    assert outs[0] == outs[1] and [x.split()[:5] for x in outs[0][2:-1]] == want
    kept = sum(max(rank_trained[u], rank_init[u]) <= 3 for u in range(5))
    assert outs[0][-1] == f'{kept} of the top 3 after training were in the top 3 at initialisation'
