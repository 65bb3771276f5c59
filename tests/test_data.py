"""Tests of data.py: reading files, HPT's WOS pipeline and its download, taxonomies, HiAGM/HPT-
format folders, checkpoints. Every expected value is computed here, by hand or from the rule as
HPT's scripts state it. Nothing reaches the network: files are written to tmp_path, the download
is served locally."""
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from xml.sax.saxutils import escape

import numpy as np
import pytest
import torch

import data
import lhmix
import runs
from helpers import TEXTS, error, tiny, write_hiagm, write_lines


# Reading files. One that cannot be read (as root: without the capabilities that override
# permissions): Python's own error, naming the file and why, is what train.py and evaluate.py print

@pytest.mark.parametrize('raw, want', [
    (b'\xef\xbb\xbfa\r\nb\rc\n\nd', [(1, 'a'), (2, 'b'), (3, 'c'), (4, ''), (5, 'd')]),
    (b'ab\ncd\xe9f\n', ': not UTF-8 text (invalid continuation byte)'),
    (b'\xef\xbb\xbfa\xff\n', ': not UTF-8 text (invalid start byte)')])
def test_read_lines_as_open_splits_naming_a_file_not_utf8(tmp_path, monkeypatch, raw, want):
    path = tmp_path / 'f'
    path.write_bytes(raw)
    if isinstance(want, list):
        assert data.read_lines(str(path)) == want
    else:
        assert error(lambda: data.read_lines(str(path))).startswith(str(path) + want)
    (tmp_path / 'in').write_bytes(b'x\n\xc3\xa9\n')
    with open(tmp_path / 'in', 'rb') as f:
        monkeypatch.setattr(sys, 'stdin', f)
        assert data.read_lines('-') == [(1, 'x'), (2, '\u00e9')]


def test_unreadable_files_name_the_file_and_why(tmp_path):
    if os.geteuid() == 0 and not shutil.which('setpriv'):
        pytest.skip('running as root without setpriv: permissions cannot be tested')
    with pytest.raises(IsADirectoryError, match=str(tmp_path)):
        data.read_lines(str(tmp_path))
    for folder in ('a', 'b'):
        write_hiagm(tmp_path / folder)
    runs.save_checkpoint(str(tmp_path / 'ck'), *tiny(), {})
    for part in lhmix.tiny_bert(TEXTS):  # the model and its tokenizer
        part.save_pretrained(tmp_path / 'model')
    cases = [('a', 'toy_train.json', 'data.load_data'), ('b', 'toy.taxonomy', 'data.load_data'),
             ('ck', runs.WEIGHTS, 'runs.load_checkpoint'),
             ('model', runs.WEIGHTS, 'lhmix.load_pretrained')]
    for folder, name, _ in cases:
        os.chmod(tmp_path / folder / name, 0)
    script = 'import data, lhmix, runs\n' + ''.join(
        f'try:\n    {load}({str(tmp_path / folder)!r})\n'
        'except (OSError, ValueError) as e:\n    print(e)\n' for folder, _, load in cases)
    drop = ['setpriv', '--inh-caps=-all', '--bounding-set=-all'] if os.geteuid() == 0 else []
    out = subprocess.run(drop + [sys.executable, '-c', script], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.abspath(data.__file__)))
    lines = out.stdout.splitlines()
    assert len(lines) == len(cases), out.stderr[-2000:]
    for line, (folder, name, _) in zip(lines, cases):
        assert str(tmp_path / folder / name) in line and 'Permission denied' in line, line


# HPT's WOS split, the raw WOS table and its download; HiAGM/HPT-format folders, load_data

