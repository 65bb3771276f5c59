"""The data sets (WOS as HPT builds it, HiAGM/HPT folders such as NYT and RCV1-V2, a demo) and the
user's files, read."""
import io
import json
import math
import os
import re
import sys
import zipfile
from collections import Counter
from os.path import exists, join
from pathlib import Path
from xml.etree import ElementTree as ET

import numpy as np
import torch

from lhmix import Hierarchy

SPLITS = 'train', 'dev', 'test'


def read_lines(path, blank=True):
    """Return [(line number, line)] of a UTF-8 file (`-`: stdin), as open() splits it; without
    the blank ones unless `blank`."""
    try:
        with open(sys.stdin.fileno() if path == '-' else path, encoding='utf-8-sig',
                  closefd=path != '-') as f:
            return [(n, s.rstrip('\n')) for n, s in enumerate(f, 1) if blank or s.strip()]
    except UnicodeDecodeError as e:  # Python's own message names no file.
        raise ValueError(f'{path}: not UTF-8 text ({e.reason})') from None


# WOS-46985, as HPT's preprocess_wos.py and data_wos.py build it

# WebOfScience.zip, Mendeley Data 9rw3vkcfy4 v6. The first address is what code fetches since
# 2025; the second is the one Hugging Face's loader used in 2021.
WOS_FILE = 'c9ea673d-5542-44c0-ab7b-f1311f7d61df'
WOS_URLS = (f'https://data.mendeley.com/public-files/datasets/9rw3vkcfy4/files/{WOS_FILE}/'
            'file_downloaded', f'https://data.mendeley.com/datasets/9rw3vkcfy4/6/files/{WOS_FILE}/'
            'WebOfScience.zip?dl=1')
BROWSER = 'Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0'


def clean_str(text):
    """HPT's clean_str. Punctuation and stop words stay (HPT commented out HiAGM's removal)."""
    s = text.strip().strip('"')
    for c in "'s 've n't 're 'd 'll".split():
        s = s.replace(c, ' ' + c)  # HPT's re.sub(r"\'s", " \'s", ...) is a plain replacement.
    return re.sub(r'\s{2,}', ' ', s).strip().lower()


def wos_split(n):
    """Return HPT's split: np.random.seed(7) shuffle, then twice sklearn's
    train_test_split(test_size=0.2, random_state=0), which takes RandomState(0).permutation and
    tests its first ceil(0.2 n)."""
    ids = np.random.RandomState(7).permutation(n)  # RandomState's shuffle of arange(n)

    def split(a):
        # sklearn's floor(0.8 n) train documents are the rest: ceil(0.2 n) + floor(0.8 n) is n
        # in floats too (checked for every n below 10^8).
        n_test = math.ceil(0.2 * len(a))
        p = np.random.RandomState(0).permutation(len(a))
        return a[p[n_test:]], a[p[:n_test]]

    train, test = split(ids)
    return (*split(train), test)


def hpt_areas(rows):
    """Yield each row's (domain, area), the area as preprocess_wos.py names it: the first name
    seen under the row's code Y1-Y2 that is more frequent in its domain in the file (HPT
    hard-codes `stats`), else its own."""
    pairs = [(r[3].strip(), r[4].strip()) for r in rows]
    count, seen = Counter(pairs), {}
    for r, (d, a) in zip(rows, pairs):
        names = seen.setdefault(r[0] + '-' + r[1], {})  # The raw strings, as HPT keys them.
        names[a] = 1  # The names in order of first appearance.
        yield d, next((b for b in names if count[d, b] > count[d, a]), a)


