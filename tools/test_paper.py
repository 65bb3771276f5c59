"""Tests of PAPER.md and of tools/paper.py, which writes it: the page is the script's output for
today's lhmix.py and README.md; every code line on it is lhmix.py's line where it links; every
tag of lhmix.py is on it; its equations are the paper's, where the paper's LaTeX is at hand. The
page is read here as a reader reads it, by its headings, links and fenced blocks."""
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)
import paper  # noqa: E402

LINK = re.compile(r'^\[[^\]\n]*\]\(lhmix\.py#L(\d+)(?:-L(\d+))?\)([^\n]*)\n```python\n(.*?)^```$',
                  re.M | re.S)
ANCHOR = "README.md#where-this-differs-from-the-authors-code-and-why"  # GitHub's, by hand


def read(*path):
    with open(os.path.join(*path), encoding='utf-8') as f:
        return f.read()


def equations(text):
    """{N: (the '## ' heading above Eq. N, its math blocks, its code blocks as (first line, last
    line, caption, code lines), the titles of its links into the README's differences)}."""
    out, heading = {}, None
    for part in re.split(r'^(?=## |### Eq\. )', text, flags=re.M):
        if part.startswith('## '):
            heading = part.split('\n', 1)[0][3:]
        elif part.startswith('### Eq. '):
            blocks = [(int(a), int(b or a), caption, code.splitlines())
                      for a, b, caption, code in LINK.findall(part)]
            assert part.count('```python') == len(blocks), part  # each block under its link
            out[int(part.split('\n', 1)[0][8:])] = (
                heading, re.findall(r'^```math\n(.*?)^```$', part, re.M | re.S), blocks,
                re.findall(rf'\[([^\]]+)\]\({re.escape(ANCHOR)}\)', part))
    return out


def run_script(folder):
    """tools/paper.py run on a copy of itself in `folder`, beside that folder's files."""
    os.makedirs(folder / 'tools', exist_ok=True)
    shutil.copy(os.path.join(TOOLS, 'paper.py'), folder / 'tools')
    return subprocess.run([sys.executable, str(folder / 'tools' / 'paper.py')],
                          capture_output=True, text=True, timeout=60)


def test_regenerating_the_page_gives_the_committed_file(tmp_path):
    for name in ('lhmix.py', 'README.md'):
        shutil.copy(os.path.join(ROOT, name), tmp_path)
    p = run_script(tmp_path)
    assert (p.returncode, p.stdout, p.stderr) == (0, '', '')
    assert read(tmp_path, 'PAPER.md') == read(ROOT, 'PAPER.md'), \
        'PAPER.md is out of date: run python tools/paper.py'
    assert sorted(os.listdir(tmp_path)) == ['PAPER.md', 'README.md', 'lhmix.py', 'tools']


def test_each_equation_has_code_and_each_code_line_is_the_lhmix_line_it_links_to():
    text, lines = read(ROOT, 'PAPER.md'), read(ROOT, 'lhmix.py').splitlines()
    page = equations(text)
    assert sorted(page) == list(range(1, 9)) and len(text.splitlines()) <= 300
    for n, (_, math, blocks, _) in page.items():
        assert len(math) == 1 and blocks, n
        for first, last, _, code in blocks:
            assert code == lines[first - 1:last], (n, first, last)


def test_every_tag_of_lhmix_is_on_the_page_under_its_equation():
    source = read(ROOT, 'lhmix.py')
    # A trailing comment's `Eq. N`, found by a regex (no tokenizer), then checked against the
    # script's own finder; lhmix.py holds no '#' inside a string, so the regex suffices there.
    found = {(i, int(n)) for i, line in enumerate(source.splitlines(), 1)
             for comment in re.findall(r'^\s*[^\s#][^#]*#(.*)$', line)
             for n in re.findall(r'\bEq\. (\d+)\b(?!-)', comment)}
    assert found == {(line, n) for line, eqs in paper.tags(source).items() for n in eqs}
    page = equations(read(ROOT, 'PAPER.md'))
    for line, n in found:
        assert any(first <= line <= last for first, last, _, _ in page[n][2]), (line, n)
    for n, (_, _, blocks, _) in page.items():  # and no block without its tag
        for first, last, _, _ in blocks:
            assert any(k == n and first <= line <= last for line, k in found), (n, first)


