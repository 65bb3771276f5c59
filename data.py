"""The data sets (WOS as HPT's scripts build it, HiAGM/HPT-format folders such as NYT and RCV1-V2,
a synthetic demo), the pretrained model a run starts from, and checkpoints on disk.
`load_data(name)` returns (Hierarchy, {split: [(text, label ids)]})."""
import io
import json
import math
import os
import re
import shutil
import sys
import tempfile
import zipfile
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import torch

from lhmix import Hierarchy, LHMix


def read_lines(path):
    """[(line number, line)] of a UTF-8 text file (`-`: standard input); a BOM is dropped.
    Python's own UnicodeDecodeError names no line: this one does."""
    try:
        with (open(path, encoding='utf-8-sig') if path != '-' else
              io.TextIOWrapper(io.BytesIO(sys.stdin.buffer.read()), encoding='utf-8-sig')) as f:
            text = f.read()
    except UnicodeDecodeError as e:  # e.object: the whole file, read at once
        before = e.object[:e.start]  # its lines split as open() splits them (\n, \r\n, \r)
        n = before.replace(b'\r\n', b'\n').replace(b'\r', b'\n').count(b'\n') + 1
        col = e.start - max(before.rfind(b'\n'), before.rfind(b'\r'))
        raise ValueError(f'{path}:{n}: not UTF-8 text ({e.reason} at byte {col} of the line)'
                         ) from None
    lines = text.split('\n')
    return list(enumerate(lines[:-1] if lines[-1] == '' else lines, 1))


# -----------------------------------------------------------------------------
# WOS-46985, as HPT's preprocess_wos.py and data_wos.py build it

WOS_FILE = 'c9ea673d-5542-44c0-ab7b-f1311f7d61df'  # WebOfScience.zip, Mendeley Data 9rw3vkcfy4 v6
# the public-files form is what code written since 2025 fetches; the old form is what Hugging
# Face's web_of_science script used in 2021
WOS_URLS = (f'https://data.mendeley.com/public-files/datasets/9rw3vkcfy4/files/{WOS_FILE}/'
            'file_downloaded', f'https://data.mendeley.com/datasets/9rw3vkcfy4/6/files/{WOS_FILE}/'
            'WebOfScience.zip?dl=1')
BROWSER = 'Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0'


def clean_str(text):
    """HPT's clean_str: strip whitespace, then surrounding `"`; split off the contractions 's 've
    n't 're 'd 'll (case-sensitive); collapse runs of whitespace; lower-case. Punctuation and stop
    words stay (HPT commented out HiAGM's removal of both)."""
    s = text.strip().strip('"')
    for c in ("'s", "'ve", "n't", "'re", "'d", "'ll"):
        s = s.replace(c, ' ' + c)  # HPT's re.sub(r"\'s", " \'s", ...): a plain replacement
    return re.sub(r'\s{2,}', ' ', s).strip().lower()


def wos_split(n):
    """HPT's split: np.random.seed(7) shuffle, then twice sklearn's train_test_split(test_size=0.2,
    random_state=0), in numpy (RandomState(0).permutation, test = its first ceil(0.2 n))."""
    ids = np.arange(n)
    np.random.RandomState(7).shuffle(ids)

    def split(a):
        n_test, n_train = math.ceil(0.2 * len(a)), math.floor((1 - 0.2) * len(a))
        p = np.random.RandomState(0).permutation(len(a))
        return a[p[n_test:n_test + n_train]], a[p[:n_test]]

    train, test = split(ids)
    train, dev = split(train)
    return train, dev, test


def hpt_areas(rows):
    """The area name of each row as preprocess_wos.py gives it. In file order, each code Y1-Y2 keeps
    the distinct (stripped) area names seen so far, the row's own appended first; the row's name
    becomes the first of them that is more frequent in the row's domain over the whole file (HPT
    hard-codes these counts, `stats`: they are the file's own), else stays."""
    count = Counter((r[3].strip(), r[4].strip()) for r in rows)
    seen, out = {}, []
    for r in rows:
        domain, area = r[3].strip(), r[4].strip()
        names = seen.setdefault(r[0] + '-' + r[1], [])  # HPT's code: the raw strings
        if area not in names:
            names.append(area)
        out.append(next((a for a in names if count[domain, a] > count[domain, area]), area))
    return out


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


