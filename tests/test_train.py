"""Tests of train.py: demo runs end to end, a label named by no word-piece, flag and --out errors,
the run folder (--overwrite, --resume, one train.py at a time), interruptions (Ctrl-C, out of
memory, disk full, a kill at any instant), the thread policy and imports that set nothing, CUDA
graphs, the README.
Expected values are computed here (F1 counted by hand) or are an uninterrupted run's; nothing is
downloaded (the `tiny` BERT, the synthetic demo set or files in tmp_path)."""
import ast
import errno
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import data
import evaluate
import lhmix
import runs
import speed
import train
from helpers import (FAST, PARENTS, error_of, is_whole_run, read_metrics, tiny_model, tree_state,
                     write_hiagm, write_lines)

ROOT = Path(__file__).resolve().parent.parent  # the repository
TIMING = ('seconds', 'dev_seconds', 'samples_per_s')
NOTHING_LEARNED = ('error: --epochs {} ended the run at dev macro-F1 0: try a larger --epochs '
                   'or --lr')


def brief_run(argv):
    """train.main(argv) for a run too short to be sure to learn (such as an epoch on FAST's 12
    documents): it may end saying that it learned nothing in its --epochs, and only so."""
    try:
        train.main(argv)
    except SystemExit as e:
        assert e.code == NOTHING_LEARNED.format(argv[argv.index('--epochs') + 1]), e.code


def results(out):
    """A run's metrics lines without timings, and its test figures."""
    with open(os.path.join(out, 'test_metrics.json')) as f:
        test = json.load(f)
    return [{k: v for k, v in m.items() if k not in TIMING} for m in read_metrics(out)], \
        {k: v for k, v in test.items() if k != 'checkpoint'}


def resume(out, *extra):
    train.main(['--data', 'demo', '--device', 'cpu', '--out', str(out), '--resume', *extra])


# End to end on the demo set

@pytest.fixture(scope='module')
def demo_run(tmp_path_factory):
    """One epoch, then --resume up to two; and two epochs in one go."""
    root = tmp_path_factory.mktemp('e2e')
    argv = FAST + ['--warmup-epochs', '1']
    train.main(argv + ['--epochs', '1', '--out', str(root / 'run')])
    first = read_metrics(root / 'run')
    resume(root / 'run', '--epochs', '2')
    train.main(argv + ['--epochs', '2', '--out', str(root / 'straight')])
    return root / 'run', first, root / 'straight'


def test_metrics_and_resume_agree(demo_run):
    out, first, straight = demo_run
    metrics = read_metrics(out)
    assert [m['epoch'] for m in metrics] == [0, 1] and metrics[:1] == first
    assert [m['mix'] for m in metrics] == [False, True]  # one warm-up epoch
    assert all(set(m) == {'epoch', 'mix', 'train_loss', 'dev_micro_f1', 'dev_macro_f1', *TIMING}
               | ({'lambda'} if m['mix'] else set()) for m in metrics)
    for m in metrics:  # FAST's 12 training documents a second, from the unrounded seconds
        assert 12 / (m['seconds'] + 0.005) - 0.05 <= m['samples_per_s'] <= 12 / max(
            m['seconds'] - 0.005, 1e-9) + 0.05
    lam = metrics[1]['lambda']['quantiles']
    assert list(lam) == ['0', '5', '25', '50', '75', '95', '100']  # percent
    assert 0.5 <= lam['0'] <= lam['50'] <= lam['100'] <= 0.75  # Eq. 4 with beta 0.75
    _, test = results(out)
    best = max(m['dev_macro_f1'] for m in metrics)
    assert metrics[test['best_epoch']]['dev_macro_f1'] == best
    _, _, meta = runs.load_checkpoint(str(out / 'last'))
    assert {'table', 'hierarchy_ids', 'labels_at_init'} <= set(meta['extra'])
    assert len(meta['history']) == 2
    assert any(k.startswith('adam.') for k in meta['extra'])
    assert results(out) == results(straight)  # per-epoch random streams
    assert sorted(os.listdir(out)) == ['best', 'last', 'metrics.jsonl', 'test_metrics.json']


@pytest.mark.parametrize('arch, mix, flags', [('bert', 'lhmix', []), ('prompt', 'none', []),
                                              ('prompt', 'mixup', []),
                                              ('prompt', 'lhmix', ['--beta', '0.5'])])
def test_one_epoch_variants_and_dev_f1_by_hand(tmp_path, arch, mix, flags):
    out = tmp_path / 'run'
    train.main(FAST + ['--epochs', '1', '--arch', arch, '--mix', mix, '--out', str(out), *flags])
    line, = read_metrics(out)
    assert line['mix'] == (mix != 'none') and ('lambda' in line) == line['mix']
    if flags:  # Eq. 4 at beta 0.5: lambda = 0.5 for every pair, whatever s
        assert set(line['lambda']['quantiles'].values()) == {0.5}
    model, tok, meta = runs.load_checkpoint(str(out / 'best'))
    assert meta['arch'] == arch and len(model.prefix) == (1 if arch == 'bert' else 2 * 3 + 2)
    _, splits = data.load_demo()
    tokens, _ = lhmix.tokenize(tok, [t for t, _ in splits['dev']], model.text_budget(128))
    pred = lhmix.score_documents(model, tokens) > 0
    # per label tp, fp, fn; F1 = 2 tp / (2 tp + fp + fn), 0 without tp; macro over ALL labels
    counts = np.zeros((len(model.hierarchy), 3))
    for n, (_, gold) in enumerate(splits['dev']):
        for v in range(len(model.hierarchy)):
            counts[v] += [pred[n, v] and v in gold, pred[n, v] and v not in gold,
                          not pred[n, v] and v in gold]
    f1 = [2 * tp / (2 * tp + fp + fn) if tp else 0.0 for tp, fp, fn in counts]
    tp, fp, fn = counts.sum(0)
    assert line['dev_micro_f1'] == pytest.approx(2 * tp / (2 * tp + fp + fn))
    assert line['dev_macro_f1'] == pytest.approx(sum(f1) / len(f1))


def test_an_epochs_train_loss_is_the_mean_of_its_steps_losses(tmp_path, monkeypatch):
    """metrics.jsonl's train_loss: the mean over the epoch's steps of each step's loss (12
    documents in batches of 5: 3 steps), not a mean over documents."""
    losses, step = [], train.train_step

    def recording(*a):
        loss, lam = step(*a)
        losses.append(float(loss))
        return loss, lam
    monkeypatch.setattr(train, 'train_step', recording)
    out = tmp_path / 'run'
    brief_run(FAST + ['--epochs', '1', '--batch', '5', '--out', str(out)])
    assert len(losses) == 3
    assert read_metrics(out)[0]['train_loss'] == pytest.approx(sum(losses) / 3, rel=1e-6)


def test_a_mixup_run_whose_epochs_end_in_its_warm_up_says_mixup_never_starts(tmp_path, capsys):
    """--epochs 1 --warmup-epochs 1: epoch 0 is warm-up, so Mixup never starts (one warning);
    with --epochs 2 it starts in epoch 1, and nothing is said."""
    argv = FAST + ['--warmup-epochs', '1', '--mix', 'mixup']
    train.main(argv + ['--epochs', '1', '--out', str(tmp_path / 'a')])
    warned = [x for x in capsys.readouterr().err.splitlines() if 'Mixup' in x]
    assert warned == ['warning: --epochs 1 <= --warmup-epochs 1: Mixup never starts']
    train.main(argv + ['--epochs', '2', '--out', str(tmp_path / 'b')])
    assert 'never starts' not in capsys.readouterr().err


def test_lhmix_whose_ratios_cannot_spread_says_so_once(tmp_path, capsys, monkeypatch):
    """The tiny model's untrained encoder sees every local hierarchy alike: its ratios sit within
    SPREAD (0.01) of 0.5, and one warning says so. Neither the lambda = 0.5 control (--beta 0.5)
    nor a table whose states differ (random, as a pretrained encoder's would) is warned of."""
    said = ('warning: LH-Mix here mixes every pair at 0.5, because the initial encoder sees the '
            'local hierarchies alike; use a pretrained masked LM')
    brief_run(FAST + ['--epochs', '1', '--out', str(tmp_path / 'a')])
    assert [x for x in capsys.readouterr().err.splitlines() if 'LH-Mix here' in x] == [said]
    brief_run(FAST + ['--epochs', '1', '--beta', '0.5', '--out', str(tmp_path / 'b')])
    assert 'LH-Mix here' not in capsys.readouterr().err
    table = lhmix.local_hierarchy_table
    monkeypatch.setattr(lhmix, 'local_hierarchy_table', lambda *a, **k: (
        lambda t, ids: (torch.randn_like(t), ids))(*table(*a, **k)))
    brief_run(FAST + ['--epochs', '1', '--out', str(tmp_path / 'c')])
    assert 'LH-Mix here' not in capsys.readouterr().err