def test_the_quoted_equations_and_their_subsections_are_the_papers():
    papers = glob.glob(os.path.join(ROOT, '..', 'shared', 'paper', '*.txt'))
    if not papers:
        pytest.skip('../shared/paper/ is absent: the equations are not compared with the paper')
    assert len(papers) == 1, papers
    tex = read(papers[0])
    # The paper numbers every `equation` environment in order and has no other numbered kind.
    assert not re.search(r'\\begin\{(align|gather|multline|eqnarray)\*?\}', tex)
    theirs, section, sub, where = {}, 0, 0, None
    for m in re.finditer(r'\\(section|subsection)\{([^}]*)\}|'
                         r'\\begin\{equation\}(.*?)\\end\{equation\}', tex, re.S):
        if m[1] == 'section':
            section, sub = section + 1, 0
        elif m[1] == 'subsection':
            sub += 1
            where = f'Sec. {section}.{sub} {m[2]}'
        else:
            theirs[len(theirs) + 1] = where, re.sub(r'\\label\{[^}]*\}', '', m[3])
    page = equations(read(ROOT, 'PAPER.md'))
    assert sorted(theirs) == sorted(page)
    for n, (heading, math, _, _) in page.items():  # whitespace is all that may differ
        where, latex = theirs[n]
        assert (heading, ' '.join(math[0].split())) == (where, ' '.join(latex.split())), n


SOURCE = '''"""Eq. 1 in a docstring is no tag."""
# Eq. 2 on a line of its own is no tag.


class A:
    def f(self, x):
        y = (x +  # Eq. 1 / Eq. 6: a statement over two lines
             1)
        return y  # Eqs. 2-7 is a summary, and Eq. 5-7 no tag either


def g(x):
    if x:  # Eq. 3, on a header: the header alone
        x = 1
    return x  # Eq. 2, Eq. 4 / Eq. 5; Eq. 7 and Eq. 8
'''
README = """# A project

## Where this differs from the authors' code, and why

- **Alpha.** Eq. 2, and Eq. 2 again.
- **Beta** (Eq. 12); Eqs. 3-4.
- Kept: Eq. 3.
- **Gamma.** Over two lines, naming
  Eq. 5 on the second.

After the list, Eq. 7.

## Next

- **Delta.** Eq. 8.
"""


def test_tags_statements_and_differences_of_a_small_source():
    page, lines = equations(paper.page(SOURCE, README)), SOURCE.splitlines()
    two_lines, header, last = (7, 8, ', in `A.f`:'), (13, 13, ', in `g`:'), (15, 15, ', in `g`:')
    want = {1: [two_lines], 2: [last], 3: [header], 4: [last], 5: [last], 6: [two_lines],
            7: [last], 8: [last]}
    assert {n: [b[:3] for b in blocks] for n, (_, _, blocks, _) in page.items()} == want
    for _, _, blocks, _ in page.values():
        for first, last_line, _, code in blocks:
            assert code == lines[first - 1:last_line]
    assert {n: titles for n, (_, _, _, titles) in page.items() if titles} == {
        2: ['Alpha'], 5: ['Gamma']}
    assert page[8][0] == 'Sec. 4.3 Local Hierarchy Mixup'


def test_what_the_script_refuses(tmp_path):
    for source, readme, message in (
            (SOURCE + 'z = 0  # Eq. 9\n', README, 'lhmix.py line 16: the paper has no Eq. 9'),
            (SOURCE.replace('and Eq. 8', ''), README, 'lhmix.py: no line is tagged Eq. 8'),
            (SOURCE, README.replace('## Where', '## How'),
             '''README.md: no section "## Where this differs from the authors' code, and why"''')):
        with pytest.raises(ValueError) as e:
            paper.page(source, readme)
        assert str(e.value) == message
    # The last refusal as a user meets it: one line, nothing written.
    (tmp_path / 'lhmix.py').write_text(SOURCE)
    (tmp_path / 'README.md').write_text('# A project\n')
    (tmp_path / 'PAPER.md').write_text('before\n')
    p = run_script(tmp_path)
    assert (p.returncode, p.stdout, p.stderr) == (1, '', f'error: {message}\n')
    assert (tmp_path / 'PAPER.md').read_text() == 'before\n'
    assert sorted(os.listdir(tmp_path)) == ['PAPER.md', 'README.md', 'lhmix.py', 'tools']
