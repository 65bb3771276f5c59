"""Tests of lhmix.py's model with the rest of the project: a taxonomy file read into the label
tree (data.py), whose errors name the file and the line, and the checkpoints of both models
(runs.py), each rebuilt as its own class. Expected values are worked by hand, or are the saved
model's own outputs."""
import json
import re

import numpy as np
import pytest
from safetensors.torch import load_file, safe_open, save_file

import data
import lhmix
import runs
from helpers import TEXTS, error, tiny, write_lines


def test_a_taxonomy_file_read_into_the_label_tree(tmp_path):
    path = write_lines(tmp_path / 'toy.taxonomy', ['Root\tCS\tMedical', 'CS\tML\tDB', '',
                                                   'Medical\tCancer', 'ML\tDeep_Learning'])
    parents, lines = data.read_taxonomy(path)
    h = lhmix.Hierarchy(parents, {'ML': 'machine learning'}, lines)
    assert h.labels == ['CS', 'Medical', 'ML', 'DB', 'Cancer', 'Deep_Learning']
    assert h.depth == [1, 1, 2, 2, 2, 3] and h.path(5) == [0, 2, 5]
    assert h.names == ['CS', 'Medical', 'machine learning', 'DB', 'Cancer', 'Deep Learning']
    assert lines == {'CS': f'{path}:1', 'Medical': f'{path}:1', 'ML': f'{path}:2',
                     'DB': f'{path}:2', 'Cancer': f'{path}:4', 'Deep_Learning': f'{path}:5'}


@pytest.mark.parametrize('lines, line_no, label, what', [
    (['Root\tA\tB', 'A\tx', 'B\tx'], 3, 'x', 'two parents'),
    (['Root\tA', 'B\tC', 'C\tB'], 2, 'C', 'cycle'),
    (['Root\tA', 'Z\tq'], 2, 'Z', 'refers to nothing')])
def test_bad_taxonomy_names_label_and_line(tmp_path, lines, line_no, label, what):
    path = write_lines(tmp_path / 'bad.taxonomy', lines)
    with pytest.raises(ValueError, match=re.escape(f'{path}:{line_no}:')) as e:
        parents, lines = data.read_taxonomy(path)
        lhmix.Hierarchy(parents, None, lines)
    assert repr(label) in str(e.value) and what in str(e.value)


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
