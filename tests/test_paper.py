"""Tests of PAPER.md and of tools/paper.py, which writes it: the page is the script's output for
today's files; every code line on it is the line it links to; every tag of lhmix.py is on it,
under its equation, and each part shows the lines that compute its terms; where the flat BERT
computes otherwise, it names FlatBERT's method; what it says of the plain ZMLCE paths, of Eq. 6
and of the paper's two steps is true; the sequences it shows are what lhmix.py builds for a small
tree, built here; every link of the page and of the README lands; its equations, sections,
sequences and quotations are the paper's, where the paper's LaTeX is at hand. The page is read
here as a reader reads it, by its headings, links and fenced blocks. Each failure says what is
wrong and what to run."""
import ast
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

from tools import paper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
REGENERATE = 'run python -m tools.paper and commit PAPER.md'
LINK = re.compile(r'^\[[^\]\n]*\]\(([\w.]+\.py)#L(\d+)(?:-L(\d+))?\)([^\n]*)\n'
                  r'```python\n(.*?)^```$', re.M | re.S)


def read(*path):
    with open(os.path.join(*path), encoding='utf-8') as f:
        return f.read()


def parts(text):
    """{'### ' heading: (the '## ' heading above it, its text)} of the page."""
    out, section = {}, None
    for part in re.split(r'^(?=##+ )', text, flags=re.M):
        head = part.split('\n', 1)[0]
        if head.startswith('## '):
            section = head[3:]
        elif head.startswith('### '):
            out[head[4:]] = (section, part)
    return out


def blocks(heading, part):
    """(file, first line, last line, caption, code lines) of each code block under its link."""
    found = [(path, int(a), int(b or a), caption, code.splitlines())
             for path, a, b, caption, code in LINK.findall(part)]
    assert part.count('```python') == len(found), \
        f'PAPER.md, {heading}: a code block without its link above it: {REGENERATE}'
    return found


def table(part):
    """The rows of the part's table, each (first cell, the code of the second)."""
    return re.findall(r'^\| ([^|`]+?) \| `([^`]+)` \|$', part, re.M)


def test_regenerating_the_page_gives_the_committed_file(tmp_path):
    for name in ('lhmix.py', 'README.md', 'train.py', 'runs.py'):
        shutil.copy(os.path.join(ROOT, name), tmp_path)
    p = run_script(tmp_path)
    assert (p.returncode, p.stdout, p.stderr) == (0, '', '')
    assert read(tmp_path, 'PAPER.md') == read(ROOT, 'PAPER.md'), \
        ('PAPER.md is not what tools/paper.py writes from lhmix.py, train.py, runs.py and '
         'README.md: ' + REGENERATE)
    assert sorted(os.listdir(tmp_path)) == ['PAPER.md', 'README.md', 'lhmix.py', 'runs.py',
                                            'tools', 'train.py']


def test_each_code_line_on_the_page_is_the_line_it_links_to():
    page = parts(read(ROOT, 'PAPER.md'))
    want = [f'Eq. {n}' for n in range(1, 9)] + [
        'The hierarchical prompt', 'The local-hierarchy sequence', 'Warm-up', 'Early stopping']
    assert sorted(page) == sorted(want), f'PAPER.md has the parts {sorted(page)}: {REGENERATE}'
    for heading, (_, part) in page.items():
        if heading.startswith('Eq. '):
            assert part.count('```math') == 1, f'PAPER.md, {heading}: not one math block'
        found = blocks(heading, part)
        assert found, f'PAPER.md, {heading}: no code shown: {REGENERATE}'
        for path, first, last, _, code in found:
            assert code == read(ROOT, path).splitlines()[first - 1:last], \
                (f'PAPER.md, {heading}: {path} lines {first}-{last} are not what it shows: '
                 + REGENERATE)


