"""train.py and evaluate.py on a tiny random masked LM of each family that lhmix takes
(lhmix.FAMILIES), saved as a pretrained folder (helpers.family_folder) with a tokenizer of its
kind, on a small depth-3 data set in HiAGM's format (helpers.FAMILY_SPLITS): a run learns, and
evaluate.py repeats its test figures; a run interrupted after its first epoch, then resumed,
repeats the unbroken run; the flat BERT trains and tests."""
import json
import re

import pytest

import evaluate
import lhmix
import runs
import train
from helpers import FAMILY_SPLITS, FAMILY_TAXONOMY, family_folder, read_metrics

TIMING = ('seconds', 'dev_seconds', 'samples_per_s')  # metrics.jsonl's keys that are timings


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    """FAMILY_SPLITS as a HiAGM folder: 12 labels of depth 3; 48, 24 and 24 documents."""
    folder = tmp_path_factory.mktemp('data') / 'mine'
    folder.mkdir()
    (folder / 'mine.taxonomy').write_text('\n'.join(FAMILY_TAXONOMY) + '\n')
    for split, docs in FAMILY_SPLITS.items():
        (folder / f'mine_{split}.json').write_text(''.join(
            json.dumps({'token': text, 'label': [leaf]}) + '\n' for text, leaf in docs))
    return str(folder)


@pytest.fixture(scope='module', params=list(lhmix.FAMILIES))
def family(request, tmp_path_factory, data):
    """A family's folder (--model) and train.py's flags for it: Adam's lr 1e-3, 8 documents a
    step (6 steps an epoch), on the CPU."""
    root = tmp_path_factory.mktemp(request.param)
    model = family_folder(request.param, root / 'model')
    return root, ['--data', data, '--model', model, '--lr', '1e-3', '--batch', '8', '--device',
                  'cpu']


def results(out):
    """A run's metrics lines without timings, and its test figures but the checkpoint's path."""
    with open(out / runs.TEST_METRICS) as f:
        test = json.load(f)
    return [{k: v for k, v in m.items() if k not in TIMING} for m in read_metrics(out)], \
        {k: v for k, v in test.items() if k != 'checkpoint'}


def test_each_family_learns_and_evaluate_repeats_its_test_figures(family, capsys):
    """6 epochs, Mixup by LH-Mix's ratios from the fourth, without the MLM term (which, on a
    random masked LM this small, slows the first epochs): test macro-F1 40 or more (54 to 71
    with torch 2.13 on a CPU; 6 if every document got the commonest label alone). evaluate.py
    on best/ prints the run's test line, and writes its figures, overall, per depth and per
    quartile."""
    root, argv = family
    out = root / 'learns'
    train.main(argv + ['--epochs', '6', '--warmup-epochs', '3', '--no-mlm', '--out', str(out)])
    line = capsys.readouterr().out.splitlines()[-1]
    test = results(out)[1]
    assert [m['mix'] for m in read_metrics(out)] == [False] * 3 + [True] * 3
    assert test['macro_f1'] >= 0.40, line
    evaluate.main(['--ckpt', str(out / 'best'), '--data', argv[1], '--device', 'cpu',
                   '--out', str(root / 'evaluated.json')])
    said = re.search(r'^test: (micro-F1 \S+  macro-F1 \S+)$', capsys.readouterr().out, re.M)
    assert line.startswith(f"test {said[1]}  (best dev epoch {test['best_epoch']}, ")
    assert said[1] == (f"micro-F1 {100 * test['micro_f1']:.2f}  "
                       f"macro-F1 {100 * test['macro_f1']:.2f}")
    with open(root / 'evaluated.json') as f:
        assert json.load(f) == {k: test[k] for k in ('micro_f1', 'macro_f1', 'per_depth',
                                                     'by_frequency')}


def test_each_family_interrupted_after_its_first_epoch_then_resumed_repeats_the_unbroken_run(
        family, monkeypatch):
    """2 epochs, each with Mixup by LH-Mix's ratios and the MLM term; Ctrl-C right after epoch
    0's save, then --resume: the metrics lines (timings aside) and test figures of the unbroken
    run, exactly."""
    root, argv = family
    argv = argv + ['--epochs', '2', '--warmup-epochs', '0']
    train.main(argv + ['--out', str(root / 'unbroken')])
    save = runs.RunFolder.save

    def save_then_interrupt(*args, **kwargs):
        save(*args, **kwargs)
        raise KeyboardInterrupt
    monkeypatch.setattr(runs.RunFolder, 'save', save_then_interrupt)
    with pytest.raises(SystemExit) as e:
        train.main(argv + ['--out', str(root / 'resumed')])
    assert e.value.code == 'interrupted: continue with --resume'
    assert [m['epoch'] for m in read_metrics(root / 'resumed')] == [0]
    monkeypatch.undo()
    train.main(['--data', argv[1], '--device', 'cpu', '--out', str(root / 'resumed'), '--resume'])
    assert [m['mix'] for m in read_metrics(root / 'unbroken')] == [True, True]
    assert results(root / 'resumed') == results(root / 'unbroken')


def test_each_familys_flat_bert_trains_and_tests(family):
    """--arch bert, 3 epochs, Mixup from the second: its loss falls, and its test figures are
    written from its best checkpoint, a flat BERT's."""
    root, argv = family
    out = root / 'flat'
    train.main(argv + ['--arch', 'bert', '--epochs', '3', '--warmup-epochs', '1', '--out',
                       str(out)])
    lines, test = results(out)
    assert [m['mix'] for m in lines] == [False, True, True]
    assert lines[-1]['train_loss'] < lines[0]['train_loss']
    assert test['args']['arch'] == 'bert' and runs.checkpoint_meta(out / 'best')['arch'] == 'bert'
    assert 0 <= test['micro_f1'] <= 1 and len(test['per_depth']) == 3
