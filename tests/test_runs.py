"""Tests of runs.py's checkpoints: each model rebuilt as its own class, a round trip, no pickle and
no code run, one line for each damage (naming the file), a kill during a save; of the run folder,
what an --overwrite's replacement of an earlier run keeps, what a failed run leaves and a run's
records refused (its other refusals are tested through train.py in test_train.py). Expected values
are the saved model's own outputs or worked by hand."""
import hashlib
import json
import os
import pickle
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, safe_open, save_file

import lhmix
import runs
from helpers import PARENTS, TEXTS, error, tiny, tree_state


@pytest.mark.parametrize('arch, cls', [('prompt', lhmix.LHMix), ('bert', lhmix.FlatBERT)])
def test_a_checkpoint_rebuilds_its_own_model_class(tmp_path, arch, cls):
    """A checkpoint saves its model's arch; loading rebuilds that class, which scores as the
    saved model did. An arch that names no model is refused in one line."""
    model, tok = tiny(arch)
    folder = tmp_path / 'best'
    runs.save_checkpoint(str(folder), model, tok, {'epoch': 1})
    loaded, _, meta = runs.load_checkpoint(str(folder))
    assert meta['arch'] == arch and type(model) is type(loaded) is cls
    tokens, _ = lhmix.tokenize(tok, TEXTS, 50)
    np.testing.assert_array_equal(lhmix.score_documents(loaded, tokens),
                                  lhmix.score_documents(model, tokens))
    path = folder / runs.WEIGHTS
    saved = json.loads(safe_open(path, 'pt').metadata()['lhmix'])
    save_file(load_file(path), path, {'lhmix': json.dumps({**saved, 'arch': 'gpt'})})
    assert error(lambda: runs.load_checkpoint(str(folder))) == (
        f"{folder}: config.json, tokenizer or metadata unreadable (KeyError: 'gpt')")


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
    model, tok = tiny()
    folder = tmp_path_factory.mktemp('ck') / 'best'
    runs.save_checkpoint(str(folder), model, tok, {'epoch': 7}, {'table': torch.arange(6.)})
    return folder


@pytest.mark.parametrize('arch', ['prompt', 'bert'])
def test_checkpoint_round_trip_without_pickle_in_the_umask_modes(tmp_path, monkeypatch, arch):
    model, tok = tiny(arch)
    tokens, _ = lhmix.tokenize(tok, TEXTS * 3, 50)
    before = lhmix.score_documents(model, tokens)
    folder = tmp_path / 'ck'
    old = os.umask(0o027)
    try:
        runs.save_checkpoint(str(folder), model, tok, {'epoch': 6})
        config = os.stat(folder / 'config.json')
        # a transposed view, not contiguous, as safetensors cannot store one as it is
        extra = {'step': torch.tensor([5]), 'table': torch.randn(4, 3, dtype=torch.float64).t()}
        runs.save_checkpoint(str(folder), model, tok, {'epoch': 7, 'dev': {'f1': 0.5}}, extra)
        runs.write_whole(str(tmp_path / 'sub' / 'm.json'), '{}\n')
    finally:
        os.umask(old)
    assert os.stat(folder / 'config.json').st_ino == config.st_ino  # written once, with the folder
    modes = {os.path.relpath(p, tmp_path): os.stat(p).st_mode & 0o777 for p in (
        os.path.join(d, f) for d, dirs, fs in os.walk(tmp_path) for f in dirs + fs)}
    # transformers 4.x also writes vocab.txt and special_tokens_map.json: the same modes
    assert {'ck/config.json', 'ck/model.safetensors', 'ck/tokenizer.json'} <= modes.keys()
    files = dict.fromkeys(modes.keys() - {'ck', 'sub'}, 0o640)
    assert modes == {'ck': 0o750, 'sub': 0o750, **files}
    for mod, name in ((torch, 'load'), (pickle, 'load'), (pickle, 'loads')):
        monkeypatch.setattr(mod, name, lambda *a, **k: pytest.fail('pickle used'))
    loaded, tok2, meta = runs.load_checkpoint(str(folder))
    assert (meta['epoch'], meta['dev'], meta['arch'], meta['max_length']) == \
        (7, {'f1': 0.5}, arch, 64)
    for got, want in ((meta['extra'], extra), (loaded.state_dict(), model.state_dict())):
        assert got.keys() == want.keys() and all(torch.equal(v, want[k]) for k, v in got.items())
    assert loaded.hierarchy.labels == list(PARENTS) and loaded.prefix == model.prefix
    assert tok2.convert_ids_to_tokens(tokens[0].tolist()) == TEXTS[0].split()
    emb, dec = loaded.mlm.get_input_embeddings(), loaded.mlm.get_output_embeddings()
    assert dec.weight is emb.weight  # still tied: training one trains the other
    assert 'mlm.cls.predictions.decoder.weight' not in load_file(folder / runs.WEIGHTS)  # once
    after = lhmix.score_documents(loaded, tokens)
    np.testing.assert_array_equal(before, after)
    assert (before > 0).any() and not (before > 0).all()


