"""The data sets: WOS as HPT's scripts build it, HiAGM/HPT-format folders (NYT, RCV1-V2, any), and
a synthetic demo with the tiny BERT it trains. `load_data(name)` returns (Hierarchy, {split: [(text,
label ids)]}); everything else here feeds it.
"""
import io
import json
import math
import os
import re
import shutil
import tempfile
import zipfile
from collections import Counter
from xml.etree import ElementTree

import numpy as np

from lhmix import Hierarchy

WOS_URL = ('https://data.mendeley.com/datasets/9rw3vkcfy4/6/files/'
           'c9ea673d-5542-44c0-ab7b-f1311f7d61df/WebOfScience.zip?dl=1')
# NLTK's English stop words, as HPT's WOS preprocessing removes them
STOPWORDS = set("""i me my myself we our ours ourselves you you're you've you'll you'd your yours yourself
yourselves he him his himself she she's her hers herself it it's its itself they them their theirs themselves
what which who whom this that that'll these those am is are was were be been being have has had having do does
did doing a an the and but if or because as until while of at by for with about against between into through
during before after above below to from up down in out on off over under again further then once here there when
where why how all any both each few more most other some such no nor not only own same so than too very s t can
will just don don't should should've now d ll m o re ve y ain aren aren't couldn couldn't didn didn't doesn
doesn't hadn hadn't hasn hasn't haven haven't isn isn't ma mightn mightn't mustn mustn't needn needn't shan
shan't shouldn shouldn't wasn wasn't weren weren't won won't wouldn wouldn't""".split())


def clean_wos(text):
    """HPT's WOS cleaning (HiAGM's clean_str, then stop words and 1-letter words removed, lower-cased)."""
    s = re.sub(r"[^A-Za-z0-9(),!?\.\'\`]", ' ', text.strip().strip('"'))
    for a, b in ((r"\'s", " 's"), (r"\'ve", " 've"), (r"n\'t", " n't"), (r"\'re", " 're"),
                 (r"\'d", " 'd"), (r"\'ll", " 'll"), (r'[,\.\"!\(\)\?]', ' ')):
        s = re.sub(a, b, s)
    s = re.sub(r'\s{2,}', ' ', s).strip().lower()
    return ' '.join(w for w in s.split() if w not in STOPWORDS and len(w) > 1)


def wos_split(n):
    """HPT's split: np.random.seed(7) shuffle, then twice sklearn's train_test_split(test_size=0.2,
    random_state=0), reproduced with numpy (RandomState(0).permutation, test = first ceil(0.2 n))."""
    ids = np.arange(n)
    np.random.RandomState(7).shuffle(ids)

    def split(a):
        n_test, n_train = math.ceil(0.2 * len(a)), math.floor((1 - 0.2) * len(a))
        p = np.random.RandomState(0).permutation(len(a))
        return a[p[n_test:n_test + n_train]], a[p[:n_test]]

    train, test = split(ids)
    train, dev = split(train)
    return train, dev, test


def _xlsx_rows(data):
    """Rows of the first sheet of an .xlsx file (bytes), with the standard library only."""
    ns = '{http://schemas.openxmlformats.org/spreadsheetml/2006/main}'
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        shared = []
        if 'xl/sharedStrings.xml' in z.namelist():
            for si in ElementTree.fromstring(z.read('xl/sharedStrings.xml')).iter(ns + 'si'):
                shared.append(''.join(t.text or '' for t in si.iter(ns + 't')))
        sheet = sorted(n for n in z.namelist() if n.startswith('xl/worksheets/sheet'))[0]
        for _, row in ElementTree.iterparse(z.open(sheet)):
            if row.tag != ns + 'row':
                continue
            cells = {}
            for c in row.iter(ns + 'c'):
                col = re.match(r'[A-Z]+', c.get('r')).group()
                col = sum((ord(ch) - 64) * 26 ** k for k, ch in enumerate(reversed(col))) - 1
                kind, v = c.get('t'), c.find(ns + 'v')
                if kind == 's':
                    cells[col] = shared[int(v.text)]
                elif kind == 'inlineStr':
                    cells[col] = ''.join(t.text or '' for t in c.iter(ns + 't'))
                else:
                    cells[col] = '' if v is None else re.sub(r'\.0$', '', v.text or '')
            row.clear()
            yield [cells.get(i, '') for i in range(max(cells) + 1 if cells else 0)]