def test_every_tag_of_lhmix_is_on_the_page_under_its_equation():
    source = read(ROOT, 'lhmix.py')
    # A trailing comment's tags, found by a regex (no tokenizer), then checked against the
    # script's own finder; lhmix.py holds no '#' inside a string, so the regex suffices there.
    found = {(i, int(n)) for i, line in enumerate(source.splitlines(), 1)
             for comment in re.findall(r'^\s*[^\s#][^#]*#(.*)$', line)
             for eqs in re.findall(r'\bEqs?\. (\d+(?:(?:, | and )\d+)*)\b(?!-)', comment)
             for n in re.findall(r'\d+', eqs)}
    assert found == {(line, n) for line, eqs in paper.tags(source).items() for n in eqs
                     if isinstance(n, int)}, \
        "tools/paper.py's tag finder and this test's disagree on lhmix.py's tags"
    page = parts(read(ROOT, 'PAPER.md'))
    shown = {n: [(a, b) for path, a, b, _, _ in blocks(f'Eq. {n}', page[f'Eq. {n}'][1])
                 if path == 'lhmix.py'] for n in range(1, 9)}
    for line, n in sorted(found):
        assert any(a <= line <= b for a, b in shown[n]), \
            f'lhmix.py line {line} is tagged Eq. {n}; PAPER.md does not show it there: {REGENERATE}'
    for n, spans in shown.items():  # and no block without its tag
        for a, b in spans:
            assert any(k == n and a <= line <= b for line, k in found), \
                (f'PAPER.md shows lhmix.py lines {a}-{b} under Eq. {n}, where no line is tagged '
                 f'Eq. {n}: {REGENERATE}')