def test_a_label_named_by_no_word_piece_is_named_in_one_warning_and_the_run_trains(tmp_path):
    """A HiAGM folder whose label x/___ has the name '   ' (underscores read as spaces): one
    warning names it, and only it, when the model is built; the run then trains and is tested
    (its one epoch on two documents learns nothing, and it ends saying so)."""
    folder = write_hiagm(tmp_path / 'data')
    write_lines(folder / 'toy.taxonomy', ['Root\tCCAT\tGCAT', 'CCAT\tC15\tC17', 'C15\tC151',
                                          'GCAT\tx/___'])
    with warnings.catch_warnings(record=True) as caught, pytest.raises(SystemExit) as stop:
        warnings.simplefilter('always')
        train.main(['--data', str(folder), '--model', 'tiny', '--device', 'cpu', '--epochs', '1',
                    '--warmup-epochs', '0', '--out', str(tmp_path / 'run')])
    assert stop.value.code == NOTHING_LEARNED.format(1)
    assert [str(w.message) for w in caught if w.filename == lhmix.__file__] == [
        'labels whose names give only [UNK] start alike and are alike in local hierarchies: '
        "{'x/___': 'its name holds no word'}; rename them (label_names.tsv in the data folder; "
        'Hierarchy(parents, names)) or take a model with their words (--model)']
    assert len(read_metrics(tmp_path / 'run')) == 1 and is_whole_run(tmp_path / 'run')


# What a run draws: its training documents, batches, Mixup partners and ratios, MLM masks

@pytest.mark.parametrize('fraction, kept', [('1e-09', 1), ('0.01', 12), ('0.0101', 13),
                                            ('0.0125', 15), ('0.01251', 16), ('0.07', 84),
                                            ('0.5', 600), ('1', 1200)])
def test_train_fraction_keeps_ceil_of_fraction_times_the_training_documents(fraction, kept):
    """Of the demo's 1200 training documents, ceil(fraction * 1200), worked by hand: 1e-9 keeps
    one, 0.0101 keeps 13 (12.12 up), 0.0125 exactly 15, 0.07 exactly 84 (in floats, 0.07 * 1200
    is 84.00000000000001); dev and test whole."""
    run = train.prepare(*train.parse(['--data', 'demo', '--device', 'cpu', '--train-fraction',
                                      fraction]), None)
    assert [len(run.tokens[s]) for s in ('train', 'dev', 'test')] == [kept, 300, 300]
    assert len(run.gold['train']) == kept


def test_train_fraction_draws_its_documents_with_the_runs_seed():
    """--train-fraction 0.01 --seed 1 keeps the 12 training documents at the first 12 places of
    numpy's default_rng(1) permutation of the demo's 1200, in their order; dev and test whole."""
    _, splits = data.load_demo()
    keep = sorted(np.random.default_rng(1).permutation(1200)[:12].tolist())
    run = train.prepare(*train.parse(['--data', 'demo', '--device', 'cpu', '--train-fraction',
                                      '0.01', '--seed', '1']), None)
    assert run.gold['train'] == [splits['train'][i][1] for i in keep]
    assert run.gold['dev'] == [ls for _, ls in splits['dev']]
    assert data.train_part(list(range(1200)), 0.01, 1) == keep  # in their order, not the draw's


@pytest.mark.parametrize('fraction, err', [
    ('0.01', 'warning: labels in dev or test but in no training document: 8 (optics, genetics, '
     'chemistry, tennis, cycling, ...)\n'), ('1', '')])
def test_labels_in_dev_or_test_but_in_no_training_document_get_one_warning(capsys, fraction, err):
    """The 12 training documents of --train-fraction 0.01 --seed 1 have none of the demo's optics,
    genetics, chemistry, tennis, cycling, jazz, painting and banking, which dev and test have: one
    line says how many, and names the first five in the tree's order. Whole, the training split
    has every label: nothing is said."""
    train.prepare(*train.parse(['--data', 'demo', '--device', 'cpu', '--train-fraction', fraction,
                                '--seed', '1']), None)
    assert capsys.readouterr().err == err


def test_a_label_in_test_alone_is_warned_of_too(capsys, monkeypatch):
    """With the demo's optics documents left out of its training and dev splits, only test has
    optics: the one line names it."""
    h, splits = data.load_demo()
    kept = {s: [d for d in docs if s == 'test' or h.index['optics'] not in d[1]]
            for s, docs in splits.items()}
    monkeypatch.setattr(data, 'load_data', lambda *a: (h, kept))
    train.prepare(*train.parse(['--data', 'demo', '--device', 'cpu']), None)
    assert capsys.readouterr().err == (
        'warning: labels in dev or test but in no training document: 1 (optics)\n')


@pytest.mark.parametrize('arch, budget', [('prompt', 12 - 8 - 1), ('bert', 12 - 1 - 1)])
def test_max_length_cuts_each_text_to_what_fits_beside_the_prefix_and_sep(arch, budget):
    """--max-length 12 on the demo (depth 3, each text longer): a text keeps 12 - 8 - 1 = 3
    word-pieces beside [CLS] [D1] [P] [D2] [P] [D3] [P] [SEP] and the closing [SEP]; BERT's,
    12 - 1 - 1 = 10 beside [CLS] and [SEP]."""
    run = train.prepare(*train.parse(['--data', 'demo', '--device', 'cpu', '--max-length', '12',
                                      '--arch', arch]), None)
    assert max(len(t) for t in run.tokens['test']) == budget


@pytest.fixture(scope='module')
def recorded(tmp_path_factory):
    """Each epoch's steps of real runs, as train.py's step sees them: (batch, lambda, torch's
    random state). Prompt + LH-Mix on a quarter of the demo training split (300 documents, two
    epochs, batch 32, Mixup from the first), Prompt + Mixup and BERT + LH-Mix on FAST's 12."""
    root, step, one_epoch, out = tmp_path_factory.mktemp('recorded'), train.train_step, \
        train.train_epoch, {}
    for name, flags in [('lhmix', ['--train-fraction', '0.25', '--epochs', '2', '--batch', '32']),
                        ('mixup', ['--mix', 'mixup', '--epochs', '1']),
                        ('bert', ['--arch', 'bert', '--epochs', '1'])]:
        epochs = []

        def recording(model, opt, scaler, batch):
            state = torch.get_rng_state()
            loss, lam = step(model, opt, scaler, batch)
            epochs[-1].append((batch, lam, state))
            return loss, lam
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(train, 'train_step', recording)
            mp.setattr(train, 'train_epoch', lambda *a: (epochs.append([]), one_epoch(*a))[1])
            brief_run(FAST + flags + ['--out', str(root / name)])
        out[name] = epochs, root / name
    return out


def test_lhmix_ratios_are_eqs_3_4_of_each_documents_own_local_hierarchy(recorded):
    """Each lambda recomputed in float64 from the batch's own gold labels: the row of the run's
    saved table for its label set (one row per distinct set, each training document's saved row
    given in the batches) and its partner's."""
    epochs, out = recorded['lhmix']
    _, _, meta = runs.load_checkpoint(str(out / 'last'))
    table, ids = meta['extra']['table'].double().numpy(), meta['extra']['hierarchy_ids'].tolist()
    row = {}
    for batch, _, _ in epochs[0]:
        for t, i in zip(batch['targets'].numpy(), batch['hierarchy_ids'].tolist()):
            assert row.setdefault(tuple(np.flatnonzero(t).tolist()), i) == i
    assert sorted(i for b, _, _ in epochs[0] for i in b['hierarchy_ids'].tolist()) == sorted(ids)
    assert sorted(row.values()) == list(range(len(table)))  # one row per distinct label set
    lams = 0
    for batch, lam, _ in (s for e in epochs for s in e):
        sets = [tuple(np.flatnonzero(t).tolist()) for t in batch['targets'].numpy()]
        h = table[[row[k] for k in sets]]
        cos = (h * h[batch['partner']]).sum(1) / (np.linalg.norm(h, axis=1) * np.linalg.norm(
            h[batch['partner']], axis=1))
        s = np.clip(0.5 * (cos + 1), 0, 1)
        np.testing.assert_allclose(lam.numpy(), -(0.75 - 0.5) * s ** 1.0 + 0.75, atol=1e-6)
        lams += len(lam)
    assert lams == 2 * 300


def test_each_epoch_draws_its_own_batches_partners_masks_and_dropout(recorded):
    """Epochs 0 and 1 of one run: other documents in the first batch, other partners, other MLM
    positions, another torch random state (dropout); within an epoch, every training document
    once; about 15% of text word-pieces masked for the MLM term (5 binomial sds)."""
    (first, second), _ = recorded['lhmix']
    for (a, _, ra), (b, _, rb) in [(first[0], second[0])]:
        assert not torch.equal(a['targets'], b['targets']) or not torch.equal(
            a['input_ids'], b['input_ids'])
        assert not torch.equal(a['partner'], b['partner']) or len(a['partner']) < 3
        assert not torch.equal(a['mlm_pos'], b['mlm_pos']) and not torch.equal(ra, rb)
    for epoch in (first, second):
        assert sum(len(b['targets']) for b, _, _ in epoch) == 300
        text = sum(int(b['attention_mask'].sum()) - len(b['targets']) * 9 for b, _, _ in epoch)
        masked = sum(len(b['mlm_pos']) for b, _, _ in epoch)
        assert abs(masked - 0.15 * text) < 5 * math.sqrt(text * 0.15 * 0.85)