def _wos_rows(folder):
    """(source, [(line, fields)]) of WOS-46985's Meta-data table from Data.txt, Data.xlsx or the zip."""
    txt, xlsx, archive = (os.path.join(folder, f) for f in ('Data.txt', 'Data.xlsx', 'WebOfScience.zip'))
    if os.path.exists(txt):
        with open(txt, encoding='utf-8') as f:
            return txt, [(n, line.rstrip('\n').split('\t')) for n, line in enumerate(f, 1) if line.strip()]
    if os.path.exists(xlsx):
        with open(xlsx, 'rb') as f:
            return xlsx, list(enumerate(_xlsx_rows(f.read()), 1))
    if not os.path.exists(archive):
        _download(WOS_URL, archive)
    with zipfile.ZipFile(archive) as z:
        name = next((n for n in z.namelist() if n.endswith('Meta-data/Data.xlsx')), None)
        if name is None:
            raise ValueError(f'{archive}: no Meta-data/Data.xlsx inside')
        return f'{archive}:{name}', list(enumerate(_xlsx_rows(z.read(name)), 1))


def _download(url, path):
    import urllib.request
    from tqdm import tqdm
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            os.makedirs(os.path.dirname(path) or '.', exist_ok=True)  # only once the network answered
            with open(path + '.part', 'wb') as f, tqdm(total=int(r.headers.get('Content-Length') or 0), unit='B',
                                                       unit_scale=True, desc=os.path.basename(path)) as bar:
                while chunk := r.read(1 << 20):
                    f.write(chunk)
                    bar.update(len(chunk))
    except OSError as e:
        if os.path.exists(path + '.part'):
            os.remove(path + '.part')
        raise FileNotFoundError(
            f'WOS not found in {os.path.dirname(path)!r} and could not be downloaded ({e}). Put Data.txt or '
            f'Data.xlsx (from Meta-data/ of WebOfScience.zip, Mendeley Data 9rw3vkcfy4 v6) or the zip itself '
            f'there, or pass --data-dir') from None
    os.replace(path + '.part', path)


def load_wos(folder):
    """WOS-46985 preprocessed as HPT: Abstract cleaned, Domain (depth 1) -> area (depth 2), one area
    name per (Y1, Y2) code (its most frequent spelling); HPT's split. Returns (hierarchy, splits)."""
    source, numbered = _wos_rows(folder)
    if not numbered:
        raise ValueError(f'{source}: empty')
    n, header = numbered[0][0], [c.strip() for c in numbered[0][1]]
    if header[:7] != ['Y1', 'Y2', 'Y', 'Domain', 'area', 'keywords', 'Abstract']:
        raise ValueError(f'{source}:{n}: expected the header Y1 Y2 Y Domain area keywords Abstract, got {header}')
    for n, r in numbered[1:]:
        if len(r) != 7:
            raise ValueError(f'{source}:{n}: expected 7 tab-separated fields, found {len(r)}')
    rows = [r for _, r in numbered[1:]]
    domain_of = {y1: c.most_common(1)[0][0] for y1, c in _count(rows, 0, 3).items()}
    area_of = {code: c.most_common(1)[0][0] for code, c in _count(rows, (0, 1), 4).items()}
    areas = Counter(a for a in area_of.values())  # an area name used under two codes gets its domain
    key = {code: a if areas[a] == 1 else f'{a} ({domain_of[code[0]]})' for code, a in area_of.items()}
    parents = {d: None for d in sorted(set(domain_of.values()))}
    names = dict(zip(parents, parents))
    for code in sorted(key, key=lambda c: (c[0].zfill(9), c[1].zfill(9))):  # numeric order of the codes
        parents[key[code]], names[key[code]] = domain_of[code[0]], area_of[code]
    hierarchy = Hierarchy(parents, names)
    docs = [(clean_wos(r[6]), [hierarchy.index[domain_of[r[0]]], hierarchy.index[key[(r[0], r[1])]]])
            for r in rows]
    return hierarchy, {s: [docs[i] for i in idx] for s, idx in zip(('train', 'dev', 'test'), wos_split(len(docs)))}


def _count(rows, key_cols, value_col):
    out = {}
    for r in rows:
        k = r[key_cols] if isinstance(key_cols, int) else tuple(r[c] for c in key_cols)
        out.setdefault(k, Counter())[r[value_col].strip()] += 1
    return out


