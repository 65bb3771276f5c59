"""What the test files share: a small tree and its texts, a tiny LH-Mix, files written by hand,
train.py's fastest demo run, the checks of a refusal (one line, nothing changed), and a tiny
masked LM of each family (test_lhmix.py's tiny_family) with a small data set for it."""
import hashlib
import json
import os

import numpy as np
import pytest
import torch

import lhmix
import runs
import train
from test_lhmix import tiny_family

PARENTS = {'Sci': None, 'Art': None, 'Sci/quantum_physics': 'Sci', 'Sci/biology': 'Sci',
           'Art/jazz_music': 'Art', 'Sci/quantum_physics/optics': 'Sci/quantum_physics'}
TEXTS = ['light waves bend in glass', 'cells divide and grow', 'the band played a slow tune']
FAST = ['--data', 'demo', '--model', 'tiny', '--device', 'cpu', '--train-fraction', '0.01',
        '--batch', '8', '--warmup-epochs', '0']  # 12 training documents, Mixup from epoch 0
# train.py's arguments as a run records them, at the demo's defaults
ARGS = {k: v for k, v in vars(train.parse(['--data', 'demo'])[0]).items() if k not in train.CONTROL}
PERCENTS = ('0', '5', '25', '50', '75', '95', '100')  # metrics.jsonl's lambda quantiles


def tiny_model(h, arch='prompt', max_length=512):
    """An LHMix on a tiny BERT whose vocabulary is TEXTS' and the label names' words."""
    mlm, tok = lhmix.tiny_bert(TEXTS + h.names)
    return lhmix.build_model(mlm, tok, h, arch, max_length), tok


def tiny(arch='prompt', seed=1):
    """tiny_model on PARENTS in eval mode, its weights moved off their initial values (a tensor
    lost in a save shows)."""
    torch.manual_seed(seed)
    model, tok = tiny_model(lhmix.Hierarchy(PARENTS), arch, max_length=64)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval(), tok


# A depth-3 data set for the masked-LM families: 12 labels (the taxonomy's lines), each of its 7
# leaves with words of its own. A document is 6 to 10 words, each its leaf's (half), a name on
# its path (a fifth) or a shared word.
FAMILY_TAXONOMY = ['Root\tscience\tarts', 'science\tphysics\tbiology', 'physics\toptics\tquantum',
                   'biology\tgenetics\tecology', 'arts\tmusic\tpainting', 'music\tjazz\topera']
FAMILY_WORDS = {'optics': 'lens mirror prism', 'quantum': 'electron spin photon',
                'genetics': 'gene dna mutation', 'ecology': 'forest river species',
                'painting': 'canvas brush portrait', 'jazz': 'saxophone swing trumpet',
                'opera': 'soprano aria tenor'}
SHARED = 'the a new of and in on with about report study today'.split()


def family_docs(n, seed):
    """n documents of FAMILY_TAXONOMY's leaves, drawn by `seed`: (text, leaf) pairs."""
    rng, parent = np.random.default_rng(seed), {}
    for line in FAMILY_TAXONOMY:
        up, *children = line.split('\t')
        parent.update(dict.fromkeys(children, up))
    docs = []
    for leaf in rng.choice(sorted(FAMILY_WORDS), n):
        path = [leaf]
        while parent[path[-1]] != 'Root':
            path.append(parent[path[-1]])
        pools = [FAMILY_WORDS[leaf].split(), path, SHARED]
        words = [rng.choice(pools[rng.choice(3, p=[0.5, 0.2, 0.3])])
                 for _ in range(rng.integers(6, 11))]
        docs.append((' '.join(words), str(leaf)))
    return docs


FAMILY_SPLITS = {split: family_docs(n, seed) for split, n, seed in (
    ('train', 48, 0), ('val', 24, 1), ('test', 24, 2))}


def family_folder(kind, path):
    """Saves tiny_family(kind) in `path`, a pretrained masked LM for train.py --model, its
    tokenizer trained on FAMILY_SPLITS' texts and the label names."""
    names = [w for line in FAMILY_TAXONOMY for w in line.split('\t')[1:]]
    for part in tiny_family(kind, [t for docs in FAMILY_SPLITS.values() for t, _ in docs] + names):
        part.save_pretrained(path)
    return str(path)


def write_lines(path, lines):  # UTF-8; a surrogate '\udce9' writes the Latin-1 byte of 'é'
    path.write_bytes(''.join(line + '\n' for line in lines).encode('utf-8', 'surrogateescape'))
    return str(path)