def _data_xlsx(archive):
    """(name, bytes) of Meta-data/Data.xlsx in WebOfScience.zip (bytes), or None."""
    try:
        with zipfile.ZipFile(io.BytesIO(archive)) as z:
            name = next((n for n in z.namelist() if n.endswith('Meta-data/Data.xlsx')), None)
            return name and (name, z.read(name))
    except zipfile.BadZipFile:
        return None


def _download_wos(path):
    """WebOfScience.zip from the first of WOS_URLS that gives a zip holding Meta-data/Data.xlsx
    (Mendeley answers a script's own User-Agent with a sign-in page)."""
    import http.client
    import urllib.request
    failed = []
    for url in WOS_URLS:
        print(f'downloading {url}', file=sys.stderr)
        try:
            request = urllib.request.Request(url, headers={'User-Agent': BROWSER})
            with urllib.request.urlopen(request, timeout=60) as r:
                blob, kind = r.read(), r.headers.get_content_type()
            if _data_xlsx(blob) is None:
                raise ValueError(f'not a zip holding Meta-data/Data.xlsx ({kind})')
            return write_atomically(path, blob)
        except (OSError, ValueError, http.client.HTTPException) as e:
            failed.append(f'{url}: {e}')
    folder = os.path.dirname(path)
    raise ValueError(f'WOS is not in {folder} and could not be downloaded ({"; ".join(failed)}); '
                     'download WebOfScience.zip from one of these by hand and put it, or Data.txt '
                     f'or Data.xlsx from its Meta-data/, in {folder} (or pass --data-dir)')


def load_wos(folder):
    """WOS-46985 as HPT's preprocess_wos.py + data_wos.py build it, from Data.txt, Data.xlsx or
    WebOfScience.zip (downloaded when none is there): text = clean_str(Abstract); labels Domain ->
    area (named as hpt_areas); ids: domains, then areas, each in order of first appearance, as
    data_wos.py numbers them; HPT's split."""
    txt, xlsx, archive = (os.path.join(folder, f) for f in
                          ('Data.txt', 'Data.xlsx', 'WebOfScience.zip'))
    if os.path.exists(txt):
        source = txt
        numbered = [(n, line.split('\t')) for n, line in read_lines(txt) if line.strip()]
    elif os.path.exists(xlsx):
        source, numbered = xlsx, list(enumerate(_xlsx_rows(Path(xlsx).read_bytes()), 1))
    else:
        if not os.path.exists(archive):
            _download_wos(archive)
        found = _data_xlsx(Path(archive).read_bytes())
        if found is None:
            raise ValueError(f'{archive}: not a zip holding Meta-data/Data.xlsx')
        source, numbered = f'{archive}:{found[0]}', list(enumerate(_xlsx_rows(found[1]), 1))
    header = [c.strip() for c in numbered[0][1]] if numbered else []
    if header[:7] != ['Y1', 'Y2', 'Y', 'Domain', 'area', 'keywords', 'Abstract']:
        raise ValueError(f'{source}:1: expected the header Y1 Y2 Y Domain area keywords '
                         f'Abstract, got {header}')
    for n, r in numbered[1:]:
        if len(r) != 7 or not r[3].strip() or not r[4].strip():
            raise ValueError(f'{source}:{n}: expected 7 tab-separated fields with a Domain and an '
                             f'area, found {len(r)} fields')
    rows = [r for _, r in numbered[1:]]
    parts = wos_split(len(rows))
    if not all(len(p) for p in parts):
        raise ValueError(f'{source}: {len(rows)} rows leave a split empty (HPT splits 64/16/20 %)')
    pairs = list(zip((r[3].strip() for r in rows), hpt_areas(rows)))
    domains = list(dict.fromkeys(d for d, _ in pairs))
    areas = list(dict.fromkeys(pairs))  # in order of first appearance
    owners = Counter(a for _, a in areas)
    # data_wos.py keys labels by name; a name under two domains (or a domain's name) would be one
    # label with two parents there, which is no tree: such an area keeps its domain in its key.
    # The full WOS file has none, so its labels are exactly HPT's.
    key = {(d, a): a if owners[a] == 1 and a not in domains else f'{a} ({d})' for d, a in areas}
    h = Hierarchy({**dict.fromkeys(domains), **{key[p]: p[0] for p in areas}},
                  {**{d: d for d in domains}, **{key[p]: p[1] for p in areas}})
    docs = [(clean_str(r[6]), [h.index[d], h.index[key[d, a]]]) for r, (d, a) in zip(rows, pairs)]
    splits = {s: [docs[i] for i in idx] for s, idx in zip(('train', 'dev', 'test'), parts)}
    return h, splits