# What each part of the page must show: each term, by the definition whose shown lines compute it
# ('file' for a whole top-level definition, 'file name' for lines inside `name`) and a piece of
# the line; so a term dropped from the tags or from ITEMS, or moved elsewhere, fails here.
TERMS = {
    'The hierarchical prompt': [
        ('the prompt', 'lhmix.py', 'def template('),
        ("the model's prompt", 'lhmix.py LHMix.make_head', 'prefix = template('),
        ('the text and [SEP] after it', 'lhmix.py make_batch',
         'seqs = [np.concatenate([model.prefix, t, ')],
    'Eq. 1': [
        ("f^d's classifier, the MLM head's transform", 'lhmix.py LHMix.make_head',
         'mlm.get_submodule(m) if isinstance(m, str) else m for m in self.family[0]'),
        ('V^d', 'lhmix.py LHMix.make_head', 'valid = torch.arange(1, D + 1)'),
        ('the slot states h^d', 'lhmix.py Classifier.slots',
         'hidden.flatten(0, 1)[starts[:, None] + self.slot_offsets]'),
        ('the slot states of a training step', 'lhmix.py training_loss',
         'model.slots(hidden, starts)'),
        ('the verbalizer', 'lhmix.py LHMix.score', 'self.transform(slot_hidden) @ verbalizer'),
        ('prediction at each depth', 'lhmix.py Classifier.label_scores',
         'masked_fill(~self.valid')],
    'Eq. 2': [
        ('the loss over V^d', 'lhmix.py LHMix.loss', 'zmlce(scores, targets, self.valid)'),
        ('V_pos and V_neg', 'lhmix.py plain_zmlce', 'pos = targets.bool()'),
        ('the first log-sum-exp, in torch', 'lhmix.py plain_zmlce', 'negatives = torch.logsumexp('),
        ('the second log-sum-exp, in torch', 'lhmix.py plain_zmlce',
         'positives = torch.logsumexp('),
        ('the unmixed loss of a step', 'lhmix.py training_loss',
         'loss = model.loss(model.score(h), t)'),
        ('the sum over the depths', 'lhmix.py training_loss', 'loss = loss.sum(-1).mean()'),
        ('the first log-sum-exp, in the kernel', 'lhmix.py _zmlce_kernel',
         'lse_neg = m_neg + tl.log('),
        ('the second log-sum-exp, in the kernel', 'lhmix.py _zmlce_kernel',
         'lse_pos = m_pos + tl.log(')],
    'The local-hierarchy sequence': [
        ('the sequence', 'lhmix.py', 'def local_hierarchy_ids('),
        ('each label set closed upward', 'lhmix.py local_hierarchy_table',
         'keys = [tuple(model.hierarchy.closure('),
        ('the sequences built', 'lhmix.py local_hierarchy_table', 'seqs = [local_hierarchy_ids(')],
    'Eq. 3': [
        ('the [CLS] states', 'lhmix.py local_hierarchy_table', 'model.encode(ids, mask)[:, 0]'),
        ('the cosine', 'lhmix.py hierarchy_similarity',
         'F.cosine_similarity(h_i.float(), h_j.float()'),
        ('s kept in [0, 1]', 'lhmix.py hierarchy_similarity', 's.clamp(0.0, 1.0)'),
        ("text i's row", 'lhmix.py training_loss', 'hier = model.local_hierarchies['),
        ("the partner j's state", 'lhmix.py training_loss',
         'hierarchy_similarity(hier, hier[partner])')],
    'Eq. 4': [
        ('lambda', 'lhmix.py mixup_ratio', '-(beta - 0.5) * s ** alpha + beta'),
        ("each pair's lambda", 'lhmix.py training_loss', 'lam = mixup_ratio(s, ')],
    'Eq. 5': [
        ('the slot states h^d', 'lhmix.py Classifier.slots',
         'hidden.flatten(0, 1)[starts[:, None] + self.slot_offsets]'),
        ('the slot states of a training step', 'lhmix.py training_loss',
         'model.slots(hidden, starts)'),
        ('the mixing', 'lhmix.py mix_hidden', 'torch.lerp(h_j.float(), h_i.float(), lam)'),
        ("h_i and the partner's h_j", 'lhmix.py training_loss', 'mix_hidden(h, h[partner], lam)')],
    'Eq. 6': [('the mixed states scored', 'lhmix.py training_loss', 'p = model.score(h)'),
              ('the verbalizer', 'lhmix.py LHMix.score',
               'self.transform(slot_hidden) @ verbalizer')],
    'Eq. 7': [
        ("each pair's lambda", 'lhmix.py training_loss', 'w = lam.float()[:, None]'),
        ('the two losses mixed', 'lhmix.py training_loss',
         'loss = w * model.loss(p, t) + (1 - w) * model.loss(p, t[partner])'),
        ('the sum over the depths', 'lhmix.py training_loss', 'loss = loss.sum(-1).mean()')],
    'Eq. 8': [
        ('the gradient of a positive and a negative label', 'lhmix.py _zmlce_kernel',
         'tl.where(pos, -grad, grad)'),
        ("the upstream weight, Eq. 7's lambda", 'lhmix.py FusedZMLCE.backward',
         'grad * g.unsqueeze(-1)')],
    'Warm-up': [
        ('the epochs that mix', 'train.py train_epoch',
         "mixing = args.mix != 'none' and epoch >= args.warmup_epochs")],
    'Early stopping': [
        ('the epochs since the best', 'runs.py', 'def since_best('),
        ('the stop', 'train.py fit', 'if runs.since_best(run.history) >= args.early_stop')],
}
# The README's differences that a sequence's or a step's part must link (ITEMS name them).
LINKED = {'The hierarchical prompt': 'kept-from-the-code', 'The local-hierarchy sequence':
          'label-order', 'Warm-up': 'warm-up', 'Early stopping': 'early-stopping'}


def test_each_part_shows_the_lines_that_compute_its_terms():
    page = parts(read(ROOT, 'PAPER.md'))
    for heading, terms in TERMS.items():
        found = blocks(heading, page[heading][1])
        shown = {}  # 'file name': the code lines shown from it
        for path, _, _, caption, code in found:
            inside = re.findall(r'in `([\w.]+)`', caption)
            shown.setdefault(' '.join([path] + inside), []).extend(code)
        for what, where, piece in terms:
            assert any(piece in line for line in shown.get(where, [])), \
                (f'PAPER.md, {heading}: no line of {where} shows {what} ({piece!r}): tag it in '
                 f'lhmix.py, or name it in ITEMS of tools/paper.py, then {REGENERATE}')
    for heading, anchor in LINKED.items():
        assert f'](README.md#{anchor})' in page[heading][1], \
            f'PAPER.md, {heading}: no link to README.md#{anchor} (ITEMS in tools/paper.py)'


