"""The README's examples for a new user, run as written: its own-data example (a taxonomy and a
training file, written out in the README, then its shell commands) and its checkpoint example,
saved as a file in the repository's folder. Each runs in a temporary copy of that folder."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

import data
import lhmix
import runs

ROOT = Path(__file__).resolve().parent.parent  # the repository
MODULES = ('lhmix.py', 'speed.py', 'data.py', 'runs.py', 'evaluate.py', 'train.py')


def section(title):
    """The README's section `## title`, up to the next."""
    text = (ROOT / 'README.md').read_text('utf-8')
    return re.search(rf'^## {re.escape(title)}\n(.*?)(?=^## )', text, re.M | re.S)[1]


def repository(folder):
    """A copy of the repository's modules in `folder`, and the environment of a fresh shell
    there: this Python first on the PATH, nothing on PYTHONPATH, no GPU."""
    for name in MODULES:
        shutil.copy(ROOT / name, folder)
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    env['PATH'] = os.path.dirname(sys.executable) + os.pathsep + env['PATH']
    env['CUDA_VISIBLE_DEVICES'] = ''
    return env


def test_the_own_data_example_runs_as_written(tmp_path):
    """Each block but the last is the file that the paragraph above it names; the last is the
    commands. What they read is worked by hand from the README's files: 5 labels (CS, Math and
    their children Machine Learning, Statistics, Geometry), depth 2, two documents a split."""
    text = section('Your own data')
    blocks = re.findall(r'(?:^|\n\n)([^\n]+(?:\n[^\n]+)*)\n\n```\n(.*?)```', text, re.S)
    assert len(blocks) == 3, 'the README\'s "Your own data": a taxonomy, a training file, commands'
    env = repository(tmp_path)
    for paragraph, content in blocks[:-1]:
        path = tmp_path / re.match(r'`([^`]+)`', paragraph)[1]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, 'utf-8')
    out = subprocess.run(['bash', '-e', '-c', blocks[-1][1]], cwd=tmp_path, env=env, text=True,
                         capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == ('5 labels, depth 2; documents train 2, dev 2, test 2; cut to --max-length '
                        '128: train 0, dev 0, test 0')  # --model tiny's 128 tokens
    assert lines[0].startswith(re.search(r'Its first line counts what it read, `([^`]+)`', text)[1])
    assert [line[:9] for line in lines[2:7]] == [f'epoch   {e}' for e in range(5)]
    assert 'mixup' in lines[6] and 'mixup' not in lines[5]  # after --model tiny's 4 warm-up epochs
    run = tmp_path / 'out' / 'mine-prompt-lhmix-s0'
    assert lines[-1].startswith('test micro-F1') and 'out/mine-prompt-lhmix-s0; ' in lines[-1]
    # It learns what it can: every gold label of both texts, and nothing else; Geometry, in no
    # document, scores 0, so macro-F1 is 4 / 5 of the labels, as the README says.
    said = re.search(r'tests at micro-F1 ([\d.]+), macro-F1 ([\d.]+)', text).groups()
    assert said == ('100.00', '80.00') and lines[-1].startswith(
        f'test micro-F1 {said[0]}  macro-F1 {said[1]}  ')
    assert (run / 'test_metrics.json').exists()
    model, _, _ = runs.load_checkpoint(str(run / 'best'))
    h = model.hierarchy
    assert (h.labels, h.depth) == (['CS', 'Math', 'Machine Learning', 'Statistics', 'Geometry'],
                                   [1, 1, 2, 2, 2])
    assert [h.labels[p] for p in h.parent[2:]] == ['CS', 'Math', 'Math']
    # The resume command of "Run folders", as written: this run is finished. A run of 3 epochs in
    # its place, resumed so with --epochs 5, trains epochs 3 and 4 in the same folder, then tests.
    resume = ' '.join(re.search(r'`(python train.py --data data/mine\s+--resume)`',
                                section('Run folders'))[1].split()).split()
    epochs = len((run / 'metrics.jsonl').read_text().splitlines())
    out = subprocess.run(resume, cwd=tmp_path, env=env, text=True, capture_output=True)
    assert (out.returncode, out.stdout.splitlines(), out.stderr) == (0, lines[:1], (
        f'--resume: out/mine-prompt-lhmix-s0 is finished ({epochs} epochs); nothing to do\n'))
    for argv in (blocks[-1][1].splitlines()[-1].split() + ['--epochs', '3', '--overwrite'],
                 resume + ['--epochs', '5']):
        out = subprocess.run(argv, cwd=tmp_path, env=env, text=True, capture_output=True)
        assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line[:9] for line in lines[1:-1]] == ['epoch   3', 'epoch   4'], lines
    assert lines[-1].startswith('test micro-F1') and 'out/mine-prompt-lhmix-s0; ' in lines[-1]
    assert len((run / 'metrics.jsonl').read_text().splitlines()) == 5