def write_hiagm(folder, train_lines=None, val_lines=None, test_lines=None):
    """A HiAGM-format data folder: toy.taxonomy, label_names.tsv, toy_{train,val,test}.json."""
    folder.mkdir(parents=True, exist_ok=True)
    write_lines(folder / 'toy.taxonomy', ['Root\tCCAT\tGCAT', 'CCAT\tC15\tC17', 'C15\tC151'])
    write_lines(folder / 'label_names.tsv', ['CCAT\tCorporate/Industrial', 'C15\tPerformance'])
    write_lines(folder / 'toy_train.json', train_lines or [
        json.dumps({'token': ['profits', 'rose'], 'label': ['C151']}), '',
        json.dumps({'doc_token': 'markets fell', 'doc_label': ['GCAT', 'C17']})])
    write_lines(folder / 'toy_val.json', val_lines or [json.dumps({'token': 'war news',
                                                                   'label': ['GCAT']})])
    write_lines(folder / 'toy_test.json', test_lines or [json.dumps({'token': ['a', 'b'],
                                                                     'label': ['C15', 'GCAT']})])
    return folder


def fake_run(folder, micro, macro, depths=(60, 40), quartiles=(30, 40, 50, 60), history=(),
             best=0, provenance=None, **args):
    """A finished train.py run written by hand into `folder`: its test micro- and macro-F1 (%),
    macro-F1 (%) per depth (depth d: 10 d labels) and per label-frequency quartile (quartile q: 10
    labels of 10 q to 10 q + 9 training documents); its epochs in metrics.jsonl, each (dev
    macro-F1 %, dev micro-F1 %, the lambda quantiles or None without Mixup); its best epoch and
    arguments (ARGS but those given); its provenance, if given (the 220 records have none)."""
    os.makedirs(folder)
    lines = [{'epoch': e, 'mix': lam is not None, 'train_loss': 1.0, 'dev_micro_f1': mi / 100,
              'dev_macro_f1': ma / 100, 'seconds': 1.0, 'dev_seconds': 1.0, 'samples_per_s': 12.0,
              **({'lambda': {'mean': float(np.mean(lam)), 'quantiles': dict(zip(PERCENTS, lam))}}
                 if lam is not None else {})} for e, (ma, mi, lam) in enumerate(history)]
    test = {'micro_f1': micro / 100, 'macro_f1': macro / 100,
            'per_depth': {str(d): {'labels': 10 * d, 'micro_f1': 0.5, 'macro_f1': f / 100}
                          for d, f in enumerate(depths, 1)},
            'by_frequency': [{'quartile': q, 'labels': 10, 'train_docs_min': 10 * q,
                              'train_docs_max': 10 * q + 9, 'micro_f1': 0.5, 'macro_f1': f / 100}
                             for q, f in enumerate(quartiles, 1)],
            'best_epoch': best, 'checkpoint': os.path.join(folder, 'best'),
            'args': {**ARGS, **args}, **({'provenance': provenance} if provenance else {})}
    with open(os.path.join(folder, runs.METRICS), 'w') as f:
        f.writelines(json.dumps(h) + '\n' for h in lines)
    with open(os.path.join(folder, runs.TEST_METRICS), 'w') as f:
        json.dump(test, f)
    return str(folder)


def read_metrics(out):
    with open(os.path.join(out, runs.METRICS)) as f:
        return [json.loads(line) for line in f]


def tree_state(path):
    """Everything under `path`: names, modes, file contents' hashes, link targets (None if absent),
    to check that a refused command left it exactly as it was."""
    def state(p):
        if os.path.islink(p) or os.path.isdir(p):
            return os.readlink(p) if os.path.islink(p) else ('dir', os.lstat(p).st_mode)
        with open(p, 'rb') as f:
            return os.lstat(p).st_mode, hashlib.sha256(f.read()).hexdigest()
    path = str(path)
    if not os.path.lexists(path) or os.path.islink(path) or not os.path.isdir(path):
        return state(path) if os.path.lexists(path) else None
    return {os.path.relpath(os.path.join(root, n), path): state(os.path.join(root, n))
            for root, dirs, files in os.walk(path) for n in dirs + files}


def error(call):
    """The message of the ValueError `call` raises, checked to be one line."""
    with pytest.raises(ValueError) as e:
        call()
    assert '\n' not in str(e.value)
    return str(e.value)


def error_of(call):
    """The message of a `sys.exit('error: ...')`, checked to be one line."""
    with pytest.raises(SystemExit) as e:
        call()
    msg = e.value.code
    assert isinstance(msg, str) and msg.startswith('error: ') and '\n' not in msg, msg
    return msg


def is_whole_run(out):
    """Exactly a finished run's files, every checkpoint loadable."""
    files = sorted(os.path.relpath(os.path.join(r, f), out) for r, _, fs in os.walk(out)
                   for f in fs)
    for name in ('best', 'last'):
        runs.load_checkpoint(str(out / name))
    return files == sorted(runs.RUN)