def test_where_the_flat_bert_computes_otherwise_the_page_names_its_method():
    """FlatBERT's methods are found in lhmix.py. A part that shows a call of one, or lines of the
    LHMix method it overrides, names it in a sentence on --arch bert; and every FlatBERT method
    the page names is one that FlatBERT defines."""
    source = read(ROOT, 'lhmix.py')
    cls, = [c for c in ast.parse(source).body
            if isinstance(c, ast.ClassDef) and c.name == 'FlatBERT']
    overrides = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
    assert {'make_head', 'score', 'loss'} <= overrides
    text = read(ROOT, 'PAPER.md')
    named = set(re.findall(r'`FlatBERT\.(\w+)`', text))
    assert named <= overrides, f'PAPER.md names FlatBERT.{sorted(named - overrides)}: none such'
    for heading, (_, part) in parts(text).items():
        code = [b for b in blocks(heading, part) if b[0] == 'lhmix.py']
        shown = {m for m in overrides for b in code
                 if re.search(rf'\.{m}\(', '\n'.join(b[4])) or f'`LHMix.{m}`' in b[3]}
        said = ' '.join(re.findall(r'^Under `--arch bert`, [^\n]+\.$', part, re.M))
        for m in sorted(shown):
            assert f'`FlatBERT.{m}`' in said, \
                (f'PAPER.md, {heading}: its code runs FlatBERT.{m} under --arch bert, and the page '
                 f'does not say so: add it to ABOUT or ITEMS in tools/paper.py, then {REGENERATE}')


def test_eq_8_names_every_path_where_autograd_differentiates_plain_zmlce():
    """The conditions under which zmlce runs the fused kernel are read from lhmix.py; where any
    fails, plain_zmlce runs, and Eq. 8's text names each such path."""
    fn, = [f for f in ast.parse(read(ROOT, 'lhmix.py')).body
           if isinstance(f, ast.FunctionDef) and f.name == 'zmlce']
    branch, = [n for n in ast.walk(fn) if isinstance(n, ast.If)]
    paths = {'scores.is_cuda': 'on the CPU', 'triton is not None': 'without Triton',
             'scores.dtype != torch.float64': 'in float64'}
    assert {ast.unparse(v) for v in branch.test.values} == set(paths), \
        "zmlce's conditions changed: name the new path in Eq. 8's ABOUT, and here"
    sentence, = re.findall(r'^.*`plain_zmlce`.*$', parts(read(ROOT, 'PAPER.md'))['Eq. 8'][1], re.M)
    for words in paths.values():
        assert words in sentence, f'PAPER.md, Eq. 8: its plain paths do not name {words!r}'


def test_eq_6_is_shown_on_the_mixing_path_only():
    """Eq. 6 scores mixed states: its line in training_loss is in the branch that mixes."""
    fn, = [f for f in ast.parse(read(ROOT, 'lhmix.py')).body
           if isinstance(f, ast.FunctionDef) and f.name == 'training_loss']
    branch, = [n for n in ast.walk(fn) if isinstance(n, ast.If)
               and ast.unparse(n.test) == 'partner is None']
    mixing = range(branch.orelse[0].lineno, branch.orelse[-1].end_lineno + 1)
    shown = [b for b in blocks('Eq. 6', parts(read(ROOT, 'PAPER.md'))['Eq. 6'][1])
             if '`training_loss`' in b[3]]
    assert shown and all(a in mixing and b in mixing for _, a, b, _, _ in shown), \
        f'PAPER.md, Eq. 6: a line of training_loss outside the Mixup branch (lines {mixing})'