def test_the_checkpoint_example_runs_as_a_file_in_the_repository_folder(tmp_path):
    """The example saved under the README's name beside the modules, with a demo checkpoint whose
    label biases (+-20, far beyond its scores) predict science, physics, optics, arts and no
    other; and the same file elsewhere, where Python finds no evaluate.py."""
    text = section('Using lhmix.py in another project')
    name = re.search(r"saved as\s+`(\w+\.py)`", text)[1]
    block, = [b for b in re.findall(r'```python\n(.*?)```', text, re.S) if 'load_checkpoint' in b]
    env = repository(tmp_path)
    h, splits = data.load_demo()
    mlm, tokenizer = lhmix.tiny_bert([t for t, _ in splits['train']] + h.names)
    model = lhmix.build_model(mlm, tokenizer, h, 'prompt', max_length=128)
    with torch.no_grad():
        model.label_bias.fill_(-20.0)
        model.label_bias[[h.index[v] for v in ('science', 'physics', 'optics', 'arts')]] = 20.0
    runs.save_checkpoint(str(tmp_path / 'out' / 'demo-prompt-lhmix-s0' / 'best'), model,
                         tokenizer, {})
    (tmp_path / name).write_text(block, 'utf-8')
    out = subprocess.run([sys.executable, name], cwd=tmp_path, env=env, text=True,
                         capture_output=True, timeout=300)
    assert (out.returncode, out.stdout) == (0, "[['science', 'physics', 'optics'], ['arts']]\n"), \
        out.stderr
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    shutil.copy(tmp_path / name, elsewhere)
    out = subprocess.run([sys.executable, name], cwd=elsewhere, env=env, text=True,
                         capture_output=True, timeout=300)
    assert out.returncode == 1
    assert out.stderr.splitlines()[-1] == "ModuleNotFoundError: No module named 'evaluate'"