def _xlsx_rows(data):
    """Return [(row number, cells)] of the first sheet of an .xlsx file (bytes)."""
    ns = '{http://schemas.openxmlformats.org/spreadsheetml/2006/main}'

    def txt(e):
        return ''.join(t.text or '' for t in e.iter(ns + 't'))

    def cells(row):
        out = {}
        for c in row.iter(ns + 'c'):
            col = 0  # The letters of its reference (r="AB12") are a number in base 26.
            for ch in re.match('[A-Z]+', c.get('r'))[0]:
                col = 26 * col + ord(ch) - 64
            v, kind = c.findtext(ns + 'v', ''), c.get('t')
            if kind == 'inlineStr':
                out[col] = txt(c)
            else:  # A shared string's index, or a number, whose '.0' Excel adds
                out[col] = shared[int(v)] if kind == 's' else re.sub(r'\.0$', '', v)
        row.clear()
        return [out.get(i, '') for i in range(1, max(out, default=0) + 1)]

    with zipfile.ZipFile(io.BytesIO(data)) as z:
        names, s = z.namelist(), 'xl/sharedStrings.xml'
        shared = [txt(e) for e in ET.fromstring(z.read(s)).iter(ns + 'si')] if s in names else []
        sheet = min(n for n in names if n.startswith('xl/worksheets/sheet'))
        return list(enumerate((cells(e) for _, e in ET.iterparse(z.open(sheet))
                               if e.tag == ns + 'row'), 1))


def _data_xlsx(archive, where):
    """Return (`where`:name, bytes) of Meta-data/Data.xlsx in the zip `archive` (bytes); a
    ValueError naming `where` if there is none."""
    try:
        with zipfile.ZipFile(io.BytesIO(archive)) as z:
            name = next(n for n in z.namelist() if n.endswith('Meta-data/Data.xlsx'))
            return f'{where}:{name}', z.read(name)
    except (zipfile.BadZipFile, StopIteration):
        raise ValueError(f'{where}: not a zip holding Meta-data/Data.xlsx') from None


def _download_wos(path):
    """Downloads WOS to `path` from the first of WOS_URLS that gives the zip. It asks as a
    browser, because Mendeley answers a script's User-Agent with a sign-in page."""
    from http.client import HTTPException
    from urllib.request import Request, urlopen
    failed = []
    for url in WOS_URLS:
        print(f'downloading {url}', file=sys.stderr)
        try:
            with urlopen(Request(url, headers={'User-Agent': BROWSER}), timeout=60) as r:
                blob, kind = r.read(), r.headers.get_content_type()
            _data_xlsx(blob, kind)  # Refused as `kind`: not a zip holding ...
            # Renamed into place once whole: a kill leaves no part of a zip under its name, and a
            # failed write (a full disk) leaves no part beside it.
            part = Path(path + '.part')
            part.parent.mkdir(parents=True, exist_ok=True)
            try:
                part.write_bytes(blob)
                return os.replace(part, path)
            finally:
                part.unlink(missing_ok=True)
        except (OSError, ValueError, HTTPException) as e:
            failed.append(f'{url}: {e}')
    folder = os.path.dirname(path)
    raise ValueError(f'WOS is not in {folder} and could not be downloaded ({"; ".join(failed)}); '
                     'put WebOfScience.zip or its Data.txt or Data.xlsx there (or --data-dir)')