def test_the_page_names_the_papers_two_steps_as_the_paper_does():
    """The paper's two steps are warm-up, then Mixup; early stopping is not one of them."""
    text = read(ROOT, 'PAPER.md')
    opening = text.split('\n## ', 1)[0]
    assert '"two-step training strategy" (warm-up without Mixup, then Mixup)' in opening
    assert 'two training steps' not in text
    assert '"To accelerate the convergence of the model, we adopt a two-step training strategy. ' \
        'Initially, we train the model for 5 epochs without utilizing Mixup' in \
        parts(text)['Warm-up'][1]


def tokens_of(model, tokenizer, ids):
    """Ids as the page writes them: [CLS], [SEP], [Dd], [P], or the word-piece."""
    special = {tokenizer.cls_token_id: '[CLS]', tokenizer.sep_token_id: '[SEP]',
               model.slot_id: '[P]', **{t: f'[D{d}]' for d, t in enumerate(model.depth_ids, 1)}}
    return ' '.join(special.get(int(i)) or tokenizer.convert_ids_to_tokens(int(i)) for i in ids)


def test_the_sequences_on_the_page_are_what_the_code_builds_for_a_small_tree(tmp_path):
    """The page's tree: CS (child Machine Learning) and Math (child Statistics), in that order,
    an uncased vocabulary; the prompt laid out by make_batch, each local hierarchy by
    local_hierarchy_ids after closing the label set upward, as local_hierarchy_table does."""
    import transformers

    import lhmix
    page = parts(read(ROOT, 'PAPER.md'))
    prompt, local = table(page['The hierarchical prompt'][1]), table(
        page['The local-hierarchy sequence'][1])
    assert (len(prompt), len(local)) == (1, 3), f'PAPER.md: the tables of sequences: {REGENERATE}'
    h = lhmix.Hierarchy({'CS': None, 'CS/Machine Learning': 'CS', 'Math': None,
                         'Math/Statistics': 'Math'})
    words = sorted({w for t, _ in prompt for w in t.split()} | {'cs', 'math', 'machine',
                                                                'learning', 'statistics'})
    (tmp_path / 'vocab.txt').write_text('\n'.join(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
                                                  + words))
    tokenizer = transformers.BertTokenizerFast(str(tmp_path / 'vocab.txt'), do_lower_case=True)
    mlm = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=1,
        intermediate_size=16))
    model = lhmix.build_model(mlm, tokenizer, h, 'prompt')
    for text, shown in prompt:
        tokens, _ = lhmix.tokenize(tokenizer, [text], 100)
        batch = lhmix.make_batch(model, tokens, [[]])
        ids = batch['input_ids'][0][batch['attention_mask'][0].bool()]
        assert tokens_of(model, tokenizer, ids) == shown, \
            (f'PAPER.md shows the prompt of {text!r} as {shown!r}, not what make_batch builds: '
            'correct ITEMS in tools/paper.py')
    names = model.name_ids(tokenizer)
    for gold, shown in local:
        labels = h.closure(h.names.index(name) for name in gold.split(', '))
        built = tokens_of(model, tokenizer, lhmix.local_hierarchy_ids(model, labels, names))
        assert built == shown, \
            (f'PAPER.md shows the local hierarchy of {gold} as {shown!r}; the code builds '
             f'{built!r}: correct ITEMS in tools/paper.py')


def slugs(text):
    """The anchors of a Markdown file on GitHub: its headings' slugs (lower case, punctuation
    dropped, spaces as hyphens, a repeat numbered) and its elements' ids."""
    out, seen = set(re.findall(r'<a id="([\w-]+)"></a>', text)), {}
    for heading in re.findall(r'^#+ (.+)$', re.sub(r'^```.*?^```$', '', text, flags=re.M | re.S),
                              re.M):
        slug = re.sub(r'[^\w\- ]', '', heading.lower()).replace(' ', '-')
        out.add(slug + (f'-{seen[slug]}' if slug in seen else ''))
        seen[slug] = seen.get(slug, 0) + 1
    return out