# Reference indices from HPT's procedure, computed once with scikit-learn 1.9.1 / numpy 2.4.6 in a
# scratch venv outside the repo:
#   np.random.seed(7); ids = list(range(n)); np.random.shuffle(ids)
#   train, test = train_test_split(np.array(ids), test_size=0.2, random_state=0)
#   train, dev = train_test_split(train, test_size=0.2, random_state=0)
# per part: (size, first 5, last 5, sum); for n <= 16 the parts in full
HPT_SPLITS = {
    46985: [
        (30070, [43817, 20131, 22368, 39288, 2020], [9969, 15033, 9845, 45162, 4403], 707290864),
        (7518, [14007, 3595, 10052, 36681, 27854], [12068, 24437, 41392, 42263, 43718], 174041775),
        (9397, [539, 27780, 37168, 22575, 17027], [38415, 4448, 35701, 32750, 25472], 222438981)],
    1000: [(640, [893, 648, 469, 973, 228], [455, 766, 358, 877, 704], 325022),
           (160, [273, 367, 352, 31, 38], [150, 437, 330, 254, 540], 76559),
           (200, [919, 721, 570, 815, 439], [246, 67, 870, 468, 148], 97919)],
    37: [(23, [1, 25, 3, 32, 22], [23, 24, 18, 2, 11], 437),
         (6, [28, 10, 31, 15, 21], [10, 31, 15, 21, 5], 110),
         (8, [26, 6, 12, 34, 7], [34, 7, 14, 0, 20], 119)],
    12: ([2, 8, 1, 5, 10, 9, 6], [7, 3], [11, 4, 0]),
    16: ([0, 10, 2, 12, 3, 8, 4, 9, 14], [15, 6, 11], [5, 1, 13, 7]),
    3: ([1], [2], [0]),
}


@pytest.mark.parametrize('n, parts', HPT_SPLITS.items())
def test_wos_split_equals_hpt(n, parts):
    def summary(part):
        return len(part), list(part[:5]), list(part[-5:]), int(sum(part))
    got = data.wos_split(n)
    assert [summary(p) for p in got] == [p if isinstance(p, tuple) else summary(p) for p in parts]
    assert sorted(np.concatenate(got).tolist()) == list(range(n))  # disjoint and covering


# (Y1, Y2, Domain, area, Abstract, the abstract cleaned by hand as HPT's clean_str, its HPT area).
# Raw names per domain: CS Machine learning 2, Neural networks 3, Deep learning 1, Cryptography 1,
# Security 1; Medical Depression 2, Cancer 3; Psychology Attention 2, Depression 1.
WOS_ROWS = [
    ('1', '0', 'Medical', 'Depression', '"We propose a NEW method, for (deep) learning; it\'s 2x!"',
     "we propose a new method, for (deep) learning; it 's 2x!",
     'Depression'),  # code 1-0 has seen [Depression]: none more frequent, kept
    ('0', '0', 'CS', 'Machine learning', 'Kernels  in\u00a0\u00a0R are used.   A b c ',
     'kernels in r are used. a b c', 'Machine learning'),  # [Machine learning]
    ('1', '0', 'Medical', 'Cancer ', "  Tumours don't grow;  they've   stopped. ",
     "tumours do n't grow; they 've stopped.", 'Cancer'),  # [Depression, Cancer]: 2 > 3 no
    ('0', '0', 'CS', ' Neural networks', "Parkinson's and Alzheimer's: we'd say we'll, they're",
     "parkinson 's and alzheimer 's: we 'd say we 'll, they 're",
     'Neural networks'),  # [ML, NN]: 2 > 3 no
    ('2', '0', 'Psychology', 'Attention', "IT'S DON'T", "it's don't",
     'Attention'),  # case-sensitive: not split
    ('1', '0', 'Medical', 'Depression', 'Cells were "stained" with X-ray dye & at 40 \u03bcm.',
     'cells were "stained" with x-ray dye & at 40 \u03bcm.',
     'Cancer'),  # [Depression, Cancer]: Depression 2 > 2 no, Cancer 3 > 2 yes
    ('0', '0', 'CS', 'Neural networks', '"Quoted ""inner"" text"', 'quoted ""inner"" text',
     'Neural networks'),
    ('0', '1', 'CS', 'Cryptography', "'data' isn't 'big'", "'data' is n't 'big'", 'Cryptography'),
    ('2', '0', 'Psychology ', 'Attention', 'Gradient descent', 'gradient descent', 'Attention'),
    ('0', '0', 'CS', 'Neural networks', 'Visual attention & memory', 'visual attention & memory',
     'Neural networks'),
    ('0', '0', 'CS', 'Machine learning', 'Lattice-based encryption & keys',
     'lattice-based encryption & keys', 'Neural networks'),  # [ML, NN]: ML 2 > 2 no, NN 3 > 2 yes
    ('1', '0', 'Medical', 'Cancer', 'Chemotherapy outcomes (2019)', 'chemotherapy outcomes (2019)',
     'Cancer'),
    ('2', '0', 'Psychology', 'Depression', 'Selective attention tasks', 'selective attention tasks',
     'Attention'),  # [Attention, Depression]: Attention 2 > 1 (Psychology's own Depression count)
    ('0', '0', 'CS', 'Deep learning', "CNNs' weights", "cnns' weights",
     'Machine learning'),  # [ML, NN, DL]: the FIRST more frequent, ML 2 > 1, not the most, NN
    ('0', '1', 'CS', 'Security', 'Keys & RSA', 'keys & rsa', 'Security'),  # [Crypt., Sec.]: a tie
    ('1', '0', 'Medical', 'Cancer', 'Tumour growth in mice', 'tumour growth in mice', 'Cancer'),
]
# data_wos.py's ids: domains in order of first appearance, then areas (their final names) likewise
WOS_LABELS = ['Medical', 'CS', 'Psychology', 'Depression', 'Machine learning', 'Cancer',
              'Neural networks', 'Attention', 'Cryptography', 'Security']
