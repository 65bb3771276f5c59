"""Tests of data.py: HPT's WOS pipeline, HiAGM/HPT-format folders, the demo set.

Every expected value is computed here, independently, by hand or from the rule as HPT's scripts
state it. Nothing is downloaded: files are written to tmp_path.
"""
import io
import json
import os
import re
import zipfile
from xml.sax.saxutils import escape

import numpy as np
import pytest

import data


def write_lines(path, lines):
    path.write_text(''.join(line + '\n' for line in lines), encoding='utf-8')
    return str(path)


# -----------------------------------------------------------------------------
# Data: HPT's WOS split, the raw WOS table, HiAGM folders

# Reference indices from HPT's procedure, computed once with scikit-learn 1.9.1 / numpy 2.4.6 in a
# scratch venv outside the repo:
#   np.random.seed(7); ids = list(range(n)); np.random.shuffle(ids)
#   train, test = train_test_split(np.array(ids), test_size=0.2, random_state=0)
#   train, dev = train_test_split(train, test_size=0.2, random_state=0)
# per part: (size, first 5, last 5, sum)
HPT_SPLITS = {
    46985: [(30070, [43817, 20131, 22368, 39288, 2020], [9969, 15033, 9845, 45162, 4403], 707290864),
            (7518, [14007, 3595, 10052, 36681, 27854], [12068, 24437, 41392, 42263, 43718], 174041775),
            (9397, [539, 27780, 37168, 22575, 17027], [38415, 4448, 35701, 32750, 25472], 222438981)],
    1000: [(640, [893, 648, 469, 973, 228], [455, 766, 358, 877, 704], 325022),
           (160, [273, 367, 352, 31, 38], [150, 437, 330, 254, 540], 76559),
           (200, [919, 721, 570, 815, 439], [246, 67, 870, 468, 148], 97919)],
    37: [(23, [1, 25, 3, 32, 22], [23, 24, 18, 2, 11], 437),
         (6, [28, 10, 31, 15, 21], [10, 31, 15, 21, 5], 110),
         (8, [26, 6, 12, 34, 7], [34, 7, 14, 0, 20], 119)],
}
HPT_SPLIT_12 = ([2, 8, 1, 5, 10, 9, 6], [7, 3], [11, 4, 0])  # the same procedure, n = 12, in full
HPT_SPLIT_16 = ([0, 10, 2, 12, 3, 8, 4, 9, 14], [15, 6, 11], [5, 1, 13, 7])  # n = 16 (sklearn 1.9.1)
HPT_SPLIT_3 = ([1], [2], [0])  # n = 3 (sklearn 1.9.1)


@pytest.mark.parametrize('n', sorted(HPT_SPLITS))
def test_wos_split_equals_hpt(n):
    parts = data.wos_split(n)
    for part, (size, head, tail, total) in zip(parts, HPT_SPLITS[n]):
        assert (len(part), list(part[:5]), list(part[-5:]), int(part.sum())) == (size, head, tail, total)
    assert sorted(np.concatenate(parts).tolist()) == list(range(n))  # disjoint and covering


@pytest.mark.parametrize('n, parts', [(12, HPT_SPLIT_12), (16, HPT_SPLIT_16), (3, HPT_SPLIT_3)])
def test_wos_split_small_n_in_full(n, parts):
    assert [p.tolist() for p in data.wos_split(n)] == [list(p) for p in parts]