def test_vanilla_mixup_ratios_folded_beta_and_no_mlm_for_bert(recorded):
    """--mix mixup: Beta(1, 1) folded to max(lambda, 1 - lambda): uniform on [0.5, 1], a draw
    per document (mean 0.75, sd 0.144); BERT draws no MLM masks (HGCLR's baseline has none)."""
    (epoch,), _ = recorded['mixup']
    lam = torch.cat([lam for _, lam, _ in epoch]).double()
    assert len(lam) == 12 and ((0.5 <= lam) & (lam <= 1)).all() and len(set(lam.tolist())) > 6
    assert abs(lam.mean().item() - 0.75) < 5 * 0.5 / math.sqrt(12 * 12)
    assert all('mlm_pos' in b for b, _, _ in epoch)
    (epoch,), _ = recorded['bert']
    assert epoch and not any('mlm_pos' in b for b, _, _ in epoch)


def test_no_mlm_draws_no_masks_for_the_prompt(tmp_path, monkeypatch):
    """--no-mlm: the prompt model trains without HPT's MLM term, so no batch has masked
    positions (without the flag, every batch of the recorded Prompt + Mixup run has them)."""
    batches, step = [], train.train_step

    def recording(model, opt, scaler, batch):
        batches.append(batch)
        return step(model, opt, scaler, batch)
    monkeypatch.setattr(train, 'train_step', recording)
    brief_run(FAST + ['--no-mlm', '--epochs', '1', '--out', str(tmp_path / 'run')])
    assert len(batches) == 2 and not any('mlm_pos' in b for b in batches)


def test_early_stopping_on_dev_macro_f1_and_best_the_first_of_equals(tmp_path, monkeypatch):
    """Scripted dev figures: macro-F1 0.1, 0.3, 0.2, 0.3, then no better; micro-F1 best at epoch
    2. With --early-stop 2 the run stops after epoch 3 (two epochs without a better macro-F1),
    and best/ is epoch 1: macro-F1's, and the first of two equal ones."""
    macro, micro, line = [0.1, 0.3, 0.2, 0.3, 0.25, 0.9], [0.5, 0.1, 0.9, 0.2, 0.3, 0.3], \
        train.evaluate_dev
    monkeypatch.setattr(train, 'evaluate_dev', lambda run, epoch, *a: {
        **line(run, epoch, *a), 'dev_macro_f1': macro[epoch], 'dev_micro_f1': micro[epoch]})
    out = tmp_path / 'run'
    train.main(FAST + ['--epochs', '6', '--early-stop', '2', '--out', str(out)])
    assert [m['epoch'] for m in read_metrics(out)] == [0, 1, 2, 3]
    _, test = results(out)
    assert test['best_epoch'] == 1 == runs.load_checkpoint(str(out / 'best'))[2]['epoch']


@pytest.mark.parametrize('macro, flags, ended', [
    ([0.0, 0.0, 0.0], ['--epochs', '3'], NOTHING_LEARNED.format(3)),
    ([0.0, 0.0, 0.0, 0.0], ['--epochs', '4', '--early-stop', '2'], 'error: --early-stop 2 '
     'ended the run at dev macro-F1 0: try a larger --early-stop or --lr'),
    ([0.0, 0.0, 1e-9], ['--epochs', '3'], None)])
def test_a_run_whose_best_dev_macro_f1_is_0_ends_in_an_error_naming_the_flags(
        tmp_path, monkeypatch, capsys, macro, flags, ended):
    """Scripted dev macro-F1 0 at each of 3 epochs: the run tests and keeps its record, then ends
    in one error line naming what ended it, --epochs 3 or (with --epochs 4) early stopping after
    two epochs without a better one, and the flags to try (exit 1: sys.exit's message); one epoch
    above 0 (by 1e-9) ends as usual."""
    line = train.evaluate_dev
    monkeypatch.setattr(train, 'evaluate_dev', lambda run, epoch, *a: {
        **line(run, epoch, *a), 'dev_macro_f1': macro[epoch]})
    out = tmp_path / 'run'
    try:
        train.main(FAST + flags + ['--out', str(out)])
        code = None
    except SystemExit as e:
        code = e.code
    assert code == ended
    assert capsys.readouterr().out.splitlines()[-1].startswith('test micro-F1 ')
    assert len(read_metrics(out)) == 3 and results(out)[1]['best_epoch'] == (2 if macro[2] else 0)


# Bad flags, data and models: one error line before anything is written