WOS_HEADER = ['Y1', 'Y2', 'Y', 'Domain', 'area', 'keywords', 'Abstract']


def wos_table(rows=WOS_ROWS):
    return [WOS_HEADER] + [[y1, y2, str(2 * int(y1) + int(y2)), dom, area, 'kw; kw2', text]
                           for y1, y2, dom, area, text, *_ in rows]


def write_data_txt(folder, rows=WOS_ROWS):
    os.makedirs(folder, exist_ok=True)
    return write_lines(folder / 'Data.txt', ['\t'.join(r) for r in wos_table(rows)])


def xlsx_bytes(rows, inline=False):  # a minimal .xlsx: text cells as shared (or inline) strings,
    # Y1/Y2/Y as numbers
    ns, strings, xml_rows = 'http://schemas.openxmlformats.org/spreadsheetml/2006/main', [], []
    for r, row in enumerate(rows, 1):
        cells = []
        for col, value in zip('ABCDEFG', row):
            if r > 1 and col in 'ABC':
                cells.append(f'<c r="{col}{r}"><v>{value}</v></c>')
            elif inline:
                cells.append(f'<c r="{col}{r}" t="inlineStr"><is><t>{escape(value)}</t></is></c>')
            else:
                strings.append(value)
                cells.append(f'<c r="{col}{r}" t="s"><v>{len(strings) - 1}</v></c>')
        xml_rows.append(f'<row r="{r}">{"".join(cells)}</row>')
    head = '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
    files = {'xl/worksheets/sheet1.xml': f'{head}<worksheet xmlns="{ns}"><sheetData>'
             f'{"".join(xml_rows)}</sheetData></worksheet>',
             'xl/sharedStrings.xml': f'{head}<sst xmlns="{ns}" count="{len(strings)}">' + ''.join(
                 f'<si><t xml:space="preserve">{escape(s)}</t></si>' for s in strings) + '</sst>'}
    return zip_bytes(files)


def zip_bytes(files):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, 'w') as z:
        for name, content in files.items():
            z.writestr(name, content)
    return buf.getvalue()


def check_wos(h, splits):  # WOS_ROWS as HPT reads them
    assert h.labels == WOS_LABELS and h.names == WOS_LABELS
    assert h.depth == [1] * 3 + [2] * 7 and h.parent == [-1, -1, -1, 0, 1, 0, 1, 2, 1, 1]
    docs = [(clean, [WOS_LABELS.index(dom.strip()), WOS_LABELS.index(area)])
            for _, _, dom, _, _, clean, area in WOS_ROWS]
    assert splits == {s: [docs[i] for i in idx]
                      for s, idx in zip(('train', 'dev', 'test'), HPT_SPLITS[16])}


@pytest.mark.parametrize('form', ['Data.txt', 'Data.xlsx', 'Data.xlsx inline', 'WebOfScience.zip'])
def test_load_wos_each_form_as_hpt(tmp_path, form):
    """Data.txt, Data.xlsx (its text as shared strings, or inline), or the zip holding it."""
    if form == 'Data.txt':
        write_data_txt(tmp_path)
    else:
        xlsx, form = xlsx_bytes(wos_table(), inline=form.endswith('inline')), form.split()[0]
        (tmp_path / form).write_bytes(xlsx if form == 'Data.xlsx' else zip_bytes(
            {'WebOfScience/Meta-data/Data.xlsx': xlsx}))
    check_wos(*data.load_wos(str(tmp_path)))