# -----------------------------------------------------------------------------
# HiAGM/HPT-format folders

def _taxonomy(path):
    """({label: parent}, {label: its line}) of HiAGM's taxonomy format: one line per parent,
    `parent<TAB>child<TAB>child...`, the root is `Root`."""
    parents, lines = {}, {}
    for n, line in read_lines(path):
        cells = [c.strip() for c in line.split('\t') if c.strip()]
        if len(cells) == 1:
            raise ValueError(f'{path}:{n}: a taxonomy line needs a parent and at least one child')
        for child in cells[1:]:
            if child in parents:
                raise ValueError(f'{path}:{n}: label {child!r} has two parents '
                                 f'({parents[child]!r} on {lines[child]} and {cells[0]!r})')
            parents[child], lines[child] = cells[0], f'{path}:{n}'
    if not parents:
        raise ValueError(f'{path}: empty (expected lines parent<TAB>child<TAB>child...)')
    return parents, lines


def read_taxonomy(path, names=None):
    """A Hierarchy from a taxonomy file; `names` (label -> readable name) for the verbalizer."""
    parents, lines = _taxonomy(path)
    return Hierarchy(parents, names, lines)


def load_hiagm(folder):
    """A folder in the HiAGM format: *_train.json, *_dev.json (or *_val.json), *_test.json (one JSON
    object a line: text in `token` or `doc_token`, label names in `label` or `doc_label`), one
    *.taxonomy (HPT's WOS: wos.taxnomy), and optionally label_names.tsv (code<TAB>readable name).
    The folders HPT's data_*.py write hold label ids instead, with value_dict.pt (id -> name)
    beside them: ids are read through it (resolve_ids). Labels are closed upward."""
    if not os.path.isdir(folder):
        raise ValueError(f'data folder {folder!r} does not exist')
    files = sorted(os.listdir(folder))
    own = os.path.basename(os.path.normpath(folder)) + '_'

    def one(suffixes, what):
        found = [f for f in files if f.endswith(suffixes)]
        if len(found) > 1 and sum(f.startswith(own) for f in found) == 1:
            # HPT's WOS folder also holds preprocess_wos.py's wos_*.json; HPT reads {folder}_*.json
            found = [f for f in found if f.startswith(own)]
        if len(found) != 1:
            raise ValueError(f'{folder!r}: expected one {what} file, found {found or "none"}')
        return os.path.join(folder, found[0])

    names = {}
    names_file = os.path.join(folder, 'label_names.tsv')
    for n, line in read_lines(names_file) if os.path.exists(names_file) else []:
        code, _, name = line.partition('\t')
        if line.strip() and not name.strip():
            raise ValueError(f'{names_file}:{n}: expected code<TAB>name')
        if line.strip():
            names[code.strip()] = name.strip()
    taxonomy = one(('.taxonomy', '.taxnomy'), '*.taxonomy (or wos.taxnomy)')
    parents, lines = _taxonomy(taxonomy)
    ids_file = os.path.join(folder, 'value_dict.pt')
    value_dict = _load_value_dict(ids_file) if os.path.exists(ids_file) else {}
    raw = {}
    for split, suffixes in (('train', ('_train.json',)), ('dev', ('_dev.json', '_val.json')),
                            ('test', ('_test.json',))):
        path = one(suffixes, '*' + ' or *'.join(suffixes))
        raw[split] = [_hiagm_doc(f'{path}:{n}', line, parents, value_dict, taxonomy, ids_file)
                      for n, line in read_lines(path) if line.strip()]
        if not raw[split]:
            raise ValueError(f'{path}: no documents (the {split} split may not be empty)')
        if not any(labels for _, labels in raw[split]):
            raise ValueError(f'{path}: no document has a label (the {split} split)')
    label_of = resolve_ids(value_dict, parents, [labels for docs in raw.values()
                                                 for _, labels in docs], ids_file, taxonomy)
    # the verbalizer's names are HPT's (e.g. 'HIV/AIDS' whole); label_names.tsv still wins
    h = Hierarchy(parents, {**{label_of[i]: value_dict[i] for i in label_of}, **names}, lines)
    return h, {s: [(text, h.closure(h.index[label_of.get(v, v)] for v in labels))
                   for text, labels in docs] for s, docs in raw.items()}