@pytest.mark.parametrize('flags, message', [
    (['--alpha', '0'], 'argument --alpha: must be > 0, got 0.0'),
    (['--beta', '0.49'], 'argument --beta: must be in [0.5, 1], got 0.49'),
    (['--beta', '1.2'], 'argument --beta: must be in [0.5, 1], got 1.2'),
    (['--lr', 'nan'], 'argument --lr: must be > 0, got nan'),
    (['--lr', 'inf'], 'argument --lr: must be > 0, got inf'),
    (['--mix-alpha', '-1'], 'argument --mix-alpha: must be > 0, got -1.0'),
    (['--train-fraction', '0'], 'argument --train-fraction: must be in (0, 1], got 0.0'),
    (['--train-fraction', '1.5'], 'argument --train-fraction: must be in (0, 1], got 1.5'),
    (['--epochs', '1.5'], "argument --epochs: invalid int value: '1.5'"),
    (['--warmup-epochs', '-1'], 'argument --warmup-epochs: must be >= 0, got -1'),
    (['--epochs', '0'], 'argument --epochs: must be >= 1, got 0'),
    (['--early-stop', '0'], 'argument --early-stop: must be >= 1, got 0'),
    (['--batch', '0'], 'argument --batch: must be >= 1, got 0'),
    (['--seed', '-1'], 'argument --seed: must be in [0, 2^32), got -1'),
    (['--seed', str(2**32)], 'argument --seed: must be in [0, 2^32), got 4294967296'),
    (['--resume', '--overwrite'], '--resume and --overwrite exclude each other'),
    (['--device', 'foo'], 'argument --device: foo: only cpu'),
    (['--device', 'mps'], 'argument --device: mps: only cpu'),
] + ([] if torch.cuda.is_available() else [(['--device', 'cuda'], '(no CUDA GPU here)')]))
def test_flag_errors(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as e:
        train.main(['--data', 'demo', '--out', str(tmp_path / 'out'), *flags])
    assert e.value.code == 2 and message in capsys.readouterr().err.splitlines()[-1]  # argparse's
    assert os.listdir(tmp_path) == []


def test_a_gpu_past_the_last_refused_before_the_data_is_read(tmp_path, monkeypatch, capsys):
    """train.py and evaluate.py --device cuda:N on a machine whose CUDA sees 4 GPUs (as torch
    reports it here): cuda:4 and cuda:7 refused by argparse in one line, cuda:3 taken."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 4)
    monkeypatch.setattr(data, 'load_data', lambda *a, **k: pytest.fail('the data was read'))
    for index in (4, 7):
        for main, argv in ((train.main, ['--out', str(tmp_path / 'out')]),
                           (evaluate.main, ['--ckpt', str(tmp_path / 'ck')])):
            with pytest.raises(SystemExit) as e:
                main(['--data', 'demo', '--device', f'cuda:{index}', *argv])
            assert e.value.code == 2 and capsys.readouterr().err.splitlines()[-1].endswith(
                f'argument --device: cuda:{index}: only cpu, cuda or cuda:N with N < 4')
    for name in ('cuda:3', 'cuda'):
        assert train.parse(['--data', 'demo', '--device', name])[0].device == torch.device(name)
    assert os.listdir(tmp_path) == []


def test_help_shows_each_default_and_range_and_the_tiny_models_own(capsys):
    with pytest.raises(SystemExit):
        train.parse(['-h'])
    help = ' '.join(capsys.readouterr().out.split())
    for flag in ('--beta BETA Eq. 4; 0.5 mixes every pair at 0.5 (in [0.5, 1]; default: 0.75)',
                 "--lr LR Adam's learning rate (> 0; default: 3e-05; --model tiny: 0.001)",
                 '--train-fraction TRAIN_FRACTION a random part of the training split (Fig. 4) '
                 '(in (0, 1]; default: 1.0)', "linear head on [CLS], BCE) (default: prompt)",
                 '--max-length MAX_LENGTH tokens an input (default: 512; --model tiny: 128)',
                 '--early-stop EARLY_STOP epochs without a better dev macro-F1 before a stop '
                 '(>= 1; default: 5; --model tiny: 20)',
                 '--seed SEED the random seed (in [0, 2^32); default: 0)'):
        assert flag in help, help


def test_defaults_are_the_papers_or_else_the_authors_command():
    """Sec. 5.2's bert-base-uncased, learning rate 3e-5, 5 warm-up epochs and early stopping after
    5; where the paper is silent, the authors' README command (alpha 1, beta 0.75, batch 16) and
    HPT's 512 tokens; LH-Mix on the prompt, with HPT's MLM term, on all the training data."""
    args, given = train.parse(['--data', 'wos'])
    assert ((args.model, args.lr, args.warmup_epochs, args.early_stop, args.alpha, args.beta,
             args.batch, args.max_length, args.arch, args.mix, args.no_mlm, args.train_fraction)
            == ('bert-base-uncased', 3e-5, 5, 5, 1.0, 0.75, 16, 512, 'prompt', 'lhmix', False, 1.0))
    assert given.keys() == {'data', 'device'} and not args.resume


@pytest.mark.parametrize('argv, want', [
    (['--data', 'demo'], dict(model='tiny', epochs=12, lr=1e-3, warmup_epochs=4, max_length=128,
                              early_stop=20)),
    (['--data', 'wos', '--model', 'tiny'], dict(model='tiny', epochs=100, lr=1e-3,
                                                warmup_epochs=4, max_length=128, early_stop=20)),
    (['--data', 'demo', '--model', 'm', '--epochs', '3'], dict(
        model='m', epochs=3, lr=3e-5, warmup_epochs=5, max_length=512, early_stop=5)),
    (['--data', 'x', '--model', 'tiny', '--lr', '0.5', '--warmup-epochs', '0', '--early-stop',
      '3'], dict(model='tiny', epochs=100, lr=0.5, warmup_epochs=0, max_length=128,
                 early_stop=3))])
def test_the_tiny_model_and_the_demo_take_their_own_defaults_and_a_given_flag_wins(argv, want):
    """--data demo is --model tiny for 12 epochs; --model tiny learns at 1e-3 after 4 warm-up
    epochs on 128 tokens, and stops after 20 epochs without a better dev macro-F1, not 5; another
    --model takes the paper's defaults, even on the demo."""
    args, _ = train.parse(argv)
    assert {k: getattr(args, k) for k in want} == want


@pytest.mark.parametrize('argv, message', [
    (['--data', '{t}/data', '--model', 'tiny', '--device', 'cpu'],
     '{t}/data/toy_val.json:3: malformed JSON'),
    (['--data', str(ROOT / 'README.md')], f'--data {ROOT}/README.md: not wos, nyt, rcv1, demo or '
     'a folder'),
    (['--data', 'wso'], '--data wso: not wos, nyt, rcv1, demo or a folder'),  # a misspelt name
    (FAST + ['--model', '{t}/nope'], "could not load model '{t}/nope' (not a local folder"),
    (FAST + ['--model', '{run}/best'], "model '{run}/best': "),  # a checkpoint: not pretrained
    (FAST + ['--max-length', '5'], 'max_length 5 leaves -4 text tokens (at most 512 positions)'),
    (FAST + ['--max-length', '513'], 'max_length 513 leaves 504 text tokens (at most 512 '
     'positions)')])
def test_bad_data_and_model_fail_before_writing(base_run, tmp_path, argv, message):
    good = json.dumps({'token': 'x', 'label': ['GCAT']})
    write_hiagm(tmp_path / 'data', val_lines=[good, good, 'not json'])
    fill = dict(t=tmp_path, run=base_run[1])
    argv = [a.format(**fill) for a in argv] + ['--out', str(tmp_path / 'out')]
    assert error_of(lambda: train.main(argv)).startswith('error: ' + message.format(**fill))
    assert sorted(os.listdir(tmp_path)) == ['data']


# --out, --overwrite, --resume: only train.py's own files are ever replaced or deleted

@pytest.fixture(scope='module')
def base_run(tmp_path_factory):
    """--epochs 2, interrupted (Ctrl-C) in epoch 1: last/ holds epoch 0, whose dev macro-F1 is
    logged as -0.5 (below any real one: epoch 1 surely saves best/ again); and the same run
    resumed to its end without a break, the reference for the interruptions below."""
    root = tmp_path_factory.mktemp('base')
    with pytest.MonkeyPatch.context() as mp:
        f1, one_epoch = evaluate.f1_scores, train.train_epoch
        mp.setattr(evaluate, 'f1_scores', lambda *a, **k: {**f1(*a, **k), 'macro_f1': -0.5})

        def interrupt(run, step, graphed, epoch, bar):
            if epoch == 1:
                raise KeyboardInterrupt
            return one_epoch(run, step, graphed, epoch, bar)
        mp.setattr(train, 'train_epoch', interrupt)
        with pytest.raises(SystemExit) as e:
            train.main(FAST + ['--epochs', '2', '--out', str(root / 'run')])
    assert e.value.code == 'interrupted: continue with --resume'
    shutil.copytree(root / 'run', root / 'done')
    resume(root / 'done')  # the run's own --epochs 2
    return root / 'run', root / 'done'


def test_resume_keeps_the_runs_epochs_and_arguments_and_says_so(base_run, tmp_path, capsys):
    run, done = base_run
    assert [m['epoch'] for m in read_metrics(done)] == [0, 1]
    out = shutil.copytree(run, tmp_path / 'run')
    train.main(['--data', 'demo', '--model', 'bert-base-uncased', '--lr', '0.5', '--device', 'cpu',
                '--data-dir', str(tmp_path), '--seed', '3', '--out', str(out) + '/', '--resume'])
    err = capsys.readouterr().err
    assert '--resume: the run keeps its --model tiny (not bert-base-uncased)' in err
    assert '--resume: the run keeps its --lr 0.001 (not 0.5)' in err
    assert '--resume: the run keeps its --seed 0 (not 3)' in err
    assert f'--resume: the run keeps its --data-dir None (not {tmp_path})' in err
    assert results(out) == results(done)
    before = tree_state(out)  # a finished run resumed: said, nothing changed
    resume(out)
    assert f'--resume: {out} is finished (2 epochs); nothing to do' in capsys.readouterr().err
    assert tree_state(out) == before
    resume(out, '--epochs', '1')  # a given --epochs is the run's new end, never an ignored flag
    assert capsys.readouterr().err == f'--resume: {out} is finished (2 epochs); nothing to do\n'
    assert tree_state(out) == before


def make_out(kind, tmp_path, run):
    out = tmp_path / 'out'
    if kind in ('notes', 'look-alike'):  # a user's folder; one that looks like a run
        for name in ('notes.txt',) if kind == 'notes' else (
                'metrics.jsonl', 'best/pytorch_model.bin', 'last/notes.txt'):
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text('mine')
    elif kind in ('file', 'under a file'):
        out.write_text('mine')
    elif kind.startswith('run'):  # with a file train.py did not write
        shutil.copytree(run, out)
        (out / kind[4:]).parent.mkdir(exist_ok=True)
        (out / kind[4:]).write_text('mine')
    elif kind == 'whole .new':  # and an --overwrite's whole first epoch, killed as it replaced
        shutil.copytree(run, out)
        shutil.copytree(run / 'last', out / '.new' / 'last')
        (out / '.new' / 'notes.txt').write_text('mine')
    elif kind in ('a link in .new', '.new, linked out'):
        shutil.copytree(run, out)
        (tmp_path / 'keep').mkdir()
        link = out / '.new' / 'best' if kind == 'a link in .new' else out / '.new'
        link.parent.mkdir(exist_ok=True)
        link.symlink_to(tmp_path / 'keep')
    elif kind in ('locked', 'saved no epoch'):  # another train.py holds it; a killed first save
        shutil.copytree(run, out)
        if kind == 'saved no epoch':
            shutil.rmtree(out / 'last')
    elif kind == 'dangling link':
        out.symlink_to(tmp_path / 'gone')
    elif kind == 'best/ moved out, linked back':  # --overwrite would replace the user's copy
        shutil.copytree(run, out)
        (tmp_path / 'keep').mkdir()
        os.rename(out / 'best', tmp_path / 'keep' / 'mybest')
        (out / 'best').symlink_to(tmp_path / 'keep' / 'mybest')
    return {'under a file': out / 'x', 'the repository': ROOT}.get(kind, out)


OTHER = 'is not a file train.py writes; move it away, or choose another --out'


@pytest.mark.parametrize('kind, flags, message', [
    ('notes', [], '--out {out}: {out}/notes.txt ' + OTHER),
    ('notes', ['--resume'], '--resume: {out} holds no run to continue'),
    *[('look-alike', flags, '--out {out}: {out}/best/pytorch_model.bin ' + OTHER)
      for flags in ([], ['--overwrite'])],
    ('file', ['--overwrite'], '--out {out}: {out} is a file, not a folder'),
    ('under a file', [], '--out {out}: {tmp}/out is a file, not a folder'),
    ('dangling link', [], '--out {out}: a symbolic link to nothing ({tmp}/gone)'),
    ('nothing', ['--resume'], '--resume: {out} holds no run to continue'),
    ('run/e.json', [], '--out {out}: holds an earlier run: continue it (--resume), replace it '
     '(--overwrite), or choose another --out'),
    ('run/e.json', ['--overwrite'], '--out {out}: {out}/e.json ' + OTHER),
    ('run/last/notes.txt', ['--overwrite'], '--out {out}: {out}/last/notes.txt ' + OTHER),
    ('the repository', ['--overwrite'], '--out {out}: {out}/.'),  # .ci, .git, ...
    # a file of the user's where --overwrite writes its first epoch: nothing is finished or
    # deleted around it, whether the epoch there is a part (killed while writing) or whole
    *[(kind, flags, '--out {out}: {out}/.new/notes.txt ' + OTHER)
      for kind in ('run/.new/notes.txt', 'whole .new') for flags in ([], ['--resume'],
                                                                     ['--overwrite'])],
    ('a link in .new', ['--resume'], '--out {out}: {out}/.new/best ' + OTHER),  # a whole epoch's
    # best/ would move through it, a part's be deleted through it
    ('.new, linked out', [], '--out {out}: {out}/.new is a symbolic link (to {tmp}/keep), which '
     'train.py does not follow'),
    ('saved no epoch', [], '--out {out}: holds a run that saved no epoch or is damaged '
     "(FileNotFoundError: [Errno 2] No such file or directory: '{out}/last/model.safetensors'); "
     'replace it with --overwrite, or choose another --out'),
    ('saved no epoch', ['--resume'], '--resume: {out} holds no run to continue'),
    *[('locked', flags, '--out {out}: another train.py is using it; let it end, or '
       'choose another --out') for flags in ([], ['--resume'], ['--overwrite'])],
    *[('best/ moved out, linked back', flags, '--out {out}: {out}/best is a symbolic link (to '
       '{tmp}/keep/mybest), which train.py does not follow: put what it names in its place, or '
       'choose another --out')
      for flags in ([], ['--resume'], ['--overwrite'])],
])
def test_out_refused_before_computing_anything(base_run, tmp_path, monkeypatch, kind, flags,
                                               message):
    out = make_out(kind, tmp_path, base_run[1])
    watched = [tmp_path, os.path.join(ROOT, '.git', 'HEAD')]  # the repository: its .git too
    before = [tree_state(p) for p in watched]
    monkeypatch.setattr(data, 'load_data', lambda *a, **k: pytest.fail('computed before checking'))
    held = kind == 'locked' and runs.RunFolder(str(out), resume=True)  # as another train.py
    msg = error_of(lambda: train.main(FAST + ['--out', str(out), *flags]))
    assert msg.startswith('error: ' + message.format(out=out, tmp=tmp_path)), msg
    assert [tree_state(p) for p in watched] == before
    if held:  # and once that one has ended, the run continues
        held.__exit__(None)
        monkeypatch.undo()
        resume(out)


UNWRITABLE = """import json, sys
import data, evaluate, train
data.load_data = lambda *a, **k: sys.exit('the data was read')  # and epochs may follow
for script, argv in json.loads(sys.argv[1]):
    try:
        (train if script == 'train' else evaluate).main(argv)
    except SystemExit as e:
        print(e.code)
"""


@pytest.mark.skipif(os.geteuid() == 0 and not shutil.which('setpriv'), reason='running as root '
                    'without setpriv: root writes in read-only folders, nothing would be refused')
def test_unwritable_outputs_refused_before_the_data_is_read(base_run, tmp_path):
    """As a user who may not write there (root: without the capabilities that override
    permissions): train.py --out in a read-only folder or as one, --resume and --overwrite of a
    read-only run or of one whose best/ is read-only, evaluate.py --out in a read-only folder.
    Each is refused in one line naming the path, before the data is read (so no epoch ran)."""
    ro, run, best = tmp_path / 'ro', tmp_path / 'run', tmp_path / 'best_ro'
    ro.mkdir(mode=0o555)
    for out in (run, best):
        shutil.copytree(base_run[1], out)
    for folder in (run, run / 'best', run / 'last', best / 'best'):
        folder.chmod(0o555)
    before = tree_state(tmp_path)
    cases = [('train', FAST + ['--out', ro / 'run'], f'{ro}/run: {ro} is not writable'),
             ('train', FAST + ['--out', ro], f'{ro}: {ro} is not writable'),
             ('train', ['--data', 'demo', '--device', 'cpu', '--out', run, '--resume', '--epochs',
                        '5'], f'{run}: {run} is not writable'),
             ('train', FAST + ['--out', run, '--overwrite'], f'{run}: {run} is not writable'),
             ('train', FAST + ['--out', best, '--overwrite'], f'{best}: {best}/best is not '
              'writable'),
             ('evaluate', ['--ckpt', base_run[1] / 'best', '--data', 'demo', '--out',
                           ro / 'e.json'], f'{ro}/e.json: {ro} is not writable')]
    drop = ['setpriv', '--inh-caps=-all', '--bounding-set=-all'] if os.geteuid() == 0 else []
    p = subprocess.run(drop + [sys.executable, '-c', UNWRITABLE, json.dumps(
        [(script, list(map(str, argv))) for script, argv, _ in cases])], capture_output=True,
        text=True, cwd=ROOT, env={**os.environ, 'HF_HUB_OFFLINE': '1'})
    assert p.stdout.splitlines() == [f'error: --out {m}' for _, _, m in cases], p.stderr[-2000:]
    assert tree_state(tmp_path) == before


def test_out_as_given_a_link_a_trailing_slash_or_the_folder_one_is_in(base_run, tmp_path,
                                                                     monkeypatch):
    (tmp_path / 'empty').mkdir()
    (tmp_path / 'link').symlink_to(tmp_path / 'empty')
    train.main(FAST + ['--epochs', '1', '--out', str(tmp_path / 'link')])
    assert (tmp_path / 'link').is_symlink() and is_whole_run(tmp_path / 'empty')
    train.main(FAST + ['--epochs', '1', '--out', str(tmp_path / 'new') + '/'])
    train.main(FAST + ['--epochs', '1', '--mix', 'none', '--overwrite', '--out',
                       str(tmp_path / 'new') + '/'])
    assert [m['mix'] for m in read_metrics(tmp_path / 'new')] == [False]
    shutil.copytree(base_run[0], tmp_path / 'run')
    monkeypatch.chdir(tmp_path / 'run')
    train.main(['--data', 'demo', '--device', 'cpu', '--out', '.', '--resume'])
    assert results(tmp_path / 'run') == results(base_run[1])
    assert sorted(os.listdir(tmp_path)) == ['empty', 'link', 'new', 'run']


def test_overwrite_replaces_a_run_only_once_the_new_has_an_epoch(base_run, tmp_path, monkeypatch):
    out = shutil.copytree(base_run[1], tmp_path / 'run')
    before = tree_state(out)
    loss = lhmix.training_loss
    with monkeypatch.context() as mp:  # the new run fails in its first epoch: the old one stays
        mp.setattr(lhmix, 'training_loss',
                   lambda *a, **k: (loss(*a, **k)[0] * float('nan'), None))
        msg = error_of(lambda: train.main(FAST + ['--out', str(out), '--overwrite']))
    assert 'the training loss (nan) became infinite or NaN in epoch 0' in msg and 'not saved' in msg
    assert tree_state(out) == before and os.listdir(tmp_path) == ['run']
    train.main(FAST + ['--epochs', '1', '--out', str(out), '--overwrite', '--mix', 'none'])
    assert os.listdir(tmp_path) == ['run'] and is_whole_run(out)
    assert [m['mix'] for m in read_metrics(out)] == [False]


def evaluates_as_it_did(out, tmp_path):
    """The run's best/ scores the demo's test split (evaluate.py, as a user would) with the
    figures of its own test_metrics.json."""
    figures = tmp_path / 'figures.json'
    evaluate.main(['--ckpt', str(out / 'best'), '--data', 'demo', '--device', 'cpu', '--out',
                   str(figures)])
    got, want = (json.loads(p.read_text()) for p in (figures, out / runs.TEST_METRICS))
    os.remove(figures)
    return all(got[k] == want[k] for k in ('micro_f1', 'macro_f1', 'per_depth', 'by_frequency'))


def test_overwrite_whose_first_save_fails_on_a_full_disk_keeps_the_earlier_run(base_run, tmp_path,
                                                                                monkeypatch):
    """The disk fills while --overwrite writes its first epoch beside the earlier run (the last
    file fails): one line says so and that the earlier run is kept, which is there byte for byte
    and evaluates with its own figures."""
    out = shutil.copytree(base_run[1], tmp_path / 'run')
    before, replace = tree_state(out), os.replace
    with monkeypatch.context() as mp:
        mp.setattr(os, 'replace', lambda src, dst: (_ for _ in ()).throw(
            OSError(errno.ENOSPC, 'No space left on device')) if str(dst).endswith(
            'last/model.safetensors') else replace(src, dst))
        assert error_of(lambda: train.main(FAST + ['--out', str(out), '--overwrite'])) == (
            f'error: {out}/.new/last/model.safetensors: No space left on device; the earlier '
            f'run in {out} is kept')
    assert tree_state(out) == before and evaluates_as_it_did(out, tmp_path)


def test_overwrite_killed_at_any_point_of_its_first_save_leaves_one_whole_run(base_run, tmp_path,
                                                                               monkeypatch):
    """A kill at any instant of --overwrite's first save, taken as the files stand just before
    each rename or deletion in the run folder (copied aside, as a SIGKILL would leave them): until
    the new epoch is whole in .new (its last/ weights there), the earlier run is there byte for
    byte and evaluates with its own figures, and the next train.py deletes .new; once it is
    whole, the next train.py finishes the replacement, and the new run continues."""
    out = shutil.copytree(base_run[1], tmp_path / 'run')
    before, real, kills = tree_state(out), os.path.realpath(out), []

    def kill_point(call):
        def at(path, *a, **k):
            if str(path).startswith(real + os.sep):
                kills.append(shutil.copytree(real, tmp_path / f'kill{len(kills)}'))
            return call(path, *a, **k)
        return at
    with monkeypatch.context() as mp:
        for name in ('replace', 'rename', 'remove', 'unlink', 'rmdir'):
            mp.setattr(os, name, kill_point(getattr(os, name)))
        train.main(FAST + ['--epochs', '1', '--out', str(out), '--overwrite'])
    assert [m['epoch'] for m in read_metrics(out)] == [0] and is_whole_run(out)
    earlier = []
    for k in kills:
        top = {n: v for n, v in tree_state(k).items() if n.split(os.sep)[0] != '.new'}
        runs.settle(str(k))  # what the next train.py on the folder does first
        earlier.append(tree_state(k) == before)
        if earlier[-1]:  # the earlier run was whole beside .new all along
            assert top == before
        else:
            assert not (k / '.new').exists() and [m['epoch'] for m in read_metrics(k)] == [0]
            assert [h['epoch'] for h in runs.load_checkpoint(str(k / 'last'))[2]['history']] == [0]
            runs.load_checkpoint(str(k / 'best'))
    # the nine renames that write the new epoch into .new, then its replacing the earlier run
    assert earlier == [True] * 9 + [False] * (len(kills) - 9) and len(kills) > 20
    assert evaluates_as_it_did(kills[0], tmp_path)


def test_overwrite_replaces_a_damaged_run_saying_what_was_damaged(base_run, tmp_path, capsys):
    out = shutil.copytree(base_run[1], tmp_path / 'run')
    os.truncate(out / 'last' / runs.WEIGHTS, 100)
    before = tree_state(out)
    assert 'holds a run that saved no epoch or is damaged (SafetensorError' in error_of(
        lambda: train.main(FAST + ['--out', str(out)]))
    assert tree_state(out) == before
    train.main(FAST + ['--epochs', '1', '--out', str(out), '--overwrite'])
    assert capsys.readouterr().err.startswith(f'--overwrite: {out} holds a run that saved no '
                                              'epoch or is damaged (SafetensorError')
    assert is_whole_run(out) and len(read_metrics(out)) == 1


def test_overwrite_and_a_failed_save_leave_no_temporary_files(base_run, tmp_path, monkeypatch):
    """In a run where killed saves left temporary files (planted here): --overwrite interrupted
    once its epoch is saved (Ctrl-C while the test split is scored), and --resume whose save
    fails at its last rename (disk full), leave only train.py's files, listed here by hand."""
    checkpoint = ['config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json']
    saved = sorted([f'{c}/{f}' for c in ('best', 'last') for f in checkpoint] + ['metrics.jsonl'])

    def with_leftovers(name):  # epoch 0 saved, then Ctrl-C
        out = shutil.copytree(base_run[0], tmp_path / name)
        for f in ('.test_metrics.json.tmp', 'best/.model.safetensors.tmp', 'last/.config.json.tmp'):
            (out / f).write_text('half written')
        return out

    def files(out):
        return sorted(os.path.relpath(os.path.join(r, f), out) for r, _, fs in os.walk(out)
                      for f in fs)
    out = with_leftovers('overwritten')
    with monkeypatch.context() as mp:
        mp.setattr(runs, 'load_checkpoint', _raise(KeyboardInterrupt()))
        with pytest.raises(SystemExit) as e:
            train.main(FAST + ['--epochs', '1', '--out', str(out), '--overwrite'])
    assert e.value.code == 'interrupted: continue with --resume' and files(out) == saved
    out, replace = with_leftovers('resumed'), os.replace
    monkeypatch.setattr(os, 'replace', lambda src, dst: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, 'No space left on device')) if str(dst).endswith(
        'last/model.safetensors') else replace(src, dst))
    assert error_of(lambda: resume(out)) == (f'error: {out}/last/model.safetensors: No space '
                                             'left on device')
    assert files(out) == saved  # best/ and metrics.jsonl of epoch 1 saved, not last/