@pytest.mark.parametrize('rows, labels, names, docs', [
    # the area rule depends on the order: Small came first, kept; Big came first, Small merges
    ([('CS', 'Small'), ('CS', 'Big'), ('CS', 'Big')], ['CS', 'Small', 'Big'], None,
     [[0, 1], [0, 2], [0, 2]]),
    ([('CS', 'Big'), ('CS', 'Small'), ('CS', 'Big')], ['CS', 'Big'], None, [[0, 1]] * 3),
    # HPT keys labels by name (one label, two parents): not a tree, so the key carries the domain
    ([('Medical', 'Depression'), ('Psychology', 'Depression'), ('CS', 'Depression')],
     ['Medical', 'Psychology', 'CS', 'Depression (Medical)', 'Depression (Psychology)',
      'Depression (CS)'], ['Medical', 'Psychology', 'CS'] + ['Depression'] * 3,
     [[0, 3], [1, 4], [2, 5]]),
    # an area named as a domain: its key carries its own domain, apart from the domain's
    ([('CS', 'Medical'), ('Medical', 'Surgery'), ('CS', 'Medical')],
     ['CS', 'Medical', 'Medical (CS)', 'Surgery'], ['CS', 'Medical', 'Medical', 'Surgery'],
     [[0, 2], [1, 3], [0, 2]]),
])
def test_load_wos_area_names(tmp_path, rows, labels, names, docs):
    write_data_txt(tmp_path, [('0', '0', d, a, f'text {i}') for i, (d, a) in enumerate(rows)])
    h, splits = data.load_wos(str(tmp_path))
    assert h.labels == labels and h.names == (names or labels)
    assert splits == {s: [(f'text {i}', docs[i]) for i in idx]
                      for s, idx in zip(('train', 'dev', 'test'), HPT_SPLITS[3])}


def test_clean_str_by_hand():
    assert data.clean_str(' "He said: ""it\'s"" ok" \n') == 'he said: ""it \'s"" ok'
    assert data.clean_str("won't can't shouldn't") == "wo n't ca n't should n't"
    assert data.clean_str("We'RE THEY'LL a\tb  c") == "we're they'll a\tb c"  # a lone tab stays
    assert data.clean_str("Smith's 'dog'") == "smith 's 'dog'"


def bad_field(lines):  # line 4: the abstract is missing
    return lines[:3] + [lines[3].rsplit('\t', 1)[0]] + lines[4:]


def blank(k):  # line 4: field k (3 the Domain, 4 the area) holds only a space
    return lambda ls: ls[:3] + ['\t'.join(' ' if i == k else c for i, c in
                                          enumerate(ls[3].split('\t')))] + ls[4:]


@pytest.mark.parametrize('edit, message', [
    (bad_field, ':4: expected 7 tab-separated fields with a Domain and an area, found 6'),
    # a tab inside the abstract: 8 fields, as many a mistake as 6
    (lambda ls: ls[:3] + [ls[3] + '\tmore'] + ls[4:], ':4: expected 7 tab-separated fields with a '
     'Domain and an area, found 8'),
    (lambda ls: bad_field(ls)[:2] + [''] + bad_field(ls)[2:], ':5: expected 7'),  # blanks count
    (blank(3), ':4: expected 7 tab-separated fields with a Domain and an area, found 7'),
    (blank(4), ':4: expected 7 tab-separated fields with a Domain and an area, found 7'),
    (lambda ls: ls[:1], ': 0 rows leave a split empty'),
    (lambda ls: ls[:3], ': 2 rows leave a split empty'),  # test 1, dev 1 of the other 1
    (lambda ls: [ls[0].replace('Domain', 'Dom')] + ls[1:], ':1: expected the header Y1 Y2 Y'),
])
def test_load_wos_table_errors(tmp_path, edit, message):
    path = write_lines(tmp_path / 'Data.txt', edit(['\t'.join(r) for r in wos_table()]))
    assert error(lambda: data.load_wos(str(tmp_path))).startswith(path + message)