def _hiagm_doc(where, line, parents, value_dict, taxonomy, ids_file):
    """(text, labels) of one line of a split file; labels are taxonomy names or value_dict ids."""
    try:
        d = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f'{where}: malformed JSON ({e.msg})') from None
    d = d if isinstance(d, dict) else {}
    text, labels = d.get('token', d.get('doc_token')), d.get('label', d.get('doc_label'))
    if isinstance(text, list) and all(isinstance(w, str) for w in text):
        text = ' '.join(text)
    if not isinstance(text, str) or not isinstance(labels, list):
        raise ValueError(f'{where}: expected an object with `token` (or `doc_token`): a string or '
                         'a list of strings, and a list `label` (or `doc_label`)')
    for v in labels:
        if not (v in parents if isinstance(v, str) else type(v) is int and v in value_dict):
            raise ValueError(f'{where}: label {json.dumps(v)} is neither a label of {taxonomy} '
                             f'nor an id in {ids_file}')
    return text, labels


def _load_value_dict(path):
    """HPT's value_dict.pt (data_*.py): torch.save of a plain dict label id -> name."""
    with open(path, 'rb') as f:
        try:
            d = torch.load(f, weights_only=True)
        except Exception as e:  # torch raises many kinds for a file that is not its own
            why = str(e).splitlines()[0] if str(e) else repr(e)
            raise ValueError(f'{path}: not readable by torch.load ({why})') from None
    if not isinstance(d, dict) or not all(type(k) is int and isinstance(v, str)
                                          for k, v in d.items()):
        raise ValueError(f'{path}: expected a dict of label id (int) -> name (str), as HPT '
                         'writes it')
    return d


def resolve_ids(value_dict, parents, doc_labels, ids_file, taxonomy):
    """The taxonomy label of each id used in `doc_labels`. HPT's value_dict names are the taxonomy's
    labels (WOS, RCV1) or, for NYT, their last part ('Top/News/World' -> 'World'). A last part
    shared by several labels is told apart by the parent: HPT labels a NYT document with every
    prefix of its path, so every document holding the id also holds its parent's name."""
    last = {}
    for v in parents:
        last.setdefault(v.rsplit('/', 1)[-1], []).append(v)
    with_id = {}
    for labels in doc_labels:
        names = ({value_dict[v] for v in labels if type(v) is int}
                 | {v.rsplit('/', 1)[-1] for v in labels if isinstance(v, str)})
        for v in labels:
            if type(v) is int:
                with_id.setdefault(v, []).append(names)
    out = {}
    for i, docs in sorted(with_id.items()):
        name = value_dict[i]
        found = [name] if name in parents else last.get(name, [])
        if not found:
            raise ValueError(f'{ids_file}: id {i} ({name!r}) names no label of {taxonomy}')
        placed = [c for c in found if len(found) == 1 or parents[c] == 'Root' or all(
            parents[c].rsplit('/', 1)[-1] in names for names in docs)]
        if len(placed) != 1:
            raise ValueError(f'{ids_file}: id {i} ({name!r}) may be any of {found} ({taxonomy}): '
                             "not one of them has its parent's name on every document with this id")
        out[i] = placed[0]
    return out


# -----------------------------------------------------------------------------
# The demo, and load_data