# (Y1, Y2, Domain, area, Abstract, the abstract cleaned by hand as HPT's clean_str, the area HPT gives it)
# Counts of the raw names per domain: CS Machine learning 2, Neural networks 3, Deep learning 1,
# Cryptography 1, Security 1; Medical Depression 2, Cancer 3; Psychology Attention 2, Depression 1.
WOS_ROWS = [
    ('1', '0', 'Medical', 'Depression', '"We propose a NEW method, for (deep) learning; it\'s 2x faster!"',
     "we propose a new method, for (deep) learning; it 's 2x faster!",
     'Depression'),  # code 1-0 has seen [Depression]: none more frequent, kept
    ('0', '0', 'CS', 'Machine learning', 'Kernels  in\u00a0\u00a0R are used.   A b c ', 'kernels in r are used. a b c',
     'Machine learning'),  # [Machine learning]
    ('1', '0', 'Medical', 'Cancer ', "  Tumours don't grow;  they've   stopped. ",
     "tumours do n't grow; they 've stopped.", 'Cancer'),  # [Depression, Cancer]: 2 > 3 no
    ('0', '0', 'CS', ' Neural networks', "Parkinson's and Alzheimer's: we'd say we'll, they're",
     "parkinson 's and alzheimer 's: we 'd say we 'll, they 're", 'Neural networks'),  # [ML, NN]: 2 > 3 no
    ('2', '0', 'Psychology', 'Attention', "IT'S DON'T", "it's don't", 'Attention'),  # case-sensitive: not split
    ('1', '0', 'Medical', 'Depression', 'Cells were "stained" with X-ray dye & imaged at 40 \u03bcm.',
     'cells were "stained" with x-ray dye & imaged at 40 \u03bcm.',
     'Cancer'),  # [Depression, Cancer]: Depression 2 > 2 no, Cancer 3 > 2 yes (per domain: 3 in all too)
    ('0', '0', 'CS', 'Neural networks', '"Quoted ""inner"" text"', 'quoted ""inner"" text', 'Neural networks'),
    ('0', '1', 'CS', 'Cryptography', "'data' isn't 'big'", "'data' is n't 'big'", 'Cryptography'),
    ('2', '0', 'Psychology ', 'Attention', 'Gradient descent converges', 'gradient descent converges', 'Attention'),
    ('0', '0', 'CS', 'Neural networks', 'Visual attention and memory', 'visual attention and memory',
     'Neural networks'),
    ('0', '0', 'CS', 'Machine learning', 'Lattice-based encryption & keys', 'lattice-based encryption & keys',
     'Neural networks'),  # [ML, NN]: ML 2 > 2 no, NN 3 > 2 yes
    ('1', '0', 'Medical', 'Cancer', 'Chemotherapy outcomes (2019)', 'chemotherapy outcomes (2019)', 'Cancer'),
    ('2', '0', 'Psychology', 'Depression', 'Selective attention tasks', 'selective attention tasks',
     'Attention'),  # [Attention, Depression]: Attention 2 > 1 (Psychology's own Depression count)
    ('0', '0', 'CS', 'Deep learning', "CNNs' weights", "cnns' weights",
     'Machine learning'),  # [ML, NN, DL]: the FIRST more frequent, ML 2 > 1, not the most frequent NN
    ('0', '1', 'CS', 'Security', 'Keys & RSA', 'keys & rsa', 'Security'),  # [Cryptography, Security]: tie, kept
    ('1', '0', 'Medical', 'Cancer', 'Tumour growth in mice', 'tumour growth in mice', 'Cancer'),
]
# data_wos.py's ids: domains in order of first appearance, then areas (their final names) likewise
WOS_LABELS = ['Medical', 'CS', 'Psychology', 'Depression', 'Machine learning', 'Cancer', 'Neural networks',
              'Attention', 'Cryptography', 'Security']
WOS_HEADER = ['Y1', 'Y2', 'Y', 'Domain', 'area', 'keywords', 'Abstract']


def wos_table(rows=WOS_ROWS):
    return [WOS_HEADER] + [[y1, y2, str(2 * int(y1) + int(y2)), dom, area, 'kw; kw2', text]
                           for y1, y2, dom, area, text, *_ in rows]


def write_data_txt(folder, rows=WOS_ROWS):
    os.makedirs(folder, exist_ok=True)
    return write_lines(folder / 'Data.txt', ['\t'.join(r) for r in wos_table(rows)])


def xlsx_bytes(rows):
    """A minimal .xlsx: text cells as shared strings, Y1/Y2/Y as numbers."""
    ns = 'http://schemas.openxmlformats.org/spreadsheetml/2006/main'
    strings = []
    xml_rows = []
    for r, row in enumerate(rows, 1):
        cells = []
        for col, value in zip('ABCDEFG', row):
            if r > 1 and col in 'ABC':
                cells.append(f'<c r="{col}{r}"><v>{value}</v></c>')
            else:
                strings.append(value)
                cells.append(f'<c r="{col}{r}" t="s"><v>{len(strings) - 1}</v></c>')
        xml_rows.append(f'<row r="{r}">{"".join(cells)}</row>')
    head = '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
    files = {
        '[Content_Types].xml': head + '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
        '<Default Extension="xml" ContentType="application/xml"/>'
        '<Override PartName="/xl/workbook.xml" ContentType="application/'
        'vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/></Types>',
        'xl/workbook.xml': head + f'<workbook xmlns="{ns}" xmlns:r="http://schemas.openxmlformats.org/'
        'officeDocument/2006/relationships"><sheets><sheet name="Sheet1" sheetId="1" r:id="rId1"/></sheets></workbook>',
        'xl/worksheets/sheet1.xml': head + f'<worksheet xmlns="{ns}"><sheetData>{"".join(xml_rows)}</sheetData>'
        '</worksheet>',
        'xl/sharedStrings.xml': head + f'<sst xmlns="{ns}" count="{len(strings)}">'
        + ''.join(f'<si><t xml:space="preserve">{escape(s)}</t></si>' for s in strings) + '</sst>',
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, 'w') as z:
        for name, text in files.items():
            z.writestr(name, text.encode('utf-8'))
    return buf.getvalue()