class Site(BaseHTTPRequestHandler):
    """/refused: 403; /moved: a redirect to /zip; /html: a page instead of a zip; /zip: the file."""
    archive, agents = b'', []

    def do_GET(self):
        Site.agents.append(self.headers['User-Agent'])
        code, kind, body = {'/refused': (403, 'text/plain', b'no'), '/moved': (302, '', b''),
                            '/html': (200, 'text/html', b'<html>sign in</html>'),
                            '/zip': (200, 'application/zip', Site.archive)}[self.path]
        self.send_response_only(code)  # send_response would log the request to stderr
        for name, value in (('Location', '/zip'), ('Content-Type', kind),
                            ('Content-Length', str(len(body)))):
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def site(monkeypatch):
    for var in ('http_proxy', 'HTTP_PROXY', 'https_proxy', 'HTTPS_PROXY', 'all_proxy', 'ALL_PROXY'):
        monkeypatch.delenv(var, raising=False)
    server = ThreadingHTTPServer(('127.0.0.1', 0), Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Site.archive, Site.agents = zip_bytes({'Meta-data/Data.xlsx': xlsx_bytes(wos_table())}), []
    yield f'http://127.0.0.1:{server.server_address[1]}'
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize('urls, failures', [
    (('/refused', '/moved'), None),  # the second, through a redirect
    (('/html', '/refused'), ['text/html: not a zip holding Meta-data/Data.xlsx',
                             'HTTP Error 403: Forbidden']),
    (('/html', '/zip'), ['text/html: not a zip holding Meta-data/Data.xlsx',  # a zip without it
                         'application/zip: not a zip holding Meta-data/Data.xlsx'])])
def test_wos_download(tmp_path, site, monkeypatch, urls, failures):
    monkeypatch.setattr(data, 'WOS_URLS', tuple(site + u for u in urls))
    folder = tmp_path / 'wos'
    if failures is None:
        check_wos(*data.load_wos(str(folder)))
        assert os.listdir(folder) == ['WebOfScience.zip']
        assert (folder / 'WebOfScience.zip').read_bytes() == Site.archive
        assert Site.agents == [data.BROWSER] * 3  # the redirect too
        return
    Site.archive = zip_bytes({'Meta-data/Other.xlsx': b'x'})
    why = '; '.join(f'{site}{u}: {f}' for u, f in zip(urls, failures))
    assert error(lambda: data.load_wos(str(folder))) == (
        f'WOS is not in {folder} and could not be downloaded ({why}); put WebOfScience.zip or '
        'its Data.txt or Data.xlsx there (or --data-dir)')
    assert not folder.exists()


def test_wos_download_that_fails_to_write_leaves_no_part(tmp_path, site, monkeypatch):
    def full_disk(*_):  # the zip written, then the disk is full as it is renamed into place
        raise OSError(28, 'No space left on device')
    monkeypatch.setattr(data, 'WOS_URLS', (site + '/zip',))
    monkeypatch.setattr(os, 'replace', full_disk)
    folder = tmp_path / 'wos'
    assert error(lambda: data.load_wos(str(folder))) == (
        f'WOS is not in {folder} and could not be downloaded ({site}/zip: [Errno 28] No space '
        'left on device); put WebOfScience.zip or its Data.txt or Data.xlsx there (or '
        '--data-dir)')
    assert os.listdir(folder) == []


def write_hpt_folder(folder, taxonomy, value_dict, splits):
    """A folder as HPT's data_*.py leave it: label ids, value_dict.pt (id -> name)."""
    folder.mkdir(parents=True)
    write_lines(folder / taxonomy[0], taxonomy[1:])
    torch.save(dict(enumerate(value_dict)), folder / 'value_dict.pt')
    for split, docs in splits.items():
        write_lines(folder / f'{folder.name}_{split}.json', [
            json.dumps({'token': text, 'label': labels}) for text, labels in docs])
    return folder


def write_hpt_wos(folder):
    """HPT's WOS folder (wos.taxnomy is HPT's spelling), beside preprocess_wos.py's own files,
    which hold label names instead of ids and are not read."""
    labels = ['CS', 'Medical', 'Machine learning', 'HIV/AIDS']
    write_hpt_folder(folder, ['wos.taxnomy', 'Root\tCS\tMedical', 'CS\tMachine learning',
                              'Medical\tHIV/AIDS'], labels,
                     {'train': [('doc 0', [0, 2]), ('doc 1', [1, 3])],
                      'dev': [("it 's dev", [1, 3])], 'test': [('test', [3])]})
    for name in ('wos_total.json', 'wos_train.json', 'wos_val.json', 'wos_test.json'):
        write_lines(folder / name, [json.dumps({'doc_token': 'o', 'doc_label': ['CS', 'Medical']})])
    return folder


def test_data_names_a_folder_and_wos_nyt_rcv1_name_their_folder_under_data(tmp_path, monkeypatch):
    """--data mine reads the folder ./mine; --data nyt reads data/nyt (without --data-dir)."""
    monkeypatch.chdir(tmp_path)
    write_hiagm(tmp_path / 'mine')
    write_hiagm(tmp_path / 'data' / 'nyt',
                test_lines=[json.dumps({'token': 'x', 'label': ['C17']})])
    assert data.load_data('mine')[1]['test'] == [('a b', [0, 1, 2])]
    assert data.load_data('nyt')[1]['test'] == [('x', [0, 3])]


def test_hiagm_and_hpt_folders_empty_texts_and_unlabelled_kept_and_counted(tmp_path, capsys):
    h, splits = data.load_data(str(write_hiagm(tmp_path / 'a')))
    assert h.labels == ['CCAT', 'GCAT', 'C15', 'C17', 'C151']
    assert h.names == ['Corporate/Industrial', 'GCAT', 'Performance', 'C17', 'C151']
    assert splits == {'train': [('profits rose', [0, 2, 4]), ('markets fell', [0, 1, 3])],  # closed
                      'dev': [('war news', [1])], 'test': [('a b', [0, 1, 2])]}
    assert capsys.readouterr().err == ''  # nothing to warn of
    doc = {'token': 'x', 'label': ['GCAT']}
    folder = write_hiagm(tmp_path / 'b', [json.dumps(d) for d in (
        {**doc, 'token': []}, doc, {**doc, 'label': []}, {**doc, 'token': ' '})],
        test_lines=[json.dumps(doc), json.dumps({**doc, 'label': []})])
    h, splits = data.load_data('ignored', str(folder))
    assert splits['train'] == [('', [1]), ('x', [1]), ('x', []), (' ', [1])]
    assert splits['test'] == [('x', [1]), ('x', [])]
    assert capsys.readouterr().err == (f'warning: {folder}: train 2 empty texts, 1 without labels; '
                                       'test 0 empty texts, 1 without labels (kept)\n')
    assert error(lambda: data.load_data('demo', str(tmp_path))) == \
        f'--data-dir {tmp_path}: --data demo is built in and reads no folder'
    h, splits = data.load_hiagm(str(write_hpt_wos(tmp_path / 'WebOfScience')))
    assert h.labels == ['CS', 'Medical', 'Machine learning', 'HIV/AIDS']  # the taxonomy's order
    assert h.names == ['CS', 'Medical', 'Machine learning', 'HIV/AIDS']  # value_dict's, not 'AIDS'
    assert splits == {'train': [('doc 0', [0, 2]), ('doc 1', [1, 3])],
                      'dev': [("it 's dev", [1, 3])], 'test': [('test', [1, 3])]}  # closed upward
    # data_nyt.py: value_dict keeps a path's last part; 'Arts' is two labels, told apart by parent
    folder = write_hpt_folder(tmp_path / 'nyt', [
        'nyt.taxonomy', 'Root\tTop/News\tTop/Features', 'Top/News\tTop/News/Arts\tTop/News/World',
        'Top/Features\tTop/Features/Arts'], ['News', 'Arts', 'Features', 'Arts', 'World'],
        {'train': [('train 0', [0, 1]), ('train 1', [2, 3])], 'dev': [('dev 0', [0, 4])],
         'test': [('test 0', [2, 3, 0, 4])]})
    h, splits = data.load_hiagm(str(folder))
    assert h.labels == ['Top/News', 'Top/Features', 'Top/News/Arts', 'Top/News/World',
                        'Top/Features/Arts']
    assert h.names == ['News', 'Features', 'Arts', 'World', 'Arts']
    assert splits == {'train': [('train 0', [0, 2]), ('train 1', [1, 4])],
                      'dev': [('dev 0', [0, 3])], 'test': [('test 0', [0, 1, 3, 4])]}
    # 'Arts' without either parent beside it cannot be placed: refused, not guessed
    write_lines(folder / 'nyt_test.json', [json.dumps({'token': 'd', 'label': [1]})])
    assert error(lambda: data.load_hiagm(str(folder))).startswith(
        f"{folder / 'value_dict.pt'}: id 1 ('Arts') may be any of ['Top/News/Arts', "
        "'Top/Features/Arts']")


RCV1_TOPICS = [  # the format of RCV1-v2's appendix file, rcv1.topics.hier.orig
    'parent: None         child: Root          child-description: Root',
    'parent: Root         child: CCAT          child-description: CORPORATE/INDUSTRIAL',
    'parent: CCAT         child: C15           child-description: PERFORMANCE',
    'parent: C15          child: C151          child-description: ACCOUNTS/EARNINGS',
    'parent: Root         child: GCAT          child-description: GOVERNMENT/SOCIAL']


def test_rcv1_labels_named_by_their_descriptions(tmp_path, capsys):
    folder = write_hiagm(tmp_path / 'rcv1')
    os.remove(folder / 'label_names.tsv')
    assert data.load_data('rcv1', str(folder))[0].names == ['CCAT', 'GCAT', 'C15', 'C17', 'C151']
    assert capsys.readouterr().err == (
        f'warning: {folder} has no rcv1.topics.hier.orig: the verbalizer reads the topic codes, '
        "not their descriptions (README: Reproducing)\n")
    write_lines(folder / 'rcv1.topics.hier.orig', RCV1_TOPICS)
    h, _ = data.load_data('rcv1', str(folder))
    assert h.names == ['corporate/industrial', 'government/social', 'performance', 'C17',
                       'accounts/earnings'] and capsys.readouterr().err == ''
    write_lines(folder / 'label_names.tsv', ['C15\tresults'])  # the user's names win
    assert data.load_data('rcv1', str(folder))[0].names[2] == 'results'


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
    (['Root\tA\tB', 'A\tx', 'B\tx'], 3, 'x', "already under 'A'"),
    (['Root\tA', 'B\tC', 'C\tB'], 2, 'C', 'cycle'),
    (['Root\tA', 'Z\tq'], 2, 'Z', 'refers to nothing')])