def load_demo(seed=0, sizes=(1200, 300, 300)):
    """A small synthetic HTC set: a 2-3 level topic tree; each document draws words from its topics'
    word lists and a shared background, and one in five lies on two paths."""
    tree = {'science': {'physics': ['quantum', 'optics'], 'biology': ['genetics', 'ecology'],
                        'chemistry': []},
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
        text = [topical[rng.integers(len(topical))] if rng.random() < 0.35
                else background[rng.integers(60)] for _ in range(n)]
        return ' '.join(text), labels

    return hierarchy, {s: [doc() for _ in range(n)]
                       for s, n in zip(('train', 'dev', 'test'), sizes)}


def load_data(name, data_dir=None):
    """'wos', 'nyt', 'rcv1', 'demo', or a path to a HiAGM-format folder. Empty texts and documents
    without labels are kept, and counted in one warning on stderr."""
    if name == 'demo':
        if data_dir:
            raise ValueError(f'--data-dir {data_dir}: --data demo is built in and reads no folder')
        return load_demo()
    source = data_dir or (os.path.join('data', name) if name in ('wos', 'nyt', 'rcv1') else name)
    hierarchy, splits = load_wos(source) if name == 'wos' else load_hiagm(source)
    counts = [f'{s} {sum(not t.strip() for t, _ in docs)} empty texts, '
              f'{sum(not labels for _, labels in docs)} without labels'
              for s, docs in splits.items() if any(not t.strip() or not ls for t, ls in docs)]
    if counts:
        print(f'warning: {source}: {"; ".join(counts)} (kept)', file=sys.stderr)
    return hierarchy, splits


# -----------------------------------------------------------------------------
# The pretrained model a run starts from

def tiny_bert(texts, max_words=8000):
    """A 2-layer, 128-wide BERT with a word-level vocabulary written on the fly (no download)."""
    from transformers import AutoModelForMaskedLM, BertConfig, BertTokenizerFast
    counts = Counter(w for t in texts for w in re.findall(r"\w+|[^\w\s]", t.lower()))
    vocab = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + [
        w for w, _ in counts.most_common(max_words)]
    folder = tempfile.mkdtemp(prefix='lhmix-tiny-')
    with open(os.path.join(folder, 'vocab.txt'), 'w', encoding='utf-8') as f:
        f.write('\n'.join(vocab) + '\n')
    tokenizer = BertTokenizerFast(os.path.join(folder, 'vocab.txt'), do_lower_case=True)
    shutil.rmtree(folder)
    config = BertConfig(vocab_size=len(vocab), hidden_size=128, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=256, max_position_embeddings=512)
    return AutoModelForMaskedLM.from_config(config), tokenizer  # as load_checkpoint builds it


def load_pretrained(name):
    """(masked LM, tokenizer) of a pretrained BERT- or RoBERTa-style model: a local folder or a hub
    id. Never runs code from the folder (trust_remote_code=False, auto_map refused)."""
    from safetensors import SafetensorError
    from transformers import AutoModelForMaskedLM, AutoTokenizer
    path = os.path.expanduser(name)
    # what exists, or has a '/' without being a hub id (org/name), can only be a local folder
    local = os.path.exists(path) or '/' in name and not re.fullmatch(r'\w[\w.-]*/\w[\w.-]*', name)
    if local:
        if not os.path.isdir(path):
            raise ValueError(f'--model {name!r}: '
                             + ('not a folder' if os.path.exists(path) else 'no such folder'))
        name = path
        refuse_remote_code(path)
        for f in os.scandir(path):  # safetensors says 'No such file' of one it may not read
            if f.is_file():
                open(f.path, 'rb').close()
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=False)
        mlm = AutoModelForMaskedLM.from_pretrained(name, trust_remote_code=False)
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as e:
        hint = '' if local else (' (not a local folder; without internet, pass a local folder or '
                                 '--model tiny)')
        raise ValueError(f'could not load model {name!r}{hint}: {one_line(e)}') from None
    # fp32 master weights, even from fp16 files; autocast does the rest
    return mlm.float(), tokenizer


def one_line(e):
    return ' '.join(f'{type(e).__name__}: {e}'.split())


# -----------------------------------------------------------------------------
# Checkpoints: a folder made whole once (config.json, tokenizer files) whose model.safetensors
# (weights, extras and JSON metadata: no pickle) is replaced whole at each save