RACE = [sys.executable, str(ROOT / 'train.py'), *FAST, '--epochs', '2']  # seeds 1, 2 learn


def test_two_runs_started_at_once_on_one_folder_one_trains(base_run, tmp_path):
    """Pairs started at once on one folder (new and new, --resume and --resume, --overwrite and
    new): exactly one of each trains; the other is refused at once, in one line naming the
    folder; the folder's figures and best/ are those of the one that ran (told apart by their
    seeds; --resume keeps the run's own, 0). But for one outcome: the new run beside --overwrite
    may hold the lock just while it refuses the earlier run, and --overwrite is then refused by
    the lock: both end, and the earlier run stays as it was."""
    env = {**os.environ, 'HF_HUB_OFFLINE': '1', 'OMP_NUM_THREADS': '1'}  # a core each
    for n, (first, second) in enumerate([([], []), (['--resume'], ['--resume']),
                                         (['--overwrite'], [])]):
        out, want = tmp_path / f'run{n}', 0 if n == 1 else None
        if first:
            shutil.copytree(base_run[0], out)
            before = tree_state(out)
        pair = [subprocess.Popen(RACE + ['--seed', str(seed), '--out', str(out), *flags],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                for seed, flags in ((1, first), (2, second))]
        done = [(p.wait(timeout=300), p.stdout.read(), p.stderr.read()) for p in pair]
        trained = [(s, d) for s, d in zip((1, 2), done) if 'test micro-F1' in d[1]]
        if n == 2 and not trained:
            assert [(rc, err.splitlines()[-1]) for rc, _, err in done] == [
                (1, f'error: --out {out}: another train.py is using it; let it end, or '
                    'choose another --out'),
                (1, f'error: --out {out}: holds an earlier run: continue it (--resume), '
                    'replace it (--overwrite), or choose another --out')], done
            assert tree_state(out) == before
            continue
        assert len(trained) == 1 and trained[0][1][0] == 0, done
        (seed, (_, won, _)), = trained
        rc, lost, err = next(d for d in done if d[1] != won)
        # A process that starts only once the other has ended finds its run: a new run beside
        # --overwrite finds the earlier one, a second --resume the finished one.
        assert (rc, err.splitlines()[-1]) in (
            (1, f'error: --out {out}: another train.py is using it; let it end, or '
                'choose another --out'),
            (1, f'error: --out {out}: holds an earlier run: continue it (--resume), replace '
                'it (--overwrite), or choose another --out'),
            (0, f'--resume: {out} is finished (2 epochs); nothing to do')), done
        assert 'epoch' not in lost
        test = json.loads((out / runs.TEST_METRICS).read_text())
        best = runs.load_checkpoint(str(out / 'best'))[2]
        assert test['args']['seed'] == best['args']['seed'] == (seed if want is None else want)
        assert f"test micro-F1 {100 * test['micro_f1']:.2f}" in won


def test_a_kill_at_a_random_instant_never_leaves_a_lock(base_run, tmp_path):
    """SIGKILL at a random instant of a new run and of a --resume; then --resume is never refused
    for a lock, and either continues a loadable last/ or finds no run (killed before its first
    save); the leftovers of a kill inside a save are removed by --resume."""
    rng, env = np.random.default_rng(), {**os.environ, 'HF_HUB_OFFLINE': '1',
                                         'OMP_NUM_THREADS': '1'}
    shutil.copytree(base_run[0], tmp_path / 'run1')
    procs = [subprocess.Popen(RACE + ['--out', str(tmp_path / f'run{n}')] + ['--resume'] * n,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
             for n in (0, 1)]
    time.sleep(rng.uniform(0, 6))  # both killed at one random instant, if still running
    for p in procs:
        p.kill()
        p.wait()
    procs = [subprocess.Popen(RACE + ['--out', str(tmp_path / f'run{n}'), '--resume'], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for n in (0, 1)]
    for n, p in enumerate(procs):
        err = p.stderr.read()
        assert 'another train.py' not in err
        assert p.wait() == 0 or 'holds no run to continue' in err, err[-2000:]
        if p.returncode == 0:
            assert is_whole_run(tmp_path / f'run{n}')


def _one_less(split):
    def damage(last, mp):
        load = data.load_data
        mp.setattr(data, 'load_data', lambda *a, **k: (lambda h, s: (h, {
            **s, split: s[split][:-1]}))(*load(*a, **k)))
    return damage


def _renamed(last, mp):  # the same labels and documents, one label named otherwise
    load = data.load_data

    def renamed(*a, **k):
        h, splits = load(*a, **k)
        h.names[0] += ' again'
        return h, splits
    mp.setattr(data, 'load_data', renamed)


@pytest.mark.parametrize('damage, message', [
    *[(_one_less(s), 'error: --resume: the labels, label names or documents of --data demo '
                     "differ from the run's; start a new run") for s in ('dev', 'test')],
    (_renamed, "error: --resume: the labels, label names or documents of --data demo differ"),
    (lambda last, mp: (last / 'model.safetensors').write_bytes(
        (last / 'model.safetensors').read_bytes()[:1000]), 'truncated or corrupt'),
    (lambda last, mp: os.remove(last / 'tokenizer.json'),
     'not an LH-Mix checkpoint (no tokenizer.json)')])
def test_resume_refuses_changed_data_or_a_damaged_checkpoint(base_run, tmp_path, monkeypatch,
                                                             damage, message):
    out = shutil.copytree(base_run[0], tmp_path / 'run')
    damage(out / 'last', monkeypatch)
    before = tree_state(out)
    assert message in error_of(lambda: resume(out))
    assert tree_state(out) == before


# Interruptions and failures: one line, nothing half-written, --resume gives the same result

def _raise(exc):
    return lambda *a, **k: (_ for _ in ()).throw(exc)


def _nan_weights(mp):  # a finite loss, but the epoch ends with NaN weights
    one_epoch = train.train_epoch

    def poisoned(run, *a, **k):
        out = one_epoch(run, *a, **k)
        with torch.no_grad():
            next(run.model.parameters()).view(-1)[0] = float('nan')
        return out
    mp.setattr(train, 'train_epoch', poisoned)


def _disk_full(mp):  # as a full disk fails a write, or the fsync that flushes it
    def fsync(fd):
        raise OSError(errno.ENOSPC, 'No space left on device')
    mp.setattr(os, 'fsync', fsync)


@pytest.mark.parametrize('setup, fresh, resumed', [
    (lambda mp: mp.setattr(lhmix, 'make_batch', _raise(KeyboardInterrupt())),
     'interrupted before the first epoch was saved; nothing is kept',
     'interrupted: continue with --resume'),
    (lambda mp: mp.setattr(lhmix, 'make_batch', _raise(torch.OutOfMemoryError('CUDA OOM'))),
     'error: out of GPU memory; try a smaller --batch', None),
    (_nan_weights, 'error: the weights became infinite or NaN in epoch 0 (try a lower --lr); this '
     'epoch is not saved', None),
    (_disk_full, 'error: {out}/best/tokenizer.json: No space left on device',  # the first file
     'error: {out}/best/model.safetensors: No space left on device')])
def test_failure_leaves_every_file_as_it_was(base_run, tmp_path, monkeypatch, setup, fresh,
                                             resumed):
    """A new run, --overwrite and --resume fail: nothing of theirs is left, and the earlier run is
    as it was (--overwrite writes its first epoch beside it, and a full disk stops that)."""
    out = shutil.copytree(base_run[0], tmp_path / 'run')
    before = tree_state(tmp_path)
    with monkeypatch.context() as mp:
        setup(mp)
        for argv, message in [(FAST + ['--out', str(tmp_path / 'new')], fresh),
                              (['--overwrite', '--out', str(out), *FAST], fresh),
                              (['--data', 'demo', '--device', 'cpu', '--out', str(out),
                                '--resume'], resumed or fresh)]:
            with pytest.raises(SystemExit) as e:
                train.main(argv)
            if setup is _disk_full and '--overwrite' in argv:  # the earlier run stays
                message = ('error: {out}/.new/best/tokenizer.json: No space left on device; the '
                           'earlier run in {out} is kept')
            assert e.value.code == message.format(out=argv[argv.index('--out') + 1]).replace(
                'epoch 0', 'epoch 1' if '--resume' in argv else 'epoch 0')
            assert tree_state(tmp_path) == before
    if resumed:  # and --resume then gives the uninterrupted result
        resume(out)
        assert results(out) == results(base_run[1])


WRAPPER = """import os, signal, sys
sys.path.insert(0, {root!r})
calls, replace, rename = [0], os.replace, os.rename
def kill_at(real):
    def call(src, dst, **k):  # SIGKILL instead of the Nth rename into the run's folder (others,
        # such as a GPU library's cache, do not count): the files as they are at that instant
        calls[0] += str(dst).startswith(os.environ['WATCH'])
        if calls[0] == int(os.environ['KILL_AT']):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(src, dst, **k)
    return call
os.replace, os.rename = kill_at(replace), kill_at(rename)
import train
train.main(sys.argv[1:])
"""


def test_a_kill_at_any_rename_leaves_loadable_checkpoints_and_the_next_run_cleans_up(base_run,
                                                                                      tmp_path):
    """--resume killed at its 2nd and 4th rename (best/ replaced, metrics.jsonl and last/ not; all
    but the test figures): --resume then gives the uninterrupted result. --overwrite killed at its
    3rd rename (its first epoch still partly in .new: --resume continues the earlier run, with the
    uninterrupted result), its 11th (the whole first epoch replacing the earlier run: --resume
    finishes that and continues the new run) and its 14th (in the second epoch's save: --resume
    continues). The leftovers of the killed saves are gone."""
    # as many threads as this process: the uninterrupted run it is compared with, bit for bit
    env = {**os.environ, 'OMP_NUM_THREADS': str(torch.get_num_threads()), 'HF_HUB_OFFLINE': '1'}
    cases = [('resume', 2), ('resume', 4), ('overwrite', 3), ('overwrite', 11), ('overwrite', 14)]
    procs = []
    for how, n in cases:
        out = shutil.copytree(base_run[0], tmp_path / f'{how}{n}' / 'run')
        argv = ['--data', 'demo', '--device', 'cpu', '--out', str(out), '--resume'] if how == \
            'resume' else FAST + ['--epochs', '2', '--seed', '1', '--out', str(out), '--overwrite']
        procs.append(subprocess.Popen([sys.executable, '-c', WRAPPER.format(root=str(ROOT)), *argv],
                                      env={**env, 'KILL_AT': str(n),
                                           'WATCH': os.path.realpath(out.parent)},
                                      stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, cwd=tmp_path))
        if len(procs) % 2 == 0 or len(procs) == len(cases):  # two at a time
            [p.wait(timeout=300) for p in procs[-2:]]
    for (how, n), p in zip(cases, procs):
        out = tmp_path / f'{how}{n}' / 'run'
        assert p.returncode == -signal.SIGKILL, p.stderr.read().decode()
        assert (n == 11) != any(name.endswith('.tmp') for _, _, fs in os.walk(out) for name in fs)
        if n != 11:
            for name in ('best', 'last'):
                runs.load_checkpoint(str(out / name))
        resume(out)
        if how == 'resume' or n == 3:
            assert results(out) == results(base_run[1])
        else:
            assert results(out)[1]['args']['seed'] == 1  # the new run's
        assert os.listdir(out.parent) == ['run'] and is_whole_run(out)
        assert [m['epoch'] for m in read_metrics(out)] == [0, 1]


# The thread policy, only where train.py runs as a script; importing our modules sets nothing

POLICY = """import contextlib, importlib, io, json, os, runpy, sys
changed = {}
for name in ('lhmix', 'data', 'runs', 'evaluate', 'train', 'tools.summary', 'tools.claims',
             'tools.plot', 'tools.similar', 'tools.bench', 'tools.paper'):
    before = dict(os.environ)
    importlib.import_module(name)
    changed[name] = sorted(k for k in before.keys() | os.environ.keys()
                           if before.get(k) != os.environ.get(k))
policy = []
for given in json.loads(sys.argv[1]):  # the user's own settings
    for k in ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT'):
        os.environ.pop(k, None)
    os.environ.update(given)
    sys.argv = ['train.py', '-h']
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        runpy.run_path('train.py', run_name='__main__')
    policy.append({k: os.environ.get(k) for k in ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT')})
print(json.dumps([changed, policy]))
"""


def test_thread_policy_gives_way_to_the_users_and_imports_change_no_environment():
    """In a process whose environment has neither variable: importing lhmix, data, runs, evaluate,
    train and each tool changes no environment variable. train.py run as a script sets
    GOMP_SPINCOUNT=1000 (OpenMP threads spin briefly, then sleep) where the user set neither
    OMP_WAIT_POLICY nor GOMP_SPINCOUNT, and otherwise leaves the user's setting as it is."""
    cases = [{}, {'OMP_WAIT_POLICY': 'ACTIVE'}, {'GOMP_SPINCOUNT': '5'},
             {'OMP_WAIT_POLICY': 'PASSIVE', 'GOMP_SPINCOUNT': '0'}]
    env = {k: v for k, v in os.environ.items() if k not in ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT')}
    p = subprocess.run([sys.executable, '-c', POLICY, json.dumps(cases)], capture_output=True,
                       text=True, cwd=ROOT, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    changed, policy = json.loads(p.stdout.splitlines()[-1])
    assert changed == {name: [] for name in changed} and len(changed) == 11, changed
    assert policy == [{'OMP_WAIT_POLICY': None, 'GOMP_SPINCOUNT': '1000'},
                      {'OMP_WAIT_POLICY': 'ACTIVE', 'GOMP_SPINCOUNT': None},
                      {'OMP_WAIT_POLICY': None, 'GOMP_SPINCOUNT': '5'},
                      {'OMP_WAIT_POLICY': 'PASSIVE', 'GOMP_SPINCOUNT': '0'}]


# One step: a weight that a step leaves unused still moves by Adam's momentum, as with gradient 0

def test_a_weight_a_step_leaves_unused_moves_as_with_gradient_0():
    """The MLM head's bias gets a gradient only from a batch with masked text. After a step on
    one, a step on a batch without moves it by Adam's update for gradient 0, by hand in float64:
    m = b1 m, v = b2 v, then -lr m^ / (sqrt(v^) + eps), so eager and graphed steps agree."""
    torch.manual_seed(0)
    model, _ = tiny_model(lhmix.Hierarchy(PARENTS))
    opt, scaler = speed.make_optimizer(model, 1e-3, capturable=False)
    assert not opt.defaults['fused'] and not scaler.is_enabled()  # the CPU's: plain Adam, no scale
    docs = [np.arange(5, 25), np.arange(7, 19)]
    bias = model.mlm.get_output_embeddings().bias
    train.train_step(model, opt, scaler, lhmix.make_batch(
        model, docs, [[0], [1]], np.random.default_rng(0), mlm_rate=0.5))
    g, b1 = bias.grad.double().clone(), bias.detach().double().clone()
    assert g.abs().max() > 0
    train.train_step(model, opt, scaler, lhmix.make_batch(model, docs, [[0], [1]]))
    (beta1, beta2), eps, lr = opt.defaults['betas'], opt.defaults['eps'], 1e-3
    m, v = beta1 * (1 - beta1) * g, beta2 * (1 - beta2) * g ** 2
    want = b1 - lr * (m / (1 - beta1 ** 2)) / ((v / (1 - beta2 ** 2)).sqrt() + eps)
    torch.testing.assert_close(bias.detach().double(), want, rtol=1e-5, atol=1e-7)
    assert not torch.equal(bias.detach().double(), b1)


def test_a_weight_first_used_by_the_second_step_moves_as_adam_after_a_zero_gradient():
    """make_optimizer gives every weight a gradient before the first step. The MLM head's bias
    is left unused by a first batch without masked text and used by a second: Adam has then seen
    it twice, first with gradient 0 (no move), so its second update is, by hand in float64,
    m = (1 - b1) g, v = (1 - b2) g^2, w - lr m^ / (sqrt(v^) + eps) with corrections for step 2;
    had Adam skipped the first step, the update would be about lr, corrected for step 1."""
    torch.manual_seed(0)
    model, _ = tiny_model(lhmix.Hierarchy(PARENTS))
    opt, scaler = speed.make_optimizer(model, 1e-3, capturable=False)
    docs = [np.arange(5, 25), np.arange(7, 19)]
    bias = model.mlm.get_output_embeddings().bias
    b0 = bias.detach().double().clone()
    train.train_step(model, opt, scaler, lhmix.make_batch(model, docs, [[0], [1]]))
    assert torch.equal(bias.detach().double(), b0)
    train.train_step(model, opt, scaler, lhmix.make_batch(
        model, docs, [[0], [1]], np.random.default_rng(0), mlm_rate=0.5))
    g = bias.grad.double()
    (beta1, beta2), eps, lr = opt.defaults['betas'], opt.defaults['eps'], 1e-3
    m, v = (1 - beta1) * g, (1 - beta2) * g ** 2
    want = b0 - lr * (m / (1 - beta1 ** 2)) / ((v / (1 - beta2 ** 2)).sqrt() + eps)
    assert g.abs().max() > 0
    torch.testing.assert_close(bias.detach().double(), want, rtol=1e-5, atol=1e-8)


# The README's Python examples run as written

def readme_blocks(alone):
    """The README's Python blocks that run with lhmix.py alone, or those run from the repository."""
    blocks = re.findall(r'```python\n(.*?)```', (ROOT / 'README.md').read_text('utf-8'), re.S)
    return [b for b in blocks if ('import torch, transformers, lhmix\n' in b) == alone]


def test_readme_examples_run_as_written(demo_run, tmp_path, monkeypatch, capsys):
    """The quick start's demo run as out/ beside the examples: a demo run's best/ whose label
    biases (+-20, far beyond its scores) predict science, physics, optics, arts and no other."""
    model, tok, _ = runs.load_checkpoint(str(demo_run[0] / 'best'))
    with torch.no_grad():
        model.label_bias.fill_(-20.0)
        model.label_bias[[model.hierarchy.index[v] for v in ('science', 'physics', 'optics',
                                                             'arts')]] = 20.0
    runs.save_checkpoint(str(tmp_path / 'out' / 'demo-prompt-lhmix-s0' / 'best'), model, tok, {})
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    blocks = readme_blocks(alone=False)
    for block in blocks:
        exec(block, {})
    paths = capsys.readouterr().out.strip()
    # a path per predicted label with no predicted descendant, names from the root
    # (data.DEMO_LEAVES)
    assert eval(paths) == [['science', 'physics', 'optics'], ['arts']]
    assert len(blocks) == 1


def test_readme_example_trains_and_predicts_with_a_copy_of_lhmix_alone(tmp_path):
    """The block for other projects, run in a folder that holds only lhmix.py, where none of this
    project's other modules can be imported: ten warm-up steps, five with LH-Mix's ratios, then
    predictions; it prints what the README shows it prints: each text its own path, the ratios
    of an untrained encoder 0.5 (the loss to its second decimal, which versions may move)."""
    block, = readme_blocks(alone=True)
    imported = {a.name for node in ast.walk(ast.parse(block))
                if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
    assert imported == {'torch', 'transformers', 'lhmix'}
    shutil.copy(ROOT / 'lhmix.py', tmp_path)
    (tmp_path / 'example.py').write_text(block, 'utf-8')
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    out = subprocess.run([sys.executable, 'example.py'], cwd=tmp_path, env=env, text=True,
                         capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr
    readme = (ROOT / 'README.md').read_text('utf-8')
    shown = re.search(r'It prints [^\n]*\n\n```\n(.*?)```', readme, re.S)[1].splitlines()
    got = out.stdout.splitlines()
    assert got[1:] == shown[1:] == ['[[ True  True False False]', ' [False False  True  True]]']
    assert shown[0] == 'loss 2.77, lambda [0.5, 0.5]' and got[0].endswith(', lambda [0.5, 0.5]')
    assert abs(float(got[0].split()[1].rstrip(',')) - 2.77) <= 0.05


def test_an_epoch_line_shows_training_and_dev_seconds_and_the_run_its_total(tmp_path, capsys):
    """Each epoch line ends with the seconds of its training and of its dev scoring, which
    metrics.jsonl keeps; the test line ends with the run's seconds in all, at least their sum."""
    out = tmp_path / 'run'
    train.main(FAST + ['--epochs', '2', '--out', str(out)])
    lines = capsys.readouterr().out.splitlines()
    epochs = [re.search(r'  ([\d.]+) s \+ dev ([\d.]+) s', line) for line in lines
              if line.startswith('epoch ')]
    kept = read_metrics(out)
    assert len(epochs) == len(kept) == 2
    for shown, line in zip(epochs, kept):
        # shown to 0.1 s, kept to 0.01 s
        assert abs(float(shown[1]) - line['seconds']) <= 0.06
        assert abs(float(shown[2]) - line['dev_seconds']) <= 0.06
        assert line['dev_seconds'] > 0
    total = int(re.search(r'; (\d+) s in all\)$', lines[-1])[1])
    assert total >= int(sum(m['seconds'] + m['dev_seconds'] for m in kept))


def test_a_runs_record_says_where_it_came_from(run):
    """test_metrics.json's provenance: this checkout's commit (git's own answer, None outside
    git) and whether its tracked files had changes, the versions, no GPU on a CPU, and the
    digests of the whole data as loaded, not of the --train-fraction part it trained on."""
    import platform
    import transformers
    with open(run / runs.TEST_METRICS) as f:
        p = json.load(f)['provenance']
    git = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=ROOT, capture_output=True, text=True)
    commit = git.stdout.strip() if git.returncode == 0 else None
    changes = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=ROOT,
                             capture_output=True, text=True).stdout if commit else None
    assert p == {'commit': commit, 'dirty': None if commit is None else changes != '',
                 'python': platform.python_version(), 'torch': torch.__version__,
                 'transformers': transformers.__version__, 'cuda': torch.version.cuda,
                 'gpu': None, 'data': runs.digest(*data.load_demo())}
    assert json.loads((run / runs.TEST_METRICS).read_text())['args']['train_fraction'] < 1


@pytest.mark.parametrize('flags, key, want', [
    (['--warmup-epochs', '0'], 'warmup_epochs', 0), (['--beta', '0.5'], 'beta', 0.5),
    (['--beta', '1'], 'beta', 1.0), (['--train-fraction', '1'], 'train_fraction', 1.0),
    (['--seed', '0'], 'seed', 0), (['--seed', str(2**32 - 1)], 'seed', 2**32 - 1),
    (['--epochs', '1'], 'epochs', 1), (['--early-stop', '1'], 'early_stop', 1),
    (['--batch', '1'], 'batch', 1), (['--lr', '1e-300'], 'lr', 1e-300)])
def test_each_range_takes_the_edges_it_includes(flags, key, want):
    """The closed ends of VALID's ranges, as -h shows them (>= 0, in [0.5, 1], in (0, 1],
    in [0, 2^32), >= 1, > 0), are taken as given."""
    args, given = train.parse(['--data', 'demo', *flags])
    assert getattr(args, key) == given[key] == want