def test_bad_taxonomy_names_label_and_line(tmp_path, lines, line_no, label, what):
    path = write_lines(tmp_path / 'bad.taxonomy', lines)
    with pytest.raises(ValueError, match=re.escape(f'{path}:{line_no}:')) as e:
        parents, lines = data.read_taxonomy(path)
        lhmix.Hierarchy(parents, None, lines)
    assert repr(label) in str(e.value) and what in str(e.value)


@pytest.mark.parametrize('lines, message', [
    (['Root\tA\tB', 'Root\tB'], ":2: label 'B' under 'Root' is already under 'Root' ({f}:1)"),
    (['Root\tA\tB', 'A\tx\ty\tx'], ":2: label 'x' under 'A' is already under 'A' ({f}:2)"),
    (['Root\tA\tB', 'A\tx', 'B\tx'], ":3: label 'x' under 'B' is already under 'A' ({f}:2)")])
def test_a_label_twice_in_the_taxonomy_named_with_its_lines(tmp_path, lines, message):
    path = write_lines(tmp_path / 'toy.taxonomy', lines)
    assert error(lambda: data.read_taxonomy(path)) == (path + message.format(f=path)
                                                       + ': a label has one place')


GOOD = json.dumps({'token': 'x', 'label': ['GCAT']})