def test_every_link_of_the_page_and_of_the_readme_lands():
    for name in ('PAPER.md', 'README.md'):
        text = re.sub(r'^```.*?^```$', '', read(ROOT, name), flags=re.M | re.S)
        for label, target in re.findall(r'\[([^\]\n]+)\]\(([^)\s]+)\)', text):
            if re.match(r'[a-z]+:', target):
                continue
            path, _, anchor = target.partition('#')
            where = f'{name}: the link [{label}]({target})'
            assert os.path.exists(os.path.join(ROOT, path or name)), f'{where}: no file {path}'
            if not anchor:
                continue
            linked = read(ROOT, path or name)
            lines = re.fullmatch(r'L(\d+)(?:-L(\d+))?', anchor)
            if lines:
                assert int(lines[2] or lines[1]) <= len(linked.splitlines()), \
                    f'{where}: past the end of {path}: {REGENERATE}'
            else:
                assert anchor in slugs(linked), f'{where}: {path or name} has no such anchor'
    # Each link into the README's differences opens the bullet that it names.
    bullets = {anchor: title.rstrip('.') for anchor, title in re.findall(
        r'^- <a id="([\w-]+)"></a>\*\*(.+?)\*\*', read(ROOT, 'README.md'), re.M)}
    for title, anchor in re.findall(r'\[([^\]]+)\]\(README\.md#([\w-]+)\)',
                                    read(ROOT, 'PAPER.md')):
        assert bullets.get(anchor) == title, \
            f'PAPER.md: [{title}](README.md#{anchor}) opens the bullet {bullets.get(anchor)!r}'


def plain(tex):
    """The paper's LaTeX as it reads: \\texttt{x} and \\text{x} as x, no $, quotes as "."""
    tex = re.sub(r'\\(?:texttt|text|textbf|emph)\{([^{}]*)\}', r'\1', tex)
    return tex.replace('$', '').replace('``', '"').replace("''", '"')


def test_the_equations_sections_sequences_and_quotations_are_the_papers():
    papers = glob.glob(os.path.join(ROOT, '..', 'shared', 'paper', '*.txt'))
    if not papers:
        pytest.skip('../shared/paper/ is absent: the page is not compared with the paper')
    assert len(papers) == 1, papers
    tex = read(papers[0])
    # The paper numbers every `equation` environment in order and has no other numbered kind.
    assert not re.search(r'\\begin\{(align|gather|multline|eqnarray)\*?\}', tex)
    theirs, subsections, section, sub, where = {}, set(), 0, 0, None
    for m in re.finditer(r'\\(section|subsection)\{([^}]*)\}|'
                         r'\\begin\{equation\}(.*?)\\end\{equation\}', tex, re.S):
        if m[1] == 'section':
            section, sub = section + 1, 0
        elif m[1] == 'subsection':
            sub += 1
            where = f'Sec. {section}.{sub} {m[2]}'
            subsections.add(where)
        else:
            theirs[len(theirs) + 1] = where, re.sub(r'\\label\{[^}]*\}', '', m[3])
    text = read(ROOT, 'PAPER.md')
    page = parts(text)
    assert sorted(theirs) == sorted(int(h[4:]) for h in page if h.startswith('Eq. '))
    for n, (where, latex) in theirs.items():  # whitespace is all that may differ
        heading, part = page[f'Eq. {n}']
        math, = re.findall(r'^```math\n(.*?)^```$', part, re.M | re.S)
        assert (heading, ' '.join(math.split())) == (where, ' '.join(latex.split())), \
            f"PAPER.md, Eq. {n}: not the paper's LaTeX or subsection (tools/paper.py's EQUATIONS)"
    for heading in re.findall(r'^## (.+)$', text, re.M):
        assert heading in subsections, f'PAPER.md: "{heading}" is no subsection of the paper'
    reads = ' '.join(plain(tex).split())
    paper_lines = {' '.join(line.split()) for line in plain(tex).splitlines()}
    for title in ('The hierarchical prompt', 'The local-hierarchy sequence'):
        shown = re.findall(r'^```text\n(.*?)^```$', page[title][1], re.M | re.S)[0]
        for line in shown.splitlines():
            assert line in paper_lines, \
                f'PAPER.md, {title}: the paper displays no line {line!r} (ITEMS in tools/paper.py)'
    prose = re.sub(r'`[^`\n]*`', '', re.sub(r'^```.*?^```$', '', text, flags=re.M | re.S))
    for quote in re.findall(r'"([^"\n]+)"', prose):
        assert ' '.join(quote.split()) in reads, \
            f'PAPER.md quotes "{quote}": not in the paper (tools/paper.py)'