def load_hiagm(folder):
    """A folder in the HiAGM format: *_train.json, *_dev.json (or *_val.json), *_test.json (one JSON
    object a line: text in `token` or `doc_token`, label names in `label` or `doc_label`), one
    *.taxonomy, and optionally label_names.tsv (code<TAB>readable name). Labels are closed upward."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f'data folder {folder!r} does not exist')
    files = sorted(os.listdir(folder))

    def one(suffixes, what):
        found = [f for f in files if f.endswith(suffixes)]
        if len(found) != 1:
            raise FileNotFoundError(f'{folder!r}: expected one {what} file, found {found or "none"}')
        return os.path.join(folder, found[0])

    names = {}
    names_file = os.path.join(folder, 'label_names.tsv')
    if os.path.exists(names_file):
        with open(names_file, encoding='utf-8') as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    code, _, name = line.rstrip('\n').partition('\t')
                    if not name.strip():
                        raise ValueError(f'{names_file}:{n}: expected code<TAB>name')
                    names[code.strip()] = name.strip()
    taxonomy = one(('.taxonomy',), '*.taxonomy')
    hierarchy = Hierarchy.from_taxonomy(taxonomy, names)
    splits = {}
    for split, suffixes in (('train', ('_train.json',)), ('dev', ('_dev.json', '_val.json')), ('test', ('_test.json',))):
        path, docs = one(suffixes, '*' + ' or *'.join(suffixes)), []
        with open(path, encoding='utf-8') as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f'{path}:{n}: malformed JSON ({e.msg})') from None
                d = d if isinstance(d, dict) else {}
                text, labels = d.get('token', d.get('doc_token')), d.get('label', d.get('doc_label'))
                if text is None or not isinstance(labels, list):
                    raise ValueError(f'{path}:{n}: expected an object with `token` (or `doc_token`) and a list '
                                     '`label` (or `doc_label`)')
                unknown = [v for v in labels if v not in hierarchy.index]
                if unknown:
                    raise ValueError(f'{path}:{n}: label {unknown[0]!r} is not in the taxonomy {taxonomy}')
                text = ' '.join(text) if isinstance(text, list) else str(text)
                docs.append((text, hierarchy.closure(hierarchy.index[v] for v in labels)))
        splits[split] = docs
    return hierarchy, splits


def load_demo(seed=0, sizes=(1200, 300, 300)):
    """A small synthetic HTC set: a 2-3 level topic tree; each document draws words from its topics'
    word lists and a shared background, and one in five lies on two paths."""
    tree = {'science': {'physics': ['quantum', 'optics'], 'biology': ['genetics', 'ecology'], 'chemistry': []},
            'sports': {'football': [], 'tennis': [], 'cycling': []},
            'arts': {'music': ['jazz', 'opera'], 'painting': [], 'cinema': []},
            'business': {'finance': ['banking', 'markets'], 'retail': []}}
    parents = {}
    for top, mids in tree.items():
        parents[top] = None
        for mid, leaves in mids.items():
            parents[mid] = top
            parents.update({leaf: mid for leaf in leaves})
    hierarchy = Hierarchy(parents)
    rng = np.random.default_rng(seed)
    words = {v: [v] + [f'{v}{c}' for c in 'abcdefg'] for v in parents}
    background = [f'common{i}' for i in range(60)]
    leaves = [v for v in parents if not any(p == v for p in parents.values())]

    def path(leaf):
        return hierarchy.closure([hierarchy.index[leaf]])

    def doc():
        chosen = [leaves[rng.integers(len(leaves))]]
        if rng.random() < 0.2:
            other = [v for v in leaves if path(v)[0] != path(chosen[0])[0]]
            chosen.append(other[rng.integers(len(other))])
        labels = sorted({i for leaf in chosen for i in path(leaf)})
        topical = [w for i in labels for w in words[hierarchy.labels[i]]]
        n = int(rng.integers(20, 50))
        text = [topical[rng.integers(len(topical))] if rng.random() < 0.35 else background[rng.integers(60)]
                for _ in range(n)]
        return ' '.join(text), labels

    return hierarchy, {s: [doc() for _ in range(n)] for s, n in zip(('train', 'dev', 'test'), sizes)}



def tiny_bert(texts, max_words=8000):
    """A 2-layer, 128-wide BERT with a word-level vocabulary written on the fly (no download)."""
    from transformers import AutoModelForMaskedLM, BertConfig, BertTokenizerFast
    counts = Counter(w for t in texts for w in re.findall(r"\w+|[^\w\s]", t.lower()))
    vocab = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + [w for w, _ in counts.most_common(max_words)]
    folder = tempfile.mkdtemp(prefix='lhmix-tiny-')
    with open(os.path.join(folder, 'vocab.txt'), 'w', encoding='utf-8') as f:
        f.write('\n'.join(vocab) + '\n')
    tokenizer = BertTokenizerFast(os.path.join(folder, 'vocab.txt'), do_lower_case=True)  # v4 and v5
    shutil.rmtree(folder)
    config = BertConfig(vocab_size=len(vocab), hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=256, max_position_embeddings=512)
    return AutoModelForMaskedLM.from_config(config), tokenizer  # as load_checkpoint builds it (same attention)



def load_data(name, data_dir=None):
    """'wos', 'nyt', 'rcv1', 'demo', or a path to a HiAGM-format folder."""
    if name == 'demo':
        return load_demo()
    if name == 'wos':
        return load_wos(data_dir or os.path.join('data', 'wos'))
    if name in ('nyt', 'rcv1'):
        return load_hiagm(data_dir or os.path.join('data', name))
    return load_hiagm(data_dir or name)