@pytest.mark.parametrize('name, lines, message', [
    ('toy_val.json', [GOOD, '{"token": "x'],  # the string opens at column 11, character 10
     ':2: malformed JSON: Unterminated string starting at: line 1 column 11 (char 10)'),
    ('toy_val.json', ['[1, 2]'], ':1: expected an object with `token`'),
    ('toy_train.json', [GOOD, GOOD, '{"token": "x", "label": ["Drücker Störung"]}'],
     ':3: label "Drücker Störung" is not a label of {f}/toy.taxonomy'),  # as written
    ('toy_train.json', [GOOD, '{"token": "x", "label": [11]}'], ':2: label 11 is not a label'),
    ('toy_train.json', [GOOD, '{"token": "x", "label": ["GCAT", null]}'], ':2: label null is'),
    ('toy_train.json', [GOOD, '{"token": ["a", 3], "label": ["GCAT"]}'], ':2: expected an object'),
    ('toy_train.json', [GOOD, '{"token": 5, "label": ["GCAT"]}'], ':2: expected an object'),
    ('toy.taxonomy', ['', ''], ': empty'),
    ('toy_train.json', [''], ': no documents (the train split may not be empty)'),
    ('toy_val.json', [json.dumps({'token': 'x', 'label': []})] * 2,
     ': no document has a label (the dev split)'),
    ('toy_test.json', [''], ': no documents (the test split may not be empty)'),
    ('label_names.tsv', ['CCAT\tCorporate', 'C15'], ':2: expected code<TAB>name'),
    # a Latin-1 'é' in line n of the file
    ('toy_train.json', 3, ': not UTF-8'), ('toy.taxonomy', 2, ': not UTF-8'),
    ('label_names.tsv', 2, ': not UTF-8'),
    ('rcv1.topics.hier.orig', ['parent: Root child: CCAT'], ':1: expected parent: P child: C '
     'child-description: TEXT'),
    # HPT's WOS folder: label ids, value_dict.pt
    ('WebOfScience_train.json', ['{"token": "x", "label": [1, 9]}'],
     ':1: label 9 is not a label of {f}/wos.taxnomy nor an id in {f}/value_dict.pt'),
    ('value_dict.pt', {0: 'CS', 1: 'Medical', 2: 'Deep learning', 3: 'HIV/AIDS'},
     ": id 2 ('Deep learning') names no label of {f}/wos.taxnomy"),
    *[('value_dict.pt', bad, ": not HPT's torch file of {{label id (int): name (str)}}")
      for bad in (['not a torch file'], {'0': 'CS'})],
])
def test_load_hiagm_errors_name_file_and_line(tmp_path, name, lines, message):
    hpt = name in ('WebOfScience_train.json', 'value_dict.pt')
    folder = (write_hpt_wos if hpt else write_hiagm)(tmp_path / 'WebOfScience')
    path = folder / name
    if isinstance(lines, dict):
        torch.save(lines, path)
    else:
        if isinstance(lines, int):
            n, lines = lines, path.read_text().splitlines()
            lines[n - 1] = lines[n - 1][:5] + '\udce9' + lines[n - 1][5:]
        write_lines(path, lines)
    msg = error(lambda: data.load_data(str(folder)))
    assert msg.startswith(f'{path}{message.format(f=folder)}')