@pytest.fixture
def no_network(monkeypatch):
    import urllib.request

    def refuse(*args, **kwargs):
        raise OSError('no network in tests')
    monkeypatch.setattr(urllib.request, 'urlopen', refuse)


def test_load_wos_from_data_txt(tmp_path, no_network):
    write_data_txt(tmp_path)
    h, splits = data.load_wos(str(tmp_path))
    assert h.labels == WOS_LABELS and h.names == WOS_LABELS
    assert h.depth == [1, 1, 1, 2, 2, 2, 2, 2, 2, 2] and h.parent == [-1, -1, -1, 0, 1, 0, 1, 2, 1, 1]
    docs = [(clean, [WOS_LABELS.index(dom.strip()), WOS_LABELS.index(area)])
            for _, _, dom, _, _, clean, area in WOS_ROWS]
    for name, idx in zip(('train', 'dev', 'test'), HPT_SPLIT_16):
        assert splits[name] == [docs[i] for i in idx]


@pytest.mark.parametrize('order, labels, areas', [
    (['Small', 'Big', 'Big'], ['CS', 'Small', 'Big'], ['Small', 'Big', 'Big']),  # Small came first: kept
    (['Big', 'Small', 'Big'], ['CS', 'Big'], ['Big', 'Big', 'Big']),  # Big came first: Small merges into it
])
def test_load_wos_area_rule_depends_on_order(tmp_path, order, labels, areas):
    write_data_txt(tmp_path, [('0', '0', 'CS', a, f'text {i}') for i, a in enumerate(order)])
    h, splits = data.load_wos(str(tmp_path))
    assert h.labels == labels
    docs = [(f'text {i}', [0, labels.index(a)]) for i, a in enumerate(areas)]
    assert splits == {s: [docs[i] for i in idx] for s, idx in zip(('train', 'dev', 'test'), HPT_SPLIT_3)}


def test_load_wos_area_name_in_two_domains_stays_two_labels(tmp_path):
    # HPT keys labels by name (one label, two parents): not a tree, so the key carries the domain
    write_data_txt(tmp_path, [('1', '0', 'Medical', 'Depression', 'a'), ('2', '0', 'Psychology', 'Depression', 'b'),
                              ('0', '0', 'CS', 'Depression', 'c')])
    h, splits = data.load_wos(str(tmp_path))
    assert h.labels == ['Medical', 'Psychology', 'CS', 'Depression (Medical)', 'Depression (Psychology)',
                        'Depression (CS)']
    assert h.names == ['Medical', 'Psychology', 'CS', 'Depression', 'Depression', 'Depression']
    assert (splits['train'], splits['dev'], splits['test']) == ([('b', [1, 4])], [('c', [2, 5])], [('a', [0, 3])])


def test_clean_str_by_hand():
    assert data.clean_str(' "He said: ""it\'s"" ok" \n') == 'he said: ""it \'s"" ok'
    assert data.clean_str("won't can't shouldn't") == "wo n't ca n't should n't"
    assert data.clean_str("We'RE THEY'LL a\tb  c") == "we're they'll a\tb c"  # a lone tab stays
    assert data.clean_str("Smith's 'dog'") == "smith 's 'dog'"