def _drop_a_weight(path):
    meta = safe_open(path, 'pt').metadata()
    save_file({k: v for k, v in load_file(path).items() if k != 'label_bias'}, path, meta)


def _add_a_weight(path):
    meta = safe_open(path, 'pt').metadata()
    save_file({**load_file(path), 'stray': torch.zeros(2)}, path, meta)


def _narrower(path):  # config.json edited: hidden_size 64 instead of the weights' 128
    config = path.parent / 'config.json'
    config.write_text(json.dumps({**json.loads(config.read_text()), 'hidden_size': 64}))


CORRUPT = '{c}/model.safetensors: unreadable, truncated or corrupt ('


@pytest.mark.parametrize('damage, ask, message', [
    (lambda p: os.truncate(p, 0), None, CORRUPT + 'SafetensorError: '),
    (lambda p: os.truncate(p, 100), None, CORRUPT + 'SafetensorError: '),
    (lambda p: p.write_bytes(b'{}}}' + p.read_bytes()[4:]), None,
     CORRUPT + 'SafetensorError: '),  # a garbled header
    (lambda p: save_file(load_file(p), p), None, CORRUPT + "KeyError: 'lhmix')"),  # no metadata
    (_drop_a_weight, None, '{c}/model.safetensors: weights missing, unexpected or not shaped as '
     'config.json says: label_bias and 0 more'),
    (_add_a_weight, None, '{c}/model.safetensors: weights missing, unexpected or not shaped as '
     'config.json says: stray and 0 more'),
    (_narrower, None, '{c}/model.safetensors: weights missing, unexpected or not shaped as '
     'config.json says: mlm.bert.embeddings.LayerNorm.bias and 38 more'),
    (os.remove, None, '{c}: not an LH-Mix checkpoint (no model.safetensors)'),
    (lambda p: os.remove(p.parent / 'tokenizer.json'), None,
     '{c}: not an LH-Mix checkpoint (no tokenizer.json)'),
    (None, lambda c: (c, lhmix.Hierarchy({'Sci': None})),
     '{c}: its labels differ from those of the data'),
    (None, lambda c: (c, lhmix.Hierarchy(dict(reversed(PARENTS.items())))),
     '{c}: its labels differ from those of the data in their order (a taxonomy with its lines '),
    (None, lambda c: (c.parent, None), '{r}: a run, not a checkpoint: pass {c}'),
    (None, lambda c: (c / 'no', None), '{c}/no: not an LH-Mix checkpoint (no tokenizer.json, '
     'tokenizer_config.json, config.json, model.safetensors)'),
])
def test_damaged_checkpoint_one_line(saved, tmp_path, damage, ask, message):
    folder = shutil.copytree(saved, tmp_path / 'run' / 'best')
    if damage:
        damage(folder / runs.WEIGHTS)
    path, hierarchy = ask(folder) if ask else (folder, None)
    msg = error(lambda: runs.load_checkpoint(str(path), hierarchy=hierarchy))
    assert msg.startswith(message.format(c=folder, r=folder.parent)) and len(msg) < 300, msg


def test_no_code_from_a_checkpoint_or_model_folder_runs(saved, tmp_path):
    ck, model = shutil.copytree(saved, tmp_path / 'ck'), tmp_path / 'model'
    for x in lhmix.tiny_bert(TEXTS):
        x.save_pretrained(model)
    for folder in (ck, model):  # auto_map: transformers' way to ask for the folder's code
        (folder / 'evil.py').write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\nclass X: pass\n")
        for name in ('config.json', 'tokenizer_config.json'):
            path = folder / name
            path.write_text(json.dumps({**json.loads(path.read_text()), 'auto_map': {
                'AutoConfig': 'evil.X', 'AutoModelForMaskedLM': 'evil.X',
                'AutoTokenizer': ['evil.X', 'evil.X']}}))
    runs.load_checkpoint(str(ck))
    lhmix.load_pretrained(str(model))
    assert not (tmp_path / 'ran').exists()


