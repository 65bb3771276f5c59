"""Tests of evaluate.py, by behaviour; expected values worked by hand or computed independently."""
import json
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
import runs  # noqa: E402
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
    test, ev = (json.loads(x.read_text()) for x in (run / runs.TEST_METRICS, e))
    assert ev == {k: test[k] for k in ev}  # test_metrics.json has the run's epoch and args too
    h, splits = data.load_demo()
    pred = [[h.index[v] for v in json.loads(x)['labels']] for x in p.read_text().splitlines()]
    f1 = evaluate.f1_scores(pred, [ls for _, ls in splits['test']], len(h))
    assert (f1['micro_f1'], f1['macro_f1']) == pytest.approx((test['micro_f1'], test['macro_f1']))


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
        ('--out', '{r}/test_metrics.json', "is a train.py run's own file"),
        ('--out', '{r}/metrics.jsonl/e.json', '{r}/metrics.jsonl is a file, not a folder')]],
    (['--ckpt', '{c}', '--data', 'demo', '--out', '{t}'], '{t}: Is a directory'),
    (['--ckpt', '{r}', '--data', 'demo'], '{r}: a run, not a checkpoint: pass {r}/best'),
    (['--ckpt', '{c}', '--texts', '{t}'], '{t}: Is a directory'),
    (['--ckpt', '{c}', '--texts', '{t}/no.txt'], '{t}/no.txt: No such file or directory'),
])
def test_mistakes_end_in_one_error_line(run, tmp_path, monkeypatch, capsys, argv, message):
    for name, text in (('notes.txt', 'keep me'), ('p.jsonl', '{"labels": []}\n'),
                       ('e.json', '{"micro_f1": 0.5, "macro_f1": 0.25}')):
        (tmp_path / name).write_text(text)
    (tmp_path / 'link.json').symlink_to(run / 'best' / runs.WEIGHTS)
    before = tree_state(tmp_path), tree_state(run)
    if argv[4:5] in (['--out'], ['--save-predictions']):
        monkeypatch.setattr(data, 'load_data', lambda *a, **k: pytest.fail('computed first'))
    fill = dict(t=tmp_path, c=run / 'best', r=run)
    msg = error_of(lambda: evaluate.main([a.format(**fill) for a in argv]))
    assert msg.startswith('error: ' + message.format(**fill)), msg
    for argv, message in [(['--data', 'demo', '--texts', '-'], 'give --data (to score a split) '
                           'or --texts (to classify), not both'),
                          (['--data', 'demo', '--out', 'x', '--save-predictions', './x'],
                           '--out and --save-predictions name one file: x')]:
        with pytest.raises(SystemExit) as e:  # argparse's
            evaluate.main(['--ckpt', str(run / 'best'), *argv])
        assert e.value.code == 2 and capsys.readouterr().err.endswith(f'error: {message}\n')
    assert (tree_state(tmp_path), tree_state(run)) == before


def test_broken_pipe_ends_quietly(run, tmp_path):
    (tmp_path / 'in.txt').write_text('\n'.join(TEXTS * 100))  # `evaluate.py ... | head -2`
    p = subprocess.Popen([sys.executable, evaluate.__file__, '--ckpt', str(run / 'best'),
                          '--texts', str(tmp_path / 'in.txt')], stdout=-1, stderr=-1)  # PIPEs
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait() == 1 and 'Error' not in err and 'Exception' not in err, err


# --texts: one JSON line per input line
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