def test_load_wos_xlsx_and_zip_parse_like_data_txt(tmp_path, no_network):
    write_data_txt(tmp_path / 'txt')
    (tmp_path / 'xlsx').mkdir()
    (tmp_path / 'xlsx' / 'Data.xlsx').write_bytes(xlsx_bytes(wos_table()))
    (tmp_path / 'zip').mkdir()
    with zipfile.ZipFile(tmp_path / 'zip' / 'WebOfScience.zip', 'w') as z:
        z.writestr('Meta-data/Data.xlsx', xlsx_bytes(wos_table()))
    h0, s0 = data.load_wos(str(tmp_path / 'txt'))
    for folder in ('xlsx', 'zip'):
        h, s = data.load_wos(str(tmp_path / folder))
        assert (h.labels, h.names, h.parent) == (h0.labels, h0.names, h0.parent)
        assert s == s0


def test_load_wos_missing_files_no_download(tmp_path, no_network):
    folder = tmp_path / 'wos'
    folder.mkdir()
    with pytest.raises(FileNotFoundError) as e:
        data.load_wos(str(folder))
    assert str(folder) in str(e.value) and 'Data.txt' in str(e.value)
    assert os.listdir(folder) == []  # no partial download left behind


def test_load_wos_wrong_field_count_names_line(tmp_path):
    rows = ['\t'.join(r) for r in wos_table()]
    rows[3] = rows[3].rsplit('\t', 1)[0]  # line 4: the abstract is missing
    path = write_lines(tmp_path / 'Data.txt', rows)
    with pytest.raises(ValueError, match=re.escape(f'{path}:4:')):
        data.load_wos(str(tmp_path))


def test_load_wos_line_number_counts_blank_lines(tmp_path):
    rows = ['\t'.join(r) for r in wos_table()]
    rows[3] = rows[3].rsplit('\t', 1)[0]
    path = write_lines(tmp_path / 'Data.txt', rows[:2] + [''] + rows[2:])  # the bad row is now line 5
    with pytest.raises(ValueError, match=re.escape(f'{path}:5:')):
        data.load_wos(str(tmp_path))


def write_hiagm(folder, train_lines=None, val_lines=None):
    folder.mkdir(parents=True, exist_ok=True)
    write_lines(folder / 'toy.taxonomy', ['Root\tCCAT\tGCAT', 'CCAT\tC15\tC17', 'C15\tC151'])
    write_lines(folder / 'label_names.tsv', ['CCAT\tCorporate/Industrial', 'C15\tPerformance'])
    write_lines(folder / 'toy_train.json', train_lines or [
        json.dumps({'token': ['profits', 'rose'], 'label': ['C151']}), '',
        json.dumps({'doc_token': 'markets fell', 'doc_label': ['GCAT', 'C17']})])
    write_lines(folder / 'toy_val.json', val_lines or [json.dumps({'token': 'war news', 'label': ['GCAT']})])
    write_lines(folder / 'toy_test.json', [json.dumps({'token': ['a', 'b'], 'label': ['C15', 'GCAT']})])
    return folder


def test_load_hiagm(tmp_path):
    h, splits = data.load_hiagm(str(write_hiagm(tmp_path)))
    assert h.labels == ['CCAT', 'GCAT', 'C15', 'C17', 'C151']
    assert h.names == ['Corporate/Industrial', 'GCAT', 'Performance', 'C17', 'C151']
    assert splits['train'] == [('profits rose', [0, 2, 4]), ('markets fell', [0, 1, 3])]  # closed upward
    assert splits['dev'] == [('war news', [1])]
    assert splits['test'] == [('a b', [0, 1, 2])]


def test_load_hiagm_bad_lines(tmp_path):
    good = json.dumps({'token': 'x', 'label': ['GCAT']})
    bad = write_hiagm(tmp_path / 'bad', val_lines=[good, '{"token": "x", "label": ['])
    with pytest.raises(ValueError, match=re.escape(f"{bad / 'toy_val.json'}:2: malformed JSON")):
        data.load_hiagm(str(bad))
    unknown = write_hiagm(tmp_path / 'unknown', train_lines=[good, good, json.dumps({'token': 'x', 'label': ['NOPE']})])
    with pytest.raises(ValueError, match=re.escape(f"{unknown / 'toy_train.json'}:3: label 'NOPE'")):
        data.load_hiagm(str(unknown))


def test_load_hiagm_json_line_not_an_object(tmp_path):
    folder = write_hiagm(tmp_path, val_lines=['[1, 2]'])
    with pytest.raises(ValueError, match=re.escape(f"{folder / 'toy_val.json'}:1:")):
        data.load_hiagm(str(folder))