def load_wos(folder):
    """Return WOS-46985 as HPT builds it, from Data.txt, Data.xlsx or WebOfScience.zip
    (downloaded if none is there): clean_str(Abstract), labels Domain -> area, numbered as
    data_wos.py does (domains, then areas, by first appearance)."""
    txt, xlsx, archive = (join(folder, f) for f in ('Data.txt', 'Data.xlsx', 'WebOfScience.zip'))
    if exists(txt):
        source, rows = txt, [(n, line.split('\t')) for n, line in read_lines(txt, False)]
    elif exists(xlsx):
        source, rows = xlsx, _xlsx_rows(Path(xlsx).read_bytes())
    else:
        if not exists(archive):
            _download_wos(archive)
        source, blob = _data_xlsx(Path(archive).read_bytes(), archive)
        rows = _xlsx_rows(blob)
    header = [c.strip() for c in rows[0][1]] if rows else []
    want = 'Y1 Y2 Y Domain area keywords Abstract'
    if header[:7] != want.split():
        raise ValueError(f'{source}:1: expected the header {want}, got {header}')
    for n, r in rows[1:]:
        if len(r) != 7 or not all(map(str.strip, r[3:5])):
            raise ValueError(f'{source}:{n}: expected 7 tab-separated fields with a Domain and an '
                             f'area, found {len(r)}')
    rows = [r for _, r in rows[1:]]
    parts = wos_split(len(rows))
    if not all(map(len, parts)):
        raise ValueError(f'{source}: {len(rows)} rows leave a split empty (HPT splits 64/16/20 %)')
    pairs = list(hpt_areas(rows))
    # Each in order of first appearance; {domain: None} is also the domains' parents.
    domains, areas = dict.fromkeys(d for d, _ in pairs), dict.fromkeys(pairs)
    owners = Counter(a for _, a in areas)
    # data_wos.py keys labels by name, so an area named as another domain's area, or as a domain,
    # keeps its domain in its key here (the full WOS file has none).
    key = {(d, a): a if owners[a] == 1 and a not in domains else f'{a} ({d})' for d, a in areas}
    h = Hierarchy({**domains, **{key[p]: p[0] for p in areas}},
                  {**{d: d for d in domains}, **{key[p]: p[1] for p in areas}})
    docs = [(clean_str(r[6]), [h.index[d], h.index[key[d, a]]]) for r, (d, a) in zip(rows, pairs)]
    return h, {s: [docs[i] for i in idx] for s, idx in zip(SPLITS, parts)}


# HiAGM/HPT-format folders

def read_taxonomy(path):
    """Return ({label: parent}, {label: its line}) of HiAGM's lines
    `parent<TAB>child<TAB>child...`."""
    parents, lines = {}, {}
    for n, line in read_lines(path):
        cells = [c.strip() for c in line.split('\t') if c.strip()]
        if len(cells) == 1:
            raise ValueError(f'{path}:{n}: a taxonomy line needs a parent and at least one child')
        for child in cells[1:]:
            if child in parents:
                raise ValueError(f'{path}:{n}: label {child!r} under {cells[0]!r} is already under '
                                 f'{parents[child]!r} ({lines[child]}): a label has one place')
            parents[child], lines[child] = cells[0], f'{path}:{n}'
    if not parents:
        raise ValueError(f'{path}: empty (expected lines parent<TAB>child<TAB>child...)')
    return parents, lines