def run_script(folder):
    """`python -m tools.paper` in `folder`, on a copy of tools/paper.py, beside that folder's
    files."""
    os.makedirs(folder / 'tools', exist_ok=True)
    shutil.copy(os.path.join(ROOT, 'tools', 'paper.py'), folder / 'tools')
    return subprocess.run([sys.executable, '-m', 'tools.paper'], cwd=folder, capture_output=True,
                          text=True, timeout=60)


SOURCE = '''"""Eq. 1 in a docstring is no tag."""
# Eq. 2 on a line of its own is no tag.


class A:
    def f(self, x):
        y = (x +  # Eq. 1 / Eq. 6: a statement over two lines
             1)
        return y  # Eqs. 2-7 is a summary, and Eq. 5-7 no tag either


def g(x):
    if x:  # Eq. 3, on a header: the header alone
        x = 1  # Eqs. 7 and 8: inside the if, so no block with line 17
    a = x  # Eqs. 4, 5 and 8: a block's first statement
    b = a
    return a + b  # Eq. 2, Eq. 4 / Eq. 5; Eq. 7 and Eq. 8
'''
README = """# A project

## Where this differs from the authors' code, and why

- <a id="alpha"></a>**Alpha.** Eq. 2, and Eq. 2 again.
- <a id="beta"></a>**Beta** (Eq. 12); Eqs. 3-4.
- Kept: Eq. 3.
- <a id="gamma"></a>**Gamma.** Over two lines, naming
  Eqs. 5 and 6 on the second.

After the list, Eq. 7.

## Next

- <a id="delta"></a>**Delta.** Eq. 8.
"""


def test_tags_blocks_and_differences_of_a_small_source():
    text, lines = paper.page({'lhmix.py': SOURCE}, README, items=()), SOURCE.splitlines()
    page = parts(text)
    two_lines, header = (7, 8, ', in `A.f`:'), (13, 13, ', in `g`:')
    in_if, block, last = (14, 14, ', in `g`:'), (15, 17, ', in `g`:'), (17, 17, ', in `g`:')
    want = {1: [two_lines], 2: [last], 3: [header], 4: [block], 5: [block], 6: [two_lines],
            7: [in_if, last], 8: [in_if, block]}
    assert {n: [b[1:4] for b in blocks(f'Eq. {n}', page[f'Eq. {n}'][1])] for n in want} == want
    for heading, (_, part) in page.items():
        for _, first, last_line, _, code in blocks(heading, part):
            assert code == lines[first - 1:last_line]
    linked = {2: '[Alpha](README.md#alpha)', 5: '[Gamma](README.md#gamma)',
              6: '[Gamma](README.md#gamma)'}
    assert {n: re.findall(r'^Compared .*$', page[f'Eq. {n}'][1], re.M) for n in range(1, 9)} \
        == {n: [f"Compared with the authors' code: {linked[n]}."] if n in linked else []
            for n in range(1, 9)}
    assert page['Eq. 8'][0] == 'Sec. 4.3 Local Hierarchy Mixup'
    # Two tags of one equation in one block make one block when at most 8 lines apart.
    for fillers, want in ((7, [(2, 10, ('h',))]), (8, [(2, 2, ('h',)), (11, 11, ('h',))])):
        source = ('def h():\n    a = 1  # Eq. 2\n' + '    a += 1\n' * fillers
                  + '    return a  # Eq. 2\n')
        assert paper.tagged_blocks(source) == {2: want}