def write_hpt_wos(folder, train_labels=([0, 2], [1, 3])):
    """A folder as HPT's preprocess_wos.py + data_wos.py leave it (their own file names and formats)."""
    import torch
    folder.mkdir(parents=True)
    write_lines(folder / 'wos.taxnomy', ['Root\tCS\tMedical', 'CS\tMachine learning', 'Medical\tHIV/AIDS'])
    torch.save({0: 'CS', 1: 'Medical', 2: 'Machine learning', 3: 'HIV/AIDS'}, folder / 'value_dict.pt')
    write_lines(folder / 'WebOfScience_train.json',
                [json.dumps({'token': f'doc {i}', 'label': list(l)}) for i, l in enumerate(train_labels)])
    write_lines(folder / 'WebOfScience_dev.json', [json.dumps({'token': "it 's dev", 'label': [1, 3]})])
    write_lines(folder / 'WebOfScience_test.json', [json.dumps({'token': 'test', 'label': [3]})])
    # preprocess_wos.py's own files lie beside them, label names instead of ids: not read
    for name in ('wos_total.json', 'wos_train.json', 'wos_val.json', 'wos_test.json'):
        write_lines(folder / name, [json.dumps({'doc_token': 'other', 'doc_label': ['CS', 'Machine learning']})])
    return folder


def test_load_hiagm_reads_hpt_wos_folder(tmp_path):
    h, splits = data.load_hiagm(str(write_hpt_wos(tmp_path / 'WebOfScience')))
    assert h.labels == ['CS', 'Medical', 'Machine learning', 'HIV/AIDS']  # the taxonomy's order
    assert h.names == ['CS', 'Medical', 'Machine learning', 'HIV/AIDS']  # value_dict's name, not 'AIDS'
    assert splits == {'train': [('doc 0', [0, 2]), ('doc 1', [1, 3])], 'dev': [("it 's dev", [1, 3])],
                      'test': [('test', [1, 3])]}  # id 3 = HIV/AIDS, closed upward to Medical


def test_load_hiagm_reads_hpt_nyt_folder(tmp_path):
    # data_nyt.py: value_dict keeps a path's last part only; 'Arts' is two labels, told apart by the parent
    import torch
    folder = tmp_path / 'nyt'
    folder.mkdir()
    write_lines(folder / 'nyt.taxonomy', ['Root\tTop/News\tTop/Features', 'Top/News\tTop/News/Arts\tTop/News/World',
                                          'Top/Features\tTop/Features/Arts'])
    torch.save({0: 'News', 1: 'Arts', 2: 'Features', 3: 'Arts', 4: 'World'}, folder / 'value_dict.pt')
    write_lines(folder / 'nyt_train.json', [json.dumps({'token': 'a', 'label': [0, 1]}),
                                            json.dumps({'token': 'b', 'label': [2, 3]})])
    write_lines(folder / 'nyt_dev.json', [json.dumps({'token': 'c', 'label': [0, 4]})])
    write_lines(folder / 'nyt_test.json', [json.dumps({'token': 'd', 'label': [2, 3, 0, 4]})])
    h, splits = data.load_hiagm(str(folder))
    assert h.labels == ['Top/News', 'Top/Features', 'Top/News/Arts', 'Top/News/World', 'Top/Features/Arts']
    assert h.names == ['News', 'Features', 'Arts', 'World', 'Arts']
    assert splits == {'train': [('a', [0, 2]), ('b', [1, 4])], 'dev': [('c', [0, 3])], 'test': [('d', [0, 1, 3, 4])]}
    # 'Arts' without either parent beside it cannot be placed: refused, not guessed
    write_lines(folder / 'nyt_test.json', [json.dumps({'token': 'd', 'label': [1]})])
    with pytest.raises(ValueError, match=re.escape(f"{folder / 'value_dict.pt'}: id 1 ('Arts') may be any of "
                                                   "['Top/News/Arts', 'Top/Features/Arts']")):
        data.load_hiagm(str(folder))


def test_load_hiagm_id_not_in_value_dict(tmp_path):
    folder = write_hpt_wos(tmp_path / 'WebOfScience', train_labels=([0, 2], [1, 9]))
    with pytest.raises(ValueError, match=re.escape(f"{folder / 'WebOfScience_train.json'}:2: label id 9 is not in "
                                                   f"{folder / 'value_dict.pt'}")):
        data.load_hiagm(str(folder))