WEIGHTS = 'model.safetensors'
REQUIRED = (WEIGHTS, 'config.json', 'tokenizer.json', 'tokenizer_config.json')


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def write_atomically(path, text):
    """Writes `path` (str or bytes) whole or not at all, making its folder: a complete, synced
    temporary file beside it is renamed over it, or removed on any failure (disk full, Ctrl-C)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f'.{os.path.basename(path)}.{os.getpid()}.tmp')
    try:
        with open(tmp, 'wb') as f:  # plain open(): the umask's modes
            f.write(text if isinstance(text, bytes) else text.encode('utf-8'))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync(folder)


def _untied(model):
    """The state dict with each tied tensor once (safetensors stores no aliases; BERT's decoder
    weight is its word embeddings), and {alias: the name it is tied to}."""
    tensors, tied, first = {}, {}, {}
    for name, t in model.state_dict().items():
        owner = first.setdefault((t.data_ptr(), t.shape), name)
        if owner == name:
            tensors[name] = t
        else:
            tied[name] = owner
    return tensors, tied


def save_checkpoint(folder, model, tokenizer, info, extra=None):
    """Saves the checkpoint `folder`: config and tokenizer files when it is made, and each time its
    model.safetensors: the weights, `extra` ({name: tensor}) as extra.<name>, and metadata 'lhmix'
    (JSON: what rebuilds the LHMix, and `info`). A kill at any instant leaves the old checkpoint or
    the new one. Non-finite weights: nothing written."""
    from safetensors.torch import save
    bad = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise FloatingPointError(f'the weights are not finite ({bad[0]}'
                                 f'{" and others" if len(bad) > 1 else ""}); {folder} is not saved '
                                 '(try a lower --lr)')
    h = model.hierarchy
    meta = {'arch': model.arch, 'base_vocab': model.base_vocab, 'special': model.special,
            'max_length': model.max_length,
            'hierarchy': {'labels': h.labels, 'names': h.names,
                          'parents': [h.labels[p] if p >= 0 else None for p in h.parent]}, **info}
    tensors = {**_untied(model)[0], **{f'extra.{k}': v for k, v in (extra or {}).items()}}
    blob = save({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
                {'lhmix': json.dumps(meta)})
    if os.path.isdir(folder):
        if not os.path.isfile(os.path.join(folder, 'config.json')):
            raise ValueError(f'{folder}: a folder that is not a checkpoint; not saved into it')
        return write_atomically(os.path.join(folder, WEIGHTS), blob)
    parent, base = os.path.split(os.path.abspath(folder))
    tmp = os.path.join(parent, f'.{base}.{os.urandom(4).hex()}.tmp')  # first save: built beside
    os.makedirs(tmp)
    try:
        model.mlm.config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_atomically(os.path.join(tmp, WEIGHTS), blob)
        for f in os.listdir(tmp):
            _fsync(os.path.join(tmp, f))
        os.rename(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync(parent)


def refuse_remote_code(folder):
    """A config.json or tokenizer_config.json with `auto_map` asks transformers to run Python files
    from the folder: refused, whatever trust_remote_code says and without asking."""
    for path in (os.path.join(folder, name) for name in ('config.json', 'tokenizer_config.json')):
        try:
            with open(path, encoding='utf-8') as f:
                config = json.load(f)
        except (OSError, ValueError):
            continue  # missing or unreadable: reported where it is loaded
        if isinstance(config, dict) and 'auto_map' in config:
            raise ValueError(f'{path}: asks to run custom code (auto_map); refused')


def load_checkpoint(folder, device='cpu', hierarchy=None):
    """(model, tokenizer, meta): meta is the saved info and the model's keys, meta['extra'] the
    extras. With `hierarchy`, the labels must be the data's. Runs no code from the folder; what
    safetensors and transformers find wrong is reported in one line."""
    from safetensors import SafetensorError, safe_open
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer
    if not os.path.isdir(folder):
        raise ValueError(f'{folder}: no such checkpoint folder')
    if os.path.isdir(os.path.join(folder, 'best')):
        raise ValueError(f'{folder}: a run, not a checkpoint: pass {os.path.join(folder, "best")}')
    missing = [f for f in REQUIRED if not os.path.exists(os.path.join(folder, f))]
    if missing:
        raise ValueError(f'{folder}: not an LH-Mix checkpoint (no {", ".join(missing)})')
    refuse_remote_code(folder)
    try:
        open(os.path.join(folder, WEIGHTS), 'rb').close()  # safetensors: 'No such file' if not
        with safe_open(os.path.join(folder, WEIGHTS), 'pt') as f:
            meta = json.loads(f.metadata()['lhmix'])
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta['extra'] = {k[6:]: tensors.pop(k).to(device) for k in list(tensors)
                         if k.startswith('extra.')}
        h = meta['hierarchy']
        mlm = AutoModelForMaskedLM.from_config(AutoConfig.from_pretrained(
            folder, trust_remote_code=False), trust_remote_code=False)
        model = LHMix(mlm, Hierarchy(dict(zip(h['labels'], h['parents'])),
                                     dict(zip(h['labels'], h['names']))),
                      meta['arch'], meta['base_vocab'], meta['special'], meta['max_length'])
        tied = _untied(model)[1]  # strict: every parameter loaded, a tied one from its one copy
        model.load_state_dict({**tensors, **{a: tensors[k] for a, k in tied.items()}})
        if _untied(model)[1] != tied:
            raise ValueError('its tied weights came apart')
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, SafetensorError) as e:
        raise ValueError(f'{folder}: unreadable, truncated or corrupt ({one_line(e)})') from None
    if hierarchy is not None and model.hierarchy.labels != hierarchy.labels:
        raise ValueError(f'{folder}: its labels differ from those of the data')
    return model.to(device), tokenizer, meta