def test_what_the_script_refuses(tmp_path):
    all_but_8 = 'x = 1  # Eq. 1 / Eq. 2 / Eq. 3 / Eq. 4 / Eq. 5 / Eq. 6 / Eq. 7\n'
    item = dict(section='5.2 Implement Details', before=None, title='Warm-up', text=[],
                code=[('train.py', 'fit')], differences=[])
    for files, readme, items, message in (
            ({'lhmix.py': SOURCE + 'z = 0  # Eq. 9\n'}, README, (),
             'lhmix.py line 18: the paper has no Eq. 9'),
            ({'lhmix.py': all_but_8}, README, (), 'lhmix.py: no line is tagged Eq. 8'),
            ({'lhmix.py': SOURCE}, README.replace('## Where', '## How'), (),
             '''README.md: no section "## Where this differs from the authors' code, and why"'''),
            ({'lhmix.py': SOURCE}, README.replace('<a id="alpha"></a>', ''), (),
             'README.md: the difference "Alpha" names Eq. 2 but has no anchor: start it '
             '- <a id="NAME"></a>**...'),
            ({'lhmix.py': SOURCE, 'train.py': 'def fit():\n    pass\n'}, README,
             ({**item, 'code': [('train.py', '@warm-up')]},),
             'train.py: 0 lines are tagged `@warm-up` (ITEMS in tools/paper.py name it: change '
             'them to match)'),
            ({'lhmix.py': SOURCE, 'train.py': 'def fit():\n    pass\n'}, README,
             ({**item, 'code': [('train.py', 'fits')]},),
             'train.py: 0 definitions are named `fits` (ITEMS in tools/paper.py name it: change '
             'them to match)'),
            ({'lhmix.py': SOURCE, 'train.py': 'def fit():\n    pass\n\n\ndef fit():\n    pass\n'},
             README, (item,),
             'train.py: 2 definitions are named `fit` (ITEMS in tools/paper.py name it: change '
             'them to match)'),
            ({'lhmix.py': SOURCE, 'train.py': 'def fit():\n    pass\n'}, README,
             ({**item, 'differences': ['warm-up']},),
             'README.md: no difference <a id="warm-up"></a> (ITEMS in tools/paper.py link it '
             'from Warm-up)')):
        with pytest.raises(ValueError) as e:
            paper.page(files, readme, items)
        assert str(e.value) == message
    # A refusal as a user meets it: one line, nothing written.
    (tmp_path / 'lhmix.py').write_text(SOURCE)
    (tmp_path / 'README.md').write_text('# A project\n')
    for name in ('train.py', 'runs.py'):
        shutil.copy(os.path.join(ROOT, name), tmp_path)
    (tmp_path / 'PAPER.md').write_text('before\n')
    p = run_script(tmp_path)
    message = '''README.md: no section "## Where this differs from the authors' code, and why"'''
    assert (p.returncode, p.stdout, p.stderr) == (1, '', f'error: {message}\n')
    assert (tmp_path / 'PAPER.md').read_text() == 'before\n'
    assert sorted(os.listdir(tmp_path)) == ['PAPER.md', 'README.md', 'lhmix.py', 'runs.py',
                                            'tools', 'train.py']


def test_a_tagged_line_reworded_with_its_tag_kept_is_shown_reworded():
    """The steps' and sequences' lines are found by their tags alone: the warm-up's line reworded,
    its `@warm-up` kept, gives a page that shows the new line under Warm-up."""
    files = {name: read(ROOT, name) for name in ('lhmix.py', 'train.py', 'runs.py')}
    old = "mixing = args.mix != 'none' and epoch >= args.warmup_epochs  # @warm-up"
    new = "mixing = epoch >= args.warmup_epochs and args.mix != 'none'  # @warm-up"
    assert old in files['train.py']
    files['train.py'] = files['train.py'].replace(old, new)
    part = parts(paper.page(files, read(ROOT, 'README.md')))['Warm-up'][1]
    assert new in part and old not in part