def test_load_hiagm_value_dict_name_not_in_taxonomy(tmp_path):
    import torch
    folder = write_hpt_wos(tmp_path / 'WebOfScience')
    torch.save({0: 'CS', 1: 'Medical', 2: 'Deep learning', 3: 'HIV/AIDS'}, folder / 'value_dict.pt')
    with pytest.raises(ValueError, match=re.escape(f"{folder / 'value_dict.pt'}: id 2 ('Deep learning') names no "
                                                   f"label of {folder / 'wos.taxnomy'}")):
        data.load_hiagm(str(folder))


def test_load_hiagm_unreadable_value_dict(tmp_path):
    folder = write_hpt_wos(tmp_path / 'WebOfScience')
    (folder / 'value_dict.pt').write_bytes(b'not a torch file')
    with pytest.raises(ValueError, match=re.escape(f"{folder / 'value_dict.pt'}: not readable by torch.load")):
        data.load_hiagm(str(folder))


@pytest.mark.parametrize('line, message', [
    ({'token': 'x', 'label': [11]}, 'label 11 is not a string'),
    ({'token': 'x', 'label': ['GCAT', None]}, 'label null is not a string'),
    ({'token': ['a', 3], 'label': ['GCAT']}, '`token` must be a string or a list of strings'),
    ({'token': 5, 'label': ['GCAT']}, '`token` must be a string or a list of strings'),
])
def test_load_hiagm_wrong_types_name_line(tmp_path, line, message):
    good = json.dumps({'token': 'x', 'label': ['GCAT']})
    folder = write_hiagm(tmp_path, train_lines=[good, json.dumps(line)])
    with pytest.raises(ValueError, match=re.escape(f"{folder / 'toy_train.json'}:2: {message}")):
        data.load_hiagm(str(folder))


@pytest.mark.parametrize('name, line', [('toy_train.json', 3), ('toy_val.json', 1), ('toy.taxonomy', 2),
                                        ('label_names.tsv', 2)])
def test_load_hiagm_not_utf8_names_file_and_line(tmp_path, name, line):
    folder = write_hiagm(tmp_path)
    lines = (folder / name).read_bytes().split(b'\n')
    lines[line - 1] = lines[line - 1][:5] + b'\xe9' + lines[line - 1][5:]  # Latin-1 'é'
    (folder / name).write_bytes(b'\n'.join(lines))
    with pytest.raises(ValueError, match=re.escape(f'{folder / name}:{line}: not UTF-8')):
        data.load_hiagm(str(folder))


def test_load_wos_not_utf8_names_line(tmp_path):
    path = write_data_txt(tmp_path)
    lines = (tmp_path / 'Data.txt').read_bytes().split(b'\n')
    lines[4] += b' caf\xe9'  # line 5
    (tmp_path / 'Data.txt').write_bytes(b'\r\n'.join(lines))  # Windows line ends count as one
    with pytest.raises(ValueError, match=re.escape(f'{path}:5: not UTF-8')):
        data.load_wos(str(tmp_path))


def test_load_hiagm_empty_taxonomy(tmp_path):
    folder = write_hiagm(tmp_path)
    (folder / 'toy.taxonomy').write_text('\n\n', encoding='utf-8')
    with pytest.raises(ValueError, match=re.escape(f"{folder / 'toy.taxonomy'}: empty")):
        data.load_hiagm(str(folder))


@pytest.mark.parametrize('name, split', [('toy_train.json', 'train'), ('toy_val.json', 'dev'),
                                         ('toy_test.json', 'test')])
def test_load_hiagm_empty_split_refused(tmp_path, name, split):
    folder = write_hiagm(tmp_path)
    (folder / name).write_text('\n', encoding='utf-8')
    with pytest.raises(ValueError, match=re.escape(f'{folder / name}: no documents (the {split} split')):
        data.load_hiagm(str(folder))


def test_load_wos_header_only(tmp_path):
    path = write_lines(tmp_path / 'Data.txt', ['\t'.join(WOS_HEADER)])
    with pytest.raises(ValueError, match=re.escape(f'{path}: no rows after the header')):
        data.load_wos(str(tmp_path))


def test_load_wos_too_few_rows_for_a_split(tmp_path):
    # n = 2: test takes ceil(0.4) = 1, then dev ceil(0.2) = 1 of the remaining 1: train is empty
    path = write_data_txt(tmp_path, WOS_ROWS[:2])
    with pytest.raises(ValueError, match=re.escape(f'{path}: 2 rows leave the train split empty')):
        data.load_wos(str(tmp_path))
