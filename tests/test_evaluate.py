"""Tests of evaluate.py, by behaviour; expected values worked by hand or computed independently."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import data
import evaluate
import lhmix
import runs
from helpers import PARENTS, TEXTS, error_of, read_metrics, tiny_model, tree_state


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


def test_per_depth_and_label_frequency_quartiles_hand_worked():
    """Fig. 7's breakdown of a small case. Labels: 0, 1 at depth 1; 2-7 at depth 2. Training
    counts 7, 0, 5, 1, 6, 2, 4, 3: quartiles by count, rarest first: {1, 3}, {5, 7}, {6, 2},
    {4, 0}. Per label (tp, predicted, gold): 0 (1, 2, 1), 1 (0, 0, 1), 2 (1, 1, 1), 3 (0, 1, 0),
    4 (0, 0, 0), 5 (1, 1, 2), 6 (0, 0, 0), 7 (0, 0, 1); F1 = 2 tp / (predicted + gold)."""
    h = lhmix.Hierarchy({'a': None, 'b': None, 'a/c': 'a', 'a/d': 'a', 'a/e': 'a', 'b/f': 'b',
                         'b/g': 'b', 'b/h': 'b'})
    train = [[0]] * 7 + [[2]] * 5 + [[3]] + [[4]] * 6 + [[5]] * 2 + [[6]] * 4 + [[7]] * 3
    gold = [[0, 2], [1, 5], [5, 7]]
    pred = np.zeros((3, 8), bool)
    pred[0, [0, 2]] = pred[1, [0, 3]] = pred[2, 5] = True
    r = evaluate.report(pred, gold, h, train)
    f1 = {0: 2 / 3, 1: 0, 2: 1, 3: 0, 4: 0, 5: 2 / 3, 6: 0, 7: 0}

    def expect(labels, tp, n):  # micro: 2 tp / (predicted + gold) summed over the labels
        return 2 * tp / n, sum(f1[v] for v in labels) / len(labels)
    got = [(r['micro_f1'], r['macro_f1'])] + [
        (d['labels'], d['micro_f1'], d['macro_f1']) for d in r['per_depth'].values()] + [
        (f['quartile'], f['labels'], f['train_docs_min'], f['train_docs_max'], f['micro_f1'],
         f['macro_f1']) for f in r['by_frequency']]
    want = [expect(range(8), 3, 5 + 6), (2, *expect([0, 1], 1, 2 + 2)),
            (6, *expect(range(2, 8), 2, 3 + 4)), (1, 2, 0, 1, *expect([1, 3], 0, 1 + 1)),
            (2, 2, 2, 3, *expect([5, 7], 1, 1 + 3)), (3, 2, 4, 5, *expect([6, 2], 1, 1 + 1)),
            (4, 2, 6, 7, *expect([4, 0], 1, 2 + 1))]
    assert list(r['per_depth']) == [1, 2] and len(got) == len(want)
    for g, w in zip(got, want):
        assert g == pytest.approx(w)


def test_evaluate_reproduces_test_metrics_and_rescores_its_predictions(run, tmp_path, capsys):
    """The run's test figures (test_metrics.json), its best epoch's dev figures (metrics.jsonl,
    scored by train.py as it trained) with --split dev, and the F1 of the saved predictions."""
    e, p = tmp_path / 'e.json', tmp_path / 'p.jsonl'
    argv = ['--ckpt', str(run / 'best'), '--data', 'demo', '--device', 'cpu', '--out', str(e),
            '--save-predictions', str(p)]
    for _ in range(2):  # the second time over its own earlier outputs
        evaluate.main(argv)
    test, ev = (json.loads(x.read_text()) for x in (run / runs.TEST_METRICS, e))
    assert ev == {k: test[k] for k in ev}  # test_metrics.json has the run's epoch and args too
    h, splits = data.load_demo()
    pred = [[h.index[v] for v in json.loads(x)['labels']] for x in p.read_text().splitlines()]
    f1 = evaluate.f1_scores(pred, [ls for _, ls in splits['test']], len(h))
    assert (f1['micro_f1'], f1['macro_f1']) == pytest.approx((test['micro_f1'], test['macro_f1']))
    capsys.readouterr()
    evaluate.main(argv[:4] + ['--device', 'cpu', '--split', 'dev', '--out', str(e)])
    dev, best = json.loads(e.read_text()), read_metrics(run)[test['best_epoch']]
    assert (dev['micro_f1'], dev['macro_f1']) == pytest.approx((best['dev_micro_f1'],
                                                            best['dev_macro_f1']))
    assert capsys.readouterr().out.splitlines()[1].startswith('dev: micro-F1 ')


def test_saved_predictions_follow_the_splits_document_order(run, tmp_path, monkeypatch):
    """--data's --save-predictions: line i holds document i's predicted labels. The scores are
    made to predict label i mod V for the i-th document that evaluate.py scores."""
    h, splits = data.load_demo()
    V, p = len(h), tmp_path / 'p.jsonl'
    monkeypatch.setattr(lhmix, 'score_documents', lambda model, tokens: np.where(
        np.arange(V) == np.arange(len(tokens))[:, None] % V, 1.0, -1.0))
    evaluate.main(['--ckpt', str(run / 'best'), '--data', 'demo', '--device', 'cpu',
                   '--save-predictions', str(p)])
    assert [json.loads(x) for x in p.read_text().splitlines()] == [
        {'labels': [h.labels[i % V]]} for i in range(len(splits['test']))]


# What evaluate.py prints: the report's lines, --save-predictions' lines, --texts' JSON lines

PREDICTED = ['science', 'physics', 'optics', 'arts']  # in the demo tree's order


@pytest.fixture(scope='module')
def fixed(run, tmp_path_factory):
    """The demo run's best/ with max_length 40 (a text budget of 40 - 8 - 1 = 31 word-pieces,
    beside the demo's prompt of 8 and the closing [SEP]) and label biases (+-20, far beyond its
    scores) that predict PREDICTED for every text."""
    model, tok, _ = runs.load_checkpoint(str(run / 'best'))
    with torch.no_grad():
        model.label_bias.fill_(-20.0)
        model.label_bias[[model.hierarchy.index[v] for v in PREDICTED]] = 20.0
    model.max_length = 40
    folder = tmp_path_factory.mktemp('fixed') / 'ck'
    runs.save_checkpoint(str(folder), model, tok, {})
    return folder


def test_report_lines_overall_then_each_depth_then_each_quartile(fixed, tmp_path, capsys):
    """Every test document predicted PREDICTED, its F1 counted by hand: a predicted label v,
    gold in g_v of the N documents, has tp g_v of N + g_v, F1 2 g_v / (N + g_v); the others 0.
    The documents longer than the budget (a word-piece per demo word) are counted as cut."""
    e, p = tmp_path / 'e.json', tmp_path / 'p.jsonl'
    evaluate.main(['--ckpt', str(fixed), '--data', 'demo', '--device', 'cpu', '--out', str(e),
                   '--save-predictions', str(p)])
    lines = capsys.readouterr().out.splitlines()
    h, splits = data.load_demo()
    docs, r = splits['test'], json.loads(e.read_text())
    n, g = len(docs), [sum(v in ls for _, ls in docs) for v in range(len(h))]
    on = [h.labels[v] in PREDICTED for v in range(len(h))]

    def figures(labels):  # micro- and macro-F1 (%) over these labels
        tp, both = sum(g[v] for v in labels if on[v]), sum(n * on[v] + g[v] for v in labels)
        return 200 * tp / both, 100 * sum(2 * g[v] / (n + g[v]) for v in labels if on[v]) / len(
            labels)
    cut = sum(len(text.split()) > 31 for text, _ in docs)
    assert 0 < cut < n and re.fullmatch(
        rf'300 documents \({cut} truncated to max_length 40\) in \d+\.\d s', lines[0]), lines[0]
    depths = [[v for v in range(len(h)) if h.depth[v] == d] for d in (1, 2, 3)]
    assert lines[1:5] == ['{}: micro-F1 {:.2f}  macro-F1 {:.2f}'.format(what, *figures(labels))
                          for what, labels in [('test', range(len(h))), ('  depth 1', depths[0]),
                                               ('  depth 2', depths[1]), ('  depth 3', depths[2])]]
    assert lines[5:] == [f'  label-frequency quartile {q} ({f["train_docs_min"]}-'
                         f'{f["train_docs_max"]} train docs): micro-F1 {100 * f["micro_f1"]:.2f}'
                         f'  macro-F1 {100 * f["macro_f1"]:.2f}'
                         for q, f in enumerate(r['by_frequency'], 1)]
    assert len(lines) == 1 + 1 + 3 + 4
    assert p.read_text() == '{"labels": ["science", "physics", "optics", "arts"]}\n' * n


def test_texts_json_lines_their_keys_orders_and_truncation_past_the_budget(fixed, tmp_path,
                                                                           capsys):
    """A JSON line per input line, its keys in order: the labels by depth, then in the tree's
    order; a path of names per predicted label without a predicted descendant; every label's
    score, in the tree's order; truncated: only past the budget (31 word-pieces: 'physics' is
    one). A blank line, empty or spaces, is not scored."""
    lines = [' '.join(['physics'] * 31), ' '.join(['physics'] * 32), '', '   ']
    (tmp_path / 'in.txt').write_text('\n'.join(lines) + '\n')
    p = tmp_path / 'p.jsonl'
    evaluate.main(['--ckpt', str(fixed), '--texts', str(tmp_path / 'in.txt'), '--device', 'cpu',
                   '--save-predictions', str(p)])
    out, err = capsys.readouterr()
    labels = data.load_demo(sizes=(0, 0, 0))[0].labels
    rs = [json.loads(line) for line in out.splitlines()]
    assert len(rs) == 4 and all(list(r) == ['labels', 'paths', 'scores', 'truncated'] for r in rs)
    for r, truncated in zip(rs, (False, True)):
        assert r['labels'] == ['science', 'arts', 'physics', 'optics']
        assert r['paths'] == [['science', 'physics', 'optics'], ['arts']]
        assert list(r['scores']) == labels and r['truncated'] == truncated
        assert [v for v in labels if r['scores'][v] > 0] == PREDICTED
    assert rs[2:] == [{'labels': [], 'paths': [], 'scores': {}, 'truncated': False}] * 2
    assert err == '1 of 4 texts truncated to max_length 40\n'
    # --save-predictions: a line a text, as --data writes it: the labels in the tree's order
    assert p.read_text() == '{"labels": ["science", "physics", "optics", "arts"]}\n' * 2 + \
        '{"labels": []}\n' * 2


@pytest.fixture(scope='module')
def other_labels(tmp_path_factory):
    """A checkpoint whose labels are PARENTS', not the demo's."""
    folder = tmp_path_factory.mktemp('other') / 'ck'
    runs.save_checkpoint(str(folder), *tiny_model(lhmix.Hierarchy(PARENTS)), {})
    return folder


# One error line, the user's files unchanged; outputs never over what evaluate.py did not write,
# refused before anything is computed
@pytest.mark.parametrize('argv, message', [
    *[(['--ckpt', '{c}', '--data', 'demo', flag, path], f'{flag} {path}: {why}')
      for flag, path, why in [
        ('--save-predictions', '{c}/model.safetensors', 'is inside the checkpoint {c}'),
        ('--out', '{c}/e.json', 'is inside the checkpoint {c} being read'),
        ('--out', '{t}/link.json', 'is inside the checkpoint {c} being read'),
        ('--out', '{t}/notes.txt', 'exists and is not an earlier --out file'),
        ('--out', '{t}/p.jsonl', 'exists and is not an earlier --out file'),
        ('--save-predictions', '{t}/notes.txt', 'exists and is not an earlier --save-predictions'),
        ('--save-predictions', '{t}/e.json', 'exists and is not an earlier --save-predictions'),
        ('--out', '{r}/test_metrics.json', "is a train.py run's own file"),
        ('--save-predictions', '{r}/metrics.jsonl', "is a train.py run's own file"),
        ('--out', '{r}/metrics.jsonl/e.json', '{r}/metrics.jsonl is a file, not a folder')]],
    *[(['--ckpt', '{c}', '--texts', '{t}/notes.txt', '--save-predictions', path],
       f'--save-predictions {path}: {why}') for path, why in [
        ('{c}/p.jsonl', 'is inside the checkpoint {c} being read'),
        ('{t}/e.json', 'exists and is not an earlier --save-predictions file'),
        ('{r}/metrics.jsonl', "is a train.py run's own file")]],
    (['--ckpt', '{c}', '--data', 'demo', '--out', '{t}'], '{t}: Is a directory'),
    (['--ckpt', '{r}', '--data', 'demo'], '{r}: a run, not a checkpoint: pass {r}/best'),
    (['--ckpt', '{c}/model.safetensors', '--data', 'demo'], '{c}/model.safetensors: a file, not a '
     "checkpoint folder (such as a run's best/)"),
    (['--ckpt', '{c}', '--texts', '{t}'], '{t}: Is a directory'),
    (['--ckpt', '{c}', '--texts', '{t}/no.txt'], '{t}/no.txt: No such file or directory'),
    (['--ckpt', '{k}', '--data', 'demo'], '{k}: its labels differ from those of the data'),
    (['--ckpt', '{t}/no', '--texts', '{t}/notes.txt'], '{t}/no: not an LH-Mix checkpoint (no '
     'tokenizer.json, tokenizer_config.json, config.json, model.safetensors)'),
])
def test_mistakes_end_in_one_error_line(run, other_labels, tmp_path, monkeypatch, argv, message):
    for name, text in (('notes.txt', 'keep me'), ('p.jsonl', '{"labels": []}\n'),
                       ('e.json', '{"micro_f1": 0.5, "macro_f1": 0.25}')):
        (tmp_path / name).write_text(text)
    (tmp_path / 'link.json').symlink_to(run / 'best' / runs.WEIGHTS)
    before = tree_state(tmp_path), tree_state(run)
    if argv[4:5] in (['--out'], ['--save-predictions']):
        for module, name in ((data, 'load_data'), (runs, 'load_checkpoint')):
            monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail('computed first'))
    fill = dict(t=tmp_path, c=run / 'best', r=run, k=other_labels)
    msg = error_of(lambda: evaluate.main([a.format(**fill) for a in argv]))
    assert msg.startswith('error: ' + message.format(**fill)), msg
    assert (tree_state(tmp_path), tree_state(run)) == before


@pytest.mark.parametrize('argv, message', [
    (['--data', 'demo', '--texts', '-'], 'argument --texts: not allowed with argument --data'),
    ([], 'one of the arguments --data --texts is required'),
    (['--data', 'demo', '--out', 'x', '--save-predictions', './x'],
     '--out and --save-predictions name one file: x'),
    (['--texts', '-', '--out', 'x'],
     '--out (F1 figures) needs --data: texts have no gold labels'),
    (['--data', 'demo', '--device', 'gpu'], 'argument --device: gpu: only ' + (
        'cpu, cuda or cuda:N' if torch.cuda.is_available() else 'cpu (no CUDA GPU here)')),
])
def test_flag_mistakes_end_in_argparse_usage_and_one_error_line(tmp_path, monkeypatch, capsys,
                                                                argv, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        evaluate.main(['--ckpt', 'ck', *argv])
    assert e.value.code == 2 and capsys.readouterr().err.endswith(f'error: {message}\n')
    assert os.listdir(tmp_path) == []


# --texts: one JSON line per input line
def test_a_score_of_exactly_0_is_no_prediction(monkeypatch):
    """Sec. 3: a label is predicted where its score is > 0; at 0 it is not."""
    h = lhmix.Hierarchy(PARENTS)
    model, tok = tiny_model(h)
    scores = np.zeros((1, len(h)), np.float32)
    scores[0, 0] = 1e-30  # Sci, the root's child, alone above 0
    monkeypatch.setattr(lhmix, 'score_documents', lambda model, tokens: scores)
    assert evaluate.classify(model, tok, ['a text'])[0]['labels'] == [h.labels[0]]


def test_texts_one_json_line_per_input_line(tmp_path, capsys):
    h = lhmix.Hierarchy(PARENTS)
    torch.manual_seed(4)
    model, tok = tiny_model(h)
    model.max_length = 32
    with torch.no_grad():  # Sci and optics on, quantum physics (between them) off
        model.label_bias.copy_(torch.tensor([9.0, -9.0, -9.0, -9.0, -9.0, 9.0]))
    runs.save_checkpoint(tmp_path / 'ck', model, tok, {})
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
        s = model.label_scores(x, torch.ones_like(x), torch.tensor([0]))[0]
        assert [r['scores'][v] for v in h.labels] == pytest.approx(s.tolist(), abs=1e-3)
        assert r['labels'] == ['Sci', 'Sci/quantum_physics/optics'] == [
            h.labels[v] for v in range(len(h)) if s[v] > 0]
        assert r['paths'] == [[h.names[0], h.names[5]]]  # the unpredicted ancestor left out


def test_accented_names_are_written_as_utf_8_json_even_under_the_c_locale(tmp_path):
    """evaluate.py run as a script under LC_ALL=C, with accented label names all predicted (label
    biases +9): its JSON lines on stdout and in --save-predictions hold the names as written, in
    UTF-8 bytes, with no \\u escape."""
    h = lhmix.Hierarchy({'Électroménager': None, 'Électroménager/Réfrigérateurs': 'Électroménager',
                         'Jardin': None})
    model, tok = tiny_model(h)
    with torch.no_grad():
        model.label_bias.fill_(9.0)
    runs.save_checkpoint(tmp_path / 'ck', model, tok, {})
    env = {**os.environ, 'LC_ALL': 'C', 'LANG': 'C', 'CUDA_VISIBLE_DEVICES': ''}
    env.pop('PYTHONIOENCODING', None)
    out = subprocess.run([sys.executable, evaluate.__file__, '--ckpt',
                          str(tmp_path / 'ck'), '--texts', '-', '--save-predictions',
                          str(tmp_path / 'p.jsonl')], input=b'un frigo\n', env=env,
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    labels = '"labels": ["Électroménager", "Jardin", "Électroménager/Réfrigérateurs"]'
    assert out.stdout.decode('utf-8').startswith('{' + labels + ', "paths": [["Électroménager", '
                                                 '"Réfrigérateurs"], ["Jardin"]], "scores": {')
    assert b'\\u' not in out.stdout
    assert (tmp_path / 'p.jsonl').read_bytes() == (
        '{"labels": ["Électroménager", "Électroménager/Réfrigérateurs", "Jardin"]}\n'.encode())


def test_texts_threshold_is_a_score_above_0_at_its_depth(tmp_path, capsys):
    """Scores in (0, 0.5) are predicted (sigmoid > 0.5), in (-0.5, 0) not: each label's bias
    set so that its score is +-0.25 or +-0.45, in fp32 on the CPU."""
    torch.manual_seed(5)
    model, tok = tiny_model(lhmix.Hierarchy(PARENTS))
    model.eval()
    ids = tok(TEXTS[0], add_special_tokens=False)['input_ids']
    x = torch.tensor([model.prefix + ids + [tok.sep_token_id]])
    want = torch.tensor([0.25, -0.25, 0.45, -0.45, -0.25, 0.25])
    with torch.no_grad():
        raw = model.label_scores(x, torch.ones_like(x), torch.tensor([0]))[0]
        model.label_bias.copy_(want - raw)
    runs.save_checkpoint(tmp_path / 'ck', model, tok, {})
    (tmp_path / 'in.txt').write_text(TEXTS[0] + '\n')
    evaluate.main(['--ckpt', str(tmp_path / 'ck'), '--texts', str(tmp_path / 'in.txt'),
                   '--device', 'cpu'])
    r = json.loads(capsys.readouterr().out)
    assert list(r['scores'].values()) == pytest.approx(want.tolist(), abs=1e-3)
    assert r['labels'] == ['Sci', 'Sci/quantum_physics', 'Sci/quantum_physics/optics']


def test_empty_input_gives_empty_output_and_ctrl_c_one_line(run, tmp_path, monkeypatch, capsys):
    (tmp_path / 'empty.txt').write_text('')
    for path in (str(tmp_path / 'empty.txt'), os.devnull):
        evaluate.main(['--ckpt', str(run / 'best'), '--texts', path, '--device', 'cpu'])
        assert capsys.readouterr() == ('', '')
    (tmp_path / 'in.txt').write_text('\n'.join(TEXTS))
    monkeypatch.setattr(lhmix, 'score_documents', lambda *a, **k: (_ for _ in ()).throw(
        KeyboardInterrupt))  # Ctrl-C while classifying
    with pytest.raises(SystemExit) as e:
        evaluate.main(['--ckpt', str(run / 'best'), '--texts', str(tmp_path / 'in.txt'),
                       '--device', 'cpu'])
    assert e.value.code == 'interrupted' and capsys.readouterr().out == ''