def test_an_id_shared_by_a_top_level_label_and_a_deeper_one_on_its_own_is_the_top_level_one(
        tmp_path):
    """NYT: 'Features' names both Top/Features (under the taxonomy's Root) and Top/News/Features.
    Documents with id 1 and not 'News' (id 0) beside it hold the top-level label: its parent,
    Root, needs no name on the document."""
    folder = write_hpt_folder(tmp_path / 'nyt', [
        'nyt.taxonomy', 'Root\tTop/News\tTop/Features', 'Top/News\tTop/News/Features'],
        ['News', 'Features'], {'train': [('a', [1]), ('b', [1])], 'dev': [('c', [1])],
                               'test': [('d', [0])]})
    h, splits = data.load_hiagm(str(folder))
    assert h.labels == ['Top/News', 'Top/Features', 'Top/News/Features']
    assert splits == {'train': [('a', [1]), ('b', [1])], 'dev': [('c', [1])], 'test': [('d', [0])]}


@pytest.mark.parametrize('fraction, kept', [(0.07, 84), (0.001, 2), (0.5, 600), (1.0, 1200),
                                             (1e-13, 1)])
def test_a_training_fraction_keeps_the_ceiling_of_its_share_float_error_aside(fraction, kept):
    """Fig. 4's --train-fraction keeps ceil(fraction * 1200) of 1200 training documents, by hand:
    0.07 keeps 84 (in floats 0.07 * 1200 is 84.00000000000001), 0.001 keeps 2 (of 1.2), 1e-13
    keeps 1 (of 1.2e-10)."""
    assert len(data.train_part(list(range(1200)), fraction, 0)) == kept


# The demo

def test_the_demo_is_its_tree_and_documents_as_the_readme_and_docstring_say():
    """23 labels of depth 3 (README: Quick start); 1200, 300 and 300 documents of 20 to 49 words,
    each word a topic's (its label or the label and a letter a-g) or common0 to common59; each
    document on one leaf's path or, about one in five, two under different top-level topics."""
    h, splits = data.load_demo()
    assert (len(h), h.num_depths, [len(d) for d in splits.values()]) == (23, 3, [1200, 300, 300])
    docs = [d for split in splits.values() for d in split]
    assert {len(t.split()) for t, _ in docs} == set(range(20, 50))
    for text, labels in docs:
        words = {f'common{i}' for i in range(60)} | {h.labels[v] + c for v in labels
                                                     for c in ['', *'abcdefg']}
        assert set(text.split()) <= words and labels == h.closure(labels)
    tops = [len({h.path(v)[0] for v in labels}) for _, labels in docs]
    assert set(tops) == {1, 2} and abs(tops.count(2) - 0.2 * len(docs)) < 5 * (0.16 * 1800) ** 0.5