def load_hiagm(folder):
    """Return the data set of a folder in HiAGM's format: *_train.json, *_dev.json (or
    *_val.json), *_test.json (a JSON object a line), one *.taxonomy (HPT's WOS: wos.taxnomy),
    label_names.tsv if any; labels by name or, as HPT's data_*.py write them, by id with
    value_dict.pt. Label sets are closed upward."""
    files = sorted(os.listdir(folder))
    own = os.path.basename(os.path.normpath(folder)) + '_'

    def one(*ends):
        got = [f for f in files if f.endswith(ends)]
        # HPT's WOS folder also holds preprocess_wos.py's wos_*.json, and HPT reads
        # {folder}_*.json, so files named for the folder come first.
        got = [f for f in got if f.startswith(own)] or got
        if len(got) != 1:
            raise ValueError(f'{folder}: expected one *{" or *".join(ends)}, found {got or "none"}')
        return join(folder, got[0])

    taxonomy = one('.taxonomy', '.taxnomy')
    parents, lines = read_taxonomy(taxonomy)
    ids_file = join(folder, 'value_dict.pt')
    value_dict = _load_value_dict(ids_file) if exists(ids_file) else {}
    raw = {}
    why = f'not a label of {taxonomy}' + (f' nor an id in {ids_file}' if value_dict else '')
    for split in SPLITS:
        path, raw[split] = one(f'_{split}.json', *['_val.json'] * (split == 'dev')), []
        for n, line in read_lines(path, False):
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f'{path}:{n}: malformed JSON: {e}') from None
            d = d if isinstance(d, dict) else {}
            text, labels = d.get('token', d.get('doc_token')), d.get('label', d.get('doc_label'))
            if isinstance(text, list) and all(isinstance(w, str) for w in text):
                text = ' '.join(text)
            if not isinstance(text, str) or not isinstance(labels, list):
                raise ValueError(f'{path}:{n}: expected an object with `token` (or `doc_token`): a '
                                 'string or a list of strings, and a list `label` (or `doc_label`)')
            for v in labels:
                if not (v in parents if isinstance(v, str) else type(v) is int and v in value_dict):
                    raise ValueError(f'{path}:{n}: label '
                                     f'{json.dumps(v, ensure_ascii=False)} is {why}')
            raw[split].append((text, labels))
        if not raw[split]:
            raise ValueError(f'{path}: no documents (the {split} split may not be empty)')
        if not any(ls for _, ls in raw[split]):
            raise ValueError(f'{path}: no document has a label (the {split} split)')
    # Each id's taxonomy label. HPT's value_dict names the labels (WOS, RCV1) or their last part
    # (NYT: 'Top/News/World' -> 'World'); a shared one is told apart by the parent, since HPT
    # labels a NYT document with every prefix of its path.
    def last(v):
        return value_dict[v] if type(v) is int else v.rsplit('/', 1)[-1]
    doc_labels, label_of = [ls for docs in raw.values() for _, ls in docs], {}
    for i in sorted({v for labels in doc_labels for v in labels if type(v) is int}):
        name = value_dict[i]
        found = [name] if name in parents else [v for v in parents if last(v) == name]
        if not found:
            raise ValueError(f'{ids_file}: id {i} ({name!r}) names no label of {taxonomy}')
        # Several: those whose parent is named on every document with id i.
        placed = found if len(found) < 2 else [c for c in found if parents[c] == 'Root' or all(
            last(parents[c]) in map(last, ls) for ls in doc_labels if i in ls)]
        if len(placed) != 1:
            raise ValueError(f'{ids_file}: id {i} ({name!r}) may be any of {found} ({taxonomy}): '
                             "none has its parent's name on every document with this id")
        label_of[i] = placed[0]
    # The verbalizer's names are HPT's ('HIV/AIDS' whole), RCV1's descriptions, or those of
    # label_names.tsv, which win.
    h = Hierarchy(parents, {**{label_of[i]: value_dict[i] for i in label_of},
                            **label_names(folder, parents)}, lines)
    return h, {s: [(t, h.closure(h.index[label_of.get(v, v)] for v in ls)) for t, ls in docs]
               for s, docs in raw.items()}


RCV1_TOPICS = 'rcv1.topics.hier.orig'  # From RCV1-v2's appendix: each topic's description.


def label_names(folder, parents):
    """Return {label: name} from RCV1_TOPICS (its descriptions, lower-cased here; the authors'
    code looks them up by the lower-cased code) and from label_names.tsv (code<TAB>name), which
    wins."""
    names, code = {}, {v.lower(): v for v in parents}
    topics, tsv = join(folder, RCV1_TOPICS), join(folder, 'label_names.tsv')
    for n, t in read_lines(topics, False) if exists(topics) else []:
        m = re.fullmatch(r'parent:\s*\S+\s+child:\s*(\S+)\s+child-description:\s*(.+)', t.strip())
        if not m:
            raise ValueError(f'{topics}:{n}: expected parent: P child: C child-description: TEXT')
        if m[1].lower() in code:
            names[code[m[1].lower()]] = m[2].lower()
    for n, line in read_lines(tsv, False) if exists(tsv) else []:
        label, _, name = line.partition('\t')
        if not name.strip():
            raise ValueError(f'{tsv}:{n}: expected code<TAB>name')
        names[label.strip()] = name.strip()
    return names