@pytest.mark.parametrize('killed', [False, True])
def test_kill_during_save_leaves_the_old_checkpoint(saved, tmp_path, monkeypatch, killed):
    """os.replace raising stands for a kill at the last instant before the switch; `killed` also
    leaves the temporary file behind, as SIGKILL does."""
    folder = shutil.copytree(saved, tmp_path / 'ck')
    model, tok = tiny(seed=2)
    monkeypatch.setattr(os, 'replace', lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    if killed:
        monkeypatch.setattr(runs.Path, 'unlink', lambda *a, **k: None)
    for target in (folder, tmp_path / 'new'):
        with pytest.raises(KeyboardInterrupt):
            runs.save_checkpoint(str(target), model, tok, {'epoch': 8})
    monkeypatch.undo()
    assert runs.load_checkpoint(str(folder))[2]['epoch'] == 7
    assert 'not an LH-Mix checkpoint (no tokenizer.json' in error(
        lambda: runs.load_checkpoint(str(tmp_path / 'new')))
    left = [f for d in (tmp_path / 'new', folder) for f in os.listdir(d)]
    assert sorted(left) == sorted(runs.CHECKPOINT + (  # the first file of each save
        '.model.safetensors.tmp', '.tokenizer.json.tmp') * killed)
    runs.save_checkpoint(str(folder), model, tok, {'epoch': 8})  # the next save is not in the way
    runs.save_checkpoint(str(tmp_path / 'new'), model, tok, {'epoch': 8})
    assert [runs.load_checkpoint(str(f))[2]['epoch'] for f in (folder, tmp_path / 'new')] == [8, 8]
    assert sorted(os.listdir(tmp_path / 'new')) == sorted(runs.CHECKPOINT)


# The run folder: an --overwrite's first epoch in .new replaces the earlier run once it is whole

# The files of a checkpoint, best/ or last/, by name.
FILES = ['config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json']


@pytest.mark.parametrize('whole', [True, False])
def test_settle_replaces_what_a_whole_epoch_in_new_holds_and_keeps_what_it_lacks(run, tmp_path,
                                                                                 whole):
    """An earlier finished run with the leftovers of killed saves, and in .new a first epoch as a
    kill in the middle of its replacement leaves it: metrics.jsonl and last/ (best/ already moved,
    here: the earlier run's stands for it). Whole (last/ has its weights): the earlier test figures
    and leftovers go, best/ is kept, metrics.jsonl and last/ are .new's. A part (no weights): .new
    goes and every earlier file stays."""
    out = shutil.copytree(run, tmp_path / 'run')
    for name in ('.test_metrics.json.tmp', 'best/.config.json.tmp', 'last/.model.safetensors.tmp'):
        (out / name).write_text('half written')
    (out / '.new').mkdir()
    (out / '.new' / 'metrics.jsonl').write_text('{"epoch": 0}\n')
    shutil.copytree(run / 'best', out / '.new' / 'last')  # bytes unlike the earlier last/'s
    if not whole:
        os.remove(out / '.new' / 'last' / 'model.safetensors')
    before = tree_state(out)
    runs.settle(str(out))
    after = tree_state(out)
    if not whole:
        assert after == {k: v for k, v in before.items() if not k.startswith('.new')}
        return
    assert sorted(after) == ['best', *(f'best/{f}' for f in FILES), 'last',
                             *(f'last/{f}' for f in FILES), 'metrics.jsonl']
    assert before['.new/last/model.safetensors'] != before['last/model.safetensors']
    for name in FILES:
        assert after[f'best/{name}'] == before[f'best/{name}']
        assert after[f'last/{name}'] == before[f'.new/last/{name}']
    assert after['metrics.jsonl'] == before['.new/metrics.jsonl']


def test_a_run_that_fails_before_its_first_save_leaves_nothing_of_its_own(tmp_path):
    """A new run that wrote a file and then failed: its file goes, and so do the folders it made
    (a/b/run, a/b, a), but not a folder that was there before it."""
    (tmp_path / 'mine').mkdir()
    for out in (tmp_path / 'a' / 'b' / 'run', tmp_path / 'mine'):
        with pytest.raises(KeyboardInterrupt):
            with runs.RunFolder(str(out)):
                (out / 'metrics.jsonl').write_text('{"epoch": 0}\n')
                raise KeyboardInterrupt
        assert os.listdir(tmp_path) == ['mine'] and os.listdir(tmp_path / 'mine') == []


def test_a_runs_records_without_checkpoints_are_named_so_and_never_replaced(tmp_path):
    """A folder as results/records keeps a run (metrics.jsonl, test_metrics.json, no best/ or
    last/): refused as --out in one line that says so, with or without --overwrite, and left as
    it was."""
    out = tmp_path / 'bert-lhmix-s0'
    shutil.copytree(os.path.join(os.path.dirname(runs.__file__), 'results', 'records', 'table3',
                                 out.name), out)
    before = tree_state(out)
    for overwrite in (False, True):
        assert error(lambda: runs.RunFolder(str(out), overwrite=overwrite)) == (
            f"--out {out}: holds a run's records without its checkpoints (as results/records "
            'keeps them); choose another --out')
        assert tree_state(out) == before
    (out / runs.TEST_METRICS).unlink()  # metrics.jsonl alone is a run's records too
    assert "holds a run's records without its checkpoints" in error(
        lambda: runs.RunFolder(str(out), overwrite=True))


def test_the_error_exit_is_one_line_and_lets_other_errors_through(capsys):
    """exit_on_error: a mistake's message, its whitespace collapsed, as one line `error: ...`
    (exit 1); a RuntimeError that is not torch's out of memory goes through as it is."""
    def fail(e):
        raise e
    with pytest.raises(SystemExit) as stop:
        runs.exit_on_error(fail, ValueError('a\n   b'))
    assert stop.value.code == 'error: a b'
    with pytest.raises(SystemExit) as stop:
        runs.exit_on_error(fail, torch.OutOfMemoryError('CUDA out of memory'))
    assert stop.value.code == 'error: out of GPU memory; try a smaller --batch'
    with pytest.raises(RuntimeError, match='boom'):
        runs.exit_on_error(fail, RuntimeError('boom'))


def test_the_digests_that_resume_checks_and_a_record_keeps_cover_labels_names_and_splits():
    """--resume refuses data whose labels, tree, label names or documents are not the run's: a
    SHA-256 of each, by hand (the JSON of the labels and their parents' ids, of the names, of each
    split's (text, label ids) pairs); each change moves its own digest alone."""
    splits = {'train': [('a b', [0])], 'dev': [('c', [1])], 'test': [('d', [0, 2])]}
    tree = {'x': None, 'y': None, 'z': 'x'}
    base = runs.digest(lhmix.Hierarchy(tree), splits)
    sha = {'labels': '[["x", "y", "z"], [-1, -1, 0]]', 'names': '["x", "y", "z"]',
           'train': '[["a b", [0]]]', 'dev': '[["c", [1]]]', 'test': '[["d", [0, 2]]]'}
    assert base == {k: hashlib.sha256(v.encode()).hexdigest() for k, v in sha.items()}
    assert runs.digest(lhmix.Hierarchy(dict(tree)), json.loads(json.dumps(splits))) == base
    for moved, digest in (
            ('labels', runs.digest(lhmix.Hierarchy({**tree, 'z': 'y'}), splits)),  # same labels
            ('labels', runs.digest(lhmix.Hierarchy({'x': None, 'y': None, 'w': 'x'},
                                                   {'w': 'z'}), splits)),  # the same names
            ('names', runs.digest(lhmix.Hierarchy(tree, {'z': 'zed'}), splits)),
            ('dev', runs.digest(lhmix.Hierarchy(tree), {**splits, 'dev': [('c', [0])]})),
            ('test', runs.digest(lhmix.Hierarchy(tree), {**splits, 'test': [('d e', [0, 2])]}))):
        assert {k for k in base if base[k] != digest[k]} == {moved}


def test_provenance_dirty_means_changed_tracked_files_and_none_without_git(tmp_path, monkeypatch):
    """A stand-in git on PATH answers as a checkout would: 'dirty' is whether `git status`
    lists changes of tracked files (an untracked file alone leaves it clean); without git,
    commit and dirty are None."""
    git = tmp_path / 'bin' / 'git'
    git.parent.mkdir()
    git.write_text('#!/bin/sh\ncase "$*" in\n'
                   '  "rev-parse HEAD") echo 0123abc;;\n'
                   '  "status --porcelain --untracked-files=no") printf "$TRACKED";;\n'
                   '  "status --porcelain") printf "$TRACKED?? new.txt\\n";;\n'
                   '  *) exit 2;;\nesac\n')
    git.chmod(0o755)
    monkeypatch.setenv('PATH', str(git.parent))
    cpu = torch.device('cpu')
    for tracked, dirty in (('', False), (' M lhmix.py\\n', True)):
        monkeypatch.setenv('TRACKED', tracked)
        p = runs.provenance(cpu, {'train': 'x'})
        assert (p['commit'], p['dirty'], p['gpu'], p['data']) == ('0123abc', dirty, None,
                                                                  {'train': 'x'})
    monkeypatch.setenv('PATH', str(tmp_path))  # no git there
    assert (runs.provenance(cpu, {})['commit'], runs.provenance(cpu, {})['dirty']) == (None, None)