def own_data_run(folder):
    """The README's own-data command, as written, run in `folder` (its data/mine written there):
    its output's lines, its stderr and its test macro-F1; it must end well."""
    command = re.findall(r'^python train.py .*$', section('Your own data'), re.M)[-1]
    out = subprocess.run(command.split(), cwd=folder, env=repository(folder), text=True,
                         capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    return lines, out.stderr, float(
        re.match(r'test micro-F1 [\d.]+  macro-F1 ([\d.]+)', lines[-1])[1])


ACCENTED = {  # a tree of depth 4 whose names and texts carry accents, upper- and lower-case
    'Sciences': {'Physique': {'Optique': ['Réfraction', 'Lumière']},
                 'Biologie': {'Génétique': ['Séquençage', 'Hérédité']}},
    'Économie': {'Marchés': {'Bourse': ['Actions', 'Dérivés']},
                 'Société': {'Santé': ['Hôpitaux', 'Médecine']}}}


def test_a_depth_4_data_set_with_accented_names_learns_with_the_readmes_command(tmp_path):
    """The README's own-data command on a folder of its format: 18 labels of depth 4 named with
    accents, 160 training documents (half their words from their path's names, as written, in
    capitals or with an s, half from 40 background words), 40 dev, 40 test. Every name is a
    word-piece (no warning of [UNK]; the tiny model's untrained encoder, the one of LH-Mix's
    ratios), and the run reaches test macro-F1 80 or more (85.35 with torch 2.13 on a CPU) in
    about 20 s."""
    folder, paths = tmp_path / 'data' / 'mine', []

    def walk(parent, node, path):
        children = node if isinstance(node, dict) else dict.fromkeys(node)
        lines.append('\t'.join([parent, *children]))
        for name, below in children.items():
            (walk(name, below, path + [name]) if below else paths.append(path + [name]))
    lines = []
    walk('Root', ACCENTED, [])
    folder.mkdir(parents=True)
    (folder / 'mine.taxonomy').write_text('\n'.join(lines) + '\n', 'utf-8')
    rng = np.random.default_rng(0)
    for split, n in (('train', 160), ('dev', 40), ('test', 40)):
        docs = []
        for _ in range(n):
            path = paths[rng.integers(len(paths))]
            words = [w for name in path for w in (name, name.upper(), name.lower() + 's')]
            docs.append(json.dumps({'token': ' '.join(
                words[rng.integers(len(words))] if rng.random() < 0.5 else f'mot{rng.integers(40)}'
                for _ in range(int(rng.integers(15, 30)))), 'label': [path[-1]]}))
        (folder / f'mine_{split}.json').write_text('\n'.join(docs) + '\n', 'utf-8')
    lines, err, macro = own_data_run(tmp_path)
    assert [x for x in err.splitlines() if 'warning' in x] == [
        'warning: LH-Mix here mixes every pair at 0.5, because the initial encoder sees the local '
        'hierarchies alike; use a pretrained masked LM'], err
    assert lines[0].startswith('18 labels, depth 4; documents train 160, dev 40, test 40')
    assert macro >= 80, lines[-1]


CATALOGUE = {  # a shop's catalogue of depth 3: French names with accents, spaces and dashes
    'Électroménager': {'Cuisine': ['Réfrigérateurs', 'Cafetières'],
                       'Entretien': ['Aspirateurs', 'Lave-linge']},
    'Jardin': {'Outillage': ['Tondeuses', 'Sécateurs'],
               'Mobilier': ['Chaises longues', 'Parasols']},
    'Épicerie': {'Boissons': ['Cafés', 'Thés'], 'Crèmerie': ['Fromages', 'Yaourts']}}
WORDS = {  # each leaf's own words in a product's description, none of them a label's name
    'Réfrigérateurs': 'froid congélateur givre', 'Cafetières': 'expresso filtre moulin',
    'Aspirateurs': 'poussière sac cyclonique', 'Lave-linge': 'tambour essorage lessive',
    'Tondeuses': 'gazon herbe coupe', 'Sécateurs': 'taille rosiers lame',
    'Chaises longues': 'transat détente toile', 'Parasols': 'ombre soleil inclinable',
    'Cafés': 'arabica torréfié grains', 'Thés': 'infusion théière feuilles',
    'Fromages': 'affiné brebis comté', 'Yaourts': 'lait fermenté nature'}


def test_a_depth_3_catalogue_with_accented_names_learns_with_the_readmes_command(tmp_path):
    """The README's own-data command, as written, on another folder of its format: a catalogue of
    21 labels of depth 3 with accented names, 80 training documents (product descriptions: their
    leaf's own words, never its name, among 30 words shared by all; a fifth of them in two leaves
    of two departments), 24 dev, 24 test. It reaches test macro-F1 70 or more (80.67 at best dev
    epoch 66 with torch 2.13 on a CPU, in about 30 s)."""
    folder = tmp_path / 'data' / 'mine'
    folder.mkdir(parents=True)
    lines, leaves = ['\t'.join(['Root', *CATALOGUE])], []
    for top, below in CATALOGUE.items():
        lines.append('\t'.join([top, *below]))
        for middle, names in below.items():
            lines.append('\t'.join([middle, *names]))
            leaves += [(top, name) for name in names]
    (folder / 'mine.taxonomy').write_text('\n'.join(lines) + '\n', 'utf-8')
    rng = np.random.default_rng(1)
    shared = ['prix', 'livraison', 'garantie', 'qualité', 'économique', 'écologique', 'marque',
              'modèle', 'idéal', 'pratique'] + [f'réf{i}' for i in range(20)]
    for split, n in (('train', 80), ('dev', 24), ('test', 24)):
        docs = []
        for _ in range(n):
            first = leaves[rng.integers(len(leaves))]
            others = [leaf for leaf in leaves if leaf[0] != first[0]]
            chosen = [first] + ([others[rng.integers(len(others))]] if rng.random() < 0.2 else [])
            own = [w for _, name in chosen for w in WORDS[name].split()]
            docs.append(json.dumps({'token': ' '.join(
                own[rng.integers(len(own))] if rng.random() < 0.8 else
                shared[rng.integers(len(shared))] for _ in range(int(rng.integers(6, 12)))),
                'label': [name for _, name in chosen]}, ensure_ascii=False))
        (folder / f'mine_{split}.json').write_text('\n'.join(docs) + '\n', 'utf-8')
    lines, _, macro = own_data_run(tmp_path)
    assert lines[0].startswith('21 labels, depth 3; documents train 80, dev 24, test 24')
    assert macro >= 70, lines[-1]