def _load_value_dict(path):
    with open(path, 'rb') as f:  # An unreadable file gets Python's own error.
        # Torch raises many kinds of error for a file not its own; what is not a dict has no
        # items().
        try:
            d = torch.load(f, weights_only=True)
            if all(type(k) is int and isinstance(v, str) for k, v in d.items()):
                return d
        except Exception:
            pass
    raise ValueError(f"{path}: not HPT's torch file of {{label id (int): name (str)}}")


# The demo, and load_data

DEMO_LEAVES = '''science/physics/quantum science/physics/optics science/biology/genetics
science/biology/ecology science/chemistry sports/football sports/tennis sports/cycling
arts/music/jazz arts/music/opera arts/painting arts/cinema business/finance/banking
business/finance/markets business/retail'''  # The path of each leaf.


def load_demo(seed=0, sizes=(1200, 300, 300)):
    """Return the demo's tree and splits: documents of 20 to 49 words from their topics' lists
    and a shared background; one in five has two paths."""
    leaves = [path.split('/') for path in DEMO_LEAVES.split()]
    h = Hierarchy({v: p for path in leaves for p, v in zip([None] + path, path)})
    words = [[v] + [v + c for c in 'abcdefg'] for v in h.labels]  # by label id
    rng = np.random.default_rng(seed)

    def doc():
        chosen = [leaves[rng.integers(len(leaves))]]
        if rng.random() < 0.2:  # One in five also gets a leaf under another top-level topic.
            other = [p for p in leaves if p[0] != chosen[0][0]]
            chosen.append(other[rng.integers(len(other))])
        labels = h.closure(h.index[p[-1]] for p in chosen)
        topical = [w for i in labels for w in words[i]]
        text = [topical[rng.integers(len(topical))] if rng.random() < 0.35
                else f'common{rng.integers(60)}' for _ in range(rng.integers(20, 50))]
        return ' '.join(text), labels

    return h, {s: [doc() for _ in range(n)] for s, n in zip(SPLITS, sizes)}


def load_data(name, data_dir=None):
    """Return (Hierarchy, {split: [(text, label ids)]}) of 'wos', 'nyt', 'rcv1', 'demo', or a
    HiAGM folder. Empty texts and unlabelled documents are kept, and counted on stderr."""
    if name == 'demo':
        if data_dir:
            raise ValueError(f'--data-dir {data_dir}: --data demo is built in and reads no folder')
        return load_demo()
    named = name in ('wos', 'nyt', 'rcv1')
    if not (data_dir or named or os.path.isdir(name)):
        raise ValueError(f'--data {name}: not wos, nyt, rcv1, demo or a folder')
    source = data_dir or (join('data', name) if named else name)
    hierarchy, splits = load_wos(source) if name == 'wos' else load_hiagm(source)
    counts = [f'{s} {sum(not t.strip() for t, _ in docs)} empty texts, '
              f'{sum(not ls for _, ls in docs)} without labels'
              for s, docs in splits.items() if not all(t.strip() and ls for t, ls in docs)]
    if counts:
        print(f'warning: {source}: {"; ".join(counts)} (kept)', file=sys.stderr)
    if name == 'rcv1' and not any(
            exists(join(source, f)) for f in (RCV1_TOPICS, 'label_names.tsv')):
        print(f'warning: {source} has no {RCV1_TOPICS}: the verbalizer reads the topic codes, not '
              'their descriptions (README: Reproducing)', file=sys.stderr)
    return hierarchy, splits


def train_part(docs, fraction, seed):
    """Fig. 4's sparse data: ceil(fraction * n) of the n training documents (all at fraction 1),
    drawn with `seed`, in their order."""
    keep = np.random.default_rng(seed).permutation(len(docs))
    # The count is rounded up, after rounding off float error: 0.07 * 1200 is 84.00000000000001.
    # The ceiling of a share > 0 is at least 1, which that rounding would lose for a tiny one.
    n = max(1, math.ceil(round(fraction * len(keep), 9)))
    return [docs[i] for i in sorted(keep[:n])]
