"""Writes PAPER.md: the paper's Eqs. 1-8, the two sequences it displays, and its two-step training
and early stopping, which it gives in words, in its order, each beside the lines that compute it.
Run it again whenever a shown line moves or changes, or the README's list of differences changes
(tests/test_paper.py fails until PAPER.md matches):

    python -m tools.paper

Every line shown is found by a tag or a definition's name, never by its text. An equation's tag
is `Eq. N`, or `Eqs. N and M` (`Eqs. N, M and K`), in a comment that trails code in lhmix.py; one
comment may hold several (`# Eq. 1 / Eq. 6: ...` tags Eqs. 1 and 6). A range such as `Eqs. 2-7`
is a summary, not a tag, and neither is a comment on a line of its own or a docstring. A sequence's
or a step's tag is a name, `@prompt`, trailing code in a file that ITEMS names; ITEMS shows its
tagged statements, or a definition whole, by its name. The page shows the whole statement that
holds a tagged line (of a compound statement, the header alone), verbatim, linked to its lines.
Two tags of one name on statements of one block, at most 8 lines apart, show as one block with the
statements between: so a tag on a short block's first and last statements covers the block.
Each bullet of the README's list of differences starts with an anchor and a bold title,
`- <a id="NAME"></a>**Title.**`; one that names `Eq. N` as a tag would is linked from Eq. N, and
ITEMS link bullets by their anchors.
"""
import ast
import io
import os
import re
import sys
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAG = re.compile(r'\bEqs?\. (\d+(?:(?:, | and )\d+)*)\b(?!-)')
NAMED = re.compile(r'(?<!\S)@([a-z][\w-]*)')  # a sequence's or a step's tag: `@prompt`
BLOCK = 8  # the most lines from one tagged statement to the next that show as one block
DIFFERENCES = "Where this differs from the authors' code, and why"  # the README's section
BULLET = re.compile(r'^- (?:<a id="([\w-]+)"></a>)?\*\*(.+?)\*\*(.*?)(?=^\S|\Z)', re.M | re.S)

# The paper's Eqs. 1-8, in its order: the subsection that holds each, and the LaTeX of its equation
# environment line by line (whitespace aside, as the paper writes it; its \label left out). GitHub
# renders a ```math block; a $$ block would lose \| and \{.
EQUATIONS = {
    1: ('3.2 Hierarchical Prompt for HTC', (
        r'\mathbf{p}^d=f_{\mathcal{V}^d}^d(\mathbf{h}_{\texttt{[MASK]}}^d),',
    )),
    2: ('3.2 Hierarchical Prompt for HTC', (
        r'\mathcal{L}^d (\mathbf{p}^d, \mathcal{V}^d_{pos}, \mathcal{V}^d_{neg})'
        r' = \log (1+\sum_{v \in \mathcal{V}^d_{neg}}e^{\mathbf{p}^d_{\cdot v}})'
        r' + \log (1+\sum_{v \in \mathcal{V}^d_{pos}}e^{-\mathbf{p}^d_{\cdot v}}),',
    )),
    3: ('4.1 Local Hierarchy Correlation', (
        r'\begin{aligned}',
        r'    s & = 0.5\left(\frac{\mathbf{h}_{i\texttt{[CLS]}} \cdot \mathbf{h}_{j\texttt{[CLS]}}}'
        r'{\|\mathbf{h}_{i\texttt{[CLS]}}\| \|\mathbf{h}_{j\texttt{[CLS]}}\|} + 1\right),',
        r'\end{aligned}',
    )),
    4: ('4.2 Local Hierarchy Correlation Guided Mixup Ratio', (
        r'\lambda = -(\beta - 0.5)s^\alpha + \beta,',
    )),
    5: ('4.3 Local Hierarchy Mixup', (
        r'\begin{aligned}',
        r'    \widetilde{\mathbf{h}}^d_{\texttt{[MASK]}} = \lambda \mathbf{h}^d_{i\texttt{[MASK]}}'
        r' + (1 - \lambda) \mathbf{h}^d_{j\texttt{[MASK]}}.',
        r'\end{aligned}',
    )),
    6: ('4.3 Local Hierarchy Mixup', (
        r'\widetilde{\mathbf{p}}^d'
        r' = f_{\mathcal{V}^d}^d(\widetilde{\mathbf{h}}^d_{\texttt{[MASK]}}).',
    )),
    7: ('4.3 Local Hierarchy Mixup', (
        r'\begin{aligned}',
        r'    & \widetilde{\mathcal{L}}^d (\lambda, \widetilde{\mathbf{p}}^d,'
        r' \mathcal{V}^d_{i, pos}, \mathcal{V}^d_{i, neg}, \mathcal{V}^d_{j, pos},'
        r' \mathcal{V}^d_{j, neg})\\',
        r'    = & \lambda\mathcal{L}^d_i (\widetilde{\mathbf{p}}^d, \mathcal{V}^d_{i, pos},'
        r' \mathcal{V}^d_{i, neg}) + (1 - \lambda) \mathcal{L}^d_j (\widetilde{\mathbf{p}}^d,'
        r' \mathcal{V}^d_{j, pos}, \mathcal{V}^d_{j, neg}).',
        r'\end{aligned}',
    )),
    8: ('4.3 Local Hierarchy Mixup', (
        r'\begin{aligned}',
        r'    & \nabla_\theta \biggl(\lambda \biggl('
        r'\log (1+\sum_{v \in \mathcal{V}^d_{i, neg}}e^{ \widetilde{\mathbf{p}}^d_{\cdot v}})'
        r' + \log (1+\sum_{v \in \mathcal{V}^d_{i, pos}}e^{-\widetilde{\mathbf{p}}^d_{\cdot v}})'
        r' \biggr)\\',
        r'    & + (1 - \lambda) \biggl('
        r'\log (1+\sum_{v \in \mathcal{V}^d_{j, neg}}e^{\widetilde{\mathbf{p}}^d_{\cdot v}})'
        r' + \log (1+\sum_{v \in \mathcal{V}^d_{j, pos}}e^{-\widetilde{\mathbf{p}}^d_{\cdot v}})'
        r' \biggr) \biggr) \\',
        r'    = & \lambda('
        r'\frac{\sum_{v \in \mathcal{V}^d_{i, neg}}e^{\widetilde{\mathbf{p}}^d_{\cdot v}}}'
        r'{1 + \sum_{v \in \mathcal{V}^d_{i, neg}}e^{\widetilde{\mathbf{p}}^d_{\cdot v}}}'
        r' - \frac{\sum_{v \in \mathcal{V}^d_{i, pos}}e^{-\widetilde{\mathbf{p}}^d_{\cdot v}}}'
        r'{1 + \sum_{v \in \mathcal{V}^d_{i, pos}}e^{-\widetilde{\mathbf{p}}^d_{\cdot v}}}) \\',
        r'    & + (1 - \lambda)('
        r'\frac{\sum_{v \in \mathcal{V}^d_{j, neg}}e^{\widetilde{\mathbf{p}}^d_{\cdot v}}}'
        r'{1 + \sum_{v \in \mathcal{V}^d_{j, neg}}e^{\widetilde{\mathbf{p}}^d_{\cdot v}}}'
        r' - \frac{\sum_{v \in \mathcal{V}^d_{j, pos}}e^{-\widetilde{\mathbf{p}}^d_{\cdot v}}}'
        r'{1 + \sum_{v \in \mathcal{V}^d_{j, pos}}e^{-\widetilde{\mathbf{p}}^d_{\cdot v}}})',
        r'\end{aligned}',
    )),
}

# What each equation does and which shown line computes which term; then, where --arch bert
# (Table 3's flat BERT) computes something else on those lines, which method of FlatBERT does.
ABOUT = {
    1: ("The verbalizer. h^d is the hidden state at depth d's slot (`[P]` here, the paper's "
        "`[MASK]`), which `slots` picks from the encoder's output; f^d is the MLM head's "
        'transform (the classifier trained through the MLM task), then a product with the label '
        "tokens' embeddings (the verbalizer) plus a label bias. Row d of `valid` keeps to "
        "slot d the labels of depth d, V^d: the loss reads it (Eq. 2), and so does prediction, "
        "which takes each label's score from its own depth's slot.",
        "Under `--arch bert`, `FlatBERT.make_head` makes [CLS] the one slot and `valid` one row "
        "of all labels, and `FlatBERT.score` scores every label from its state with HGCLR's linear "
        'layer, after dropout, instead.'),
    2: ("ZMLCE, depth d's loss: it pushes the scores of positive labels above 0 and those of "
        'negative labels below 0. `pos` marks V_pos, and the rest of the `valid` labels are V_neg. '
        'Each log(1 + sum) is a log-sum-exp with a 0 for its 1 (`zero`; in the kernel, `exp(-m)` '
        'after the shift by m): `negatives` and `lse_neg` are the first term, `positives` and '
        '`lse_pos` the second (x is -p for a positive label), over the `valid` labels only. The '
        'paper does not say how the depths\' losses combine: here they are summed (ours), and the '
        'documents averaged.',
        "Under `--arch bert`, `model.loss` is `FlatBERT.loss`, HGCLR's binary cross-entropy "
        "averaged over the labels, of `FlatBERT.score`'s scores, not Eq. 2."),
    3: ("The similarity of two texts' local hierarchies: the [CLS] states of their sequences "
        '(Sec. 4.1\'s, above), encoded once before training, in eval mode, by the encoder as it '
        'starts, so that it "remains unaffected by gradient updates"; their cosine, mapped to '
        '[0, 1], and clamped there (ours), as rounding can put s a little below 0, where Eq. 4\'s '
        's^alpha is NaN. `training_loss` takes text i\'s row and its Mixup partner j\'s '
        '(`hier[partner]`).',
        None),
    4: ('The Mixup ratio: the more similar two local hierarchies, the nearer lambda is to 0.5 '
        '(the more they mix); beta is its upper bound, alpha shapes the curve.',
        None),
    5: ("Mixup: at each depth, a text's slot state h^d_i (`slots`, as for Eq. 1) and its "
        "partner's h^d_j (`h[partner]`), mixed by the pair's lambda.",
        "Under `--arch bert`, the states mixed are the two texts' [CLS] states, the one slot that "
        '`FlatBERT.make_head` makes (ours: the paper does not say which states its BERT + Mixup '
        'rows mix).'),
    6: ("Eq. 1's f^d, `model.score` (`LHMix.score`, under Eq. 1 above), scores the mixed slot "
        'states: in the epochs that mix, after the warm-up.',
        "Under `--arch bert`, `model.score` is `FlatBERT.score`, HGCLR's linear layer on the "
        'mixed [CLS] state.'),
    7: ("Loss mixing: the mixed scores' ZMLCE against each text's own labels, weighted by "
        'lambda and 1 - lambda, each pair by its own lambda (`w`).',
        "Under `--arch bert`, the two losses mixed are `FlatBERT.loss`'s binary cross-entropies "
        '(ours, as for Eq. 5).'),
    8: ("Eq. 7's gradient, a lambda-weighted sum of the two texts' ZMLCE gradients. On a GPU, "
        "the fused kernel computes each score's derivative of Eq. 2 in its forward pass: "
        'e^(p - lse_neg) for a negative label, its term of the first fraction, and '
        '-e^(-p - lse_pos) for a positive one, its term of the second (lse_neg and lse_pos are '
        "Eq. 2's log-sum-exps, under Eq. 2 above). `FusedZMLCE.backward` scales it by the "
        "upstream gradient g: for Eq. 7's line, lambda / B for the first loss and "
        '(1 - lambda) / B for the second (the mean over B documents), which autograd adds. '
        'Elsewhere (on the CPU, without Triton, or in float64), `zmlce` runs `plain_zmlce` '
        '(under Eq. 2 above), which autograd differentiates.',
        "Under `--arch bert`, autograd differentiates `FlatBERT.loss`'s binary cross-entropy; the "
        'kernel does not run.'),
}

# The paper's displayed sequences and its training given in words, each placed before an equation
# (or after the last) of its subsection: the page's text (the paper's words in double quotes or in
# a ```text block, as its LaTeX reads without its markup; what the code builds for the example
# tree), the code shown (a file and a definition in it, whole, or a tag, `@name`, in it), the
# README's differences linked and, where the flat BERT builds otherwise, what it builds.
TREE = ('the tree of CS (child Machine Learning) and Math (child Statistics), label ids in that '
        'order, with an uncased vocabulary as bert-base-uncased\'s')
ITEMS = (
    dict(section='3.2 Hierarchical Prompt for HTC', before=1, title='The hierarchical prompt',
         text=['The paper\'s input, where `[Dth^d]` prompts depth d and the hidden state of the '
               "`[MASK]` after it is Eq. 1's h^d:", '', '```text',
               '[CLS] [Dth^1] [MASK] ... [Dth^d] [MASK] ... [Dth^D] [MASK] [SEP]', 'X [SEP]',
               '```', '',
               'Here `[Dth^d]` is `[Dd]`, and `[MASK]` is `[P]`, a token of its own that starts as '
               "`[MASK]`'s embedding (the authors' code). `template` writes the prompt, and "
               '`make_batch` appends the text and the closing `[SEP]`; for ' + TREE + ':', '',
               '| text | what `make_batch` lays out |', '| --- | --- |',
               '| deep nets learn | `[CLS] [D1] [P] [D2] [P] [SEP] deep nets learn [SEP]` |', ''],
         code=[('lhmix.py', 'template'), ('lhmix.py', '@prompt')],
         differences=['kept-from-the-code'],
         bert="Under `--arch bert`, `FlatBERT.make_head` makes the prompt [CLS] alone, whose state "
              'is the one slot: the text and `[SEP]` follow it; the vocabulary gains no token.'),
    dict(section='4.1 Local Hierarchy Correlation', before=3, title='The local-hierarchy sequence',
         text=["The paper's sequences of the local hierarchies \"CS/Machine Learning\" and "
               '"Math/Statistics" (its Fig. 1), the prompt with each `[MASK]` replaced by the gold '
               'label of its depth:', '', '```text',
               '[CLS] [Dth^1] CS [Dth^2] Machine Learning [SEP]',
               '[CLS] [Dth^1] Math [Dth^2] Statistics [SEP]', '```', '',
               'and of a local hierarchy of several paths: "we concatenate the labels at the same '
               'level together and place them after the corresponding [Dth^d] token". Here a '
               "label set is first closed upward (its labels' ancestors added), and the names of "
               'one depth follow their label ids; for ' + TREE + ':', '',
               '| gold labels | what `local_hierarchy_ids` builds |', '| --- | --- |',
               '| Machine Learning | `[CLS] [D1] cs [D2] machine learning [SEP]` |',
               '| Statistics | `[CLS] [D1] math [D2] statistics [SEP]` |',
               '| Machine Learning, Statistics | '
               '`[CLS] [D1] cs math [D2] machine learning statistics [SEP]` |', ''],
         code=[('lhmix.py', 'local_hierarchy_ids'), ('lhmix.py', '@local-hierarchy')],
         differences=['label-order'],
         bert='Under `--arch bert`, which has no depth tokens, the depths\' names follow one '
              'another (ours: the paper does not say): `[CLS] cs machine learning [SEP]`.'),
    dict(section='5.2 Implement Details', before=None, title='Warm-up',
         text=['The paper: "To accelerate the convergence of the model, we adopt a two-step '
               'training strategy. Initially, we train the model for 5 epochs without utilizing '
               'Mixup, and then for the remaining epochs, we incorporate Mixup during the '
               'training process." `--warmup-epochs` (default 5) counts the first step\'s epochs; '
               'every later epoch mixes:', ''],
         code=[('train.py', '@warm-up')],
         differences=['warm-up']),
    dict(section='5.2 Implement Details', before=None, title='Early stopping',
         text=['The paper: "We employ the early stopping strategy if there is no improvement of '
               'Macro-F1 after 5 epochs." It names no split; here, as in the authors\' code, it is '
               'dev. `--early-stop` (default 5) counts the epochs since the best dev macro-F1, and '
               'training stops before the next epoch when they reach it:', ''],
         code=[('runs.py', 'since_best'), ('train.py', '@early-stop')],
         differences=['early-stopping']),
)


def tags(source):
    """{line: [equation numbers and tag names]} of the tags in `source`."""
    lines, out = source.splitlines(), {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        (row, col) = tok.start
        if tok.type == tokenize.COMMENT and lines[row - 1][:col].strip():  # trails code
            found = [int(n) for eqs in TAG.findall(tok.string) for n in re.findall(r'\d+', eqs)]
            found += ['@' + name for name in NAMED.findall(tok.string)]
            if found:
                out[row] = found
    return out


def statements(node, names=()):
    """(statement, the classes and functions around it, the list of statements it is in) of every
    statement under `node`, in source order; so the last one that holds a line is the innermost."""
    for _, value in ast.iter_fields(node):
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, ast.stmt):
                yield child, names, value
            if isinstance(child, ast.AST):
                is_def = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                yield from statements(child, names + (child.name,) if is_def else names)


def tagged_blocks(source, path='lhmix.py'):
    """{equation or `@name`: [(first line, last line, the names around them)]} of the tags."""
    stmts, spans = list(statements(ast.parse(source))), {}
    for line, keys in tags(source).items():
        stmt, names, siblings = [s for s in stmts if s[0].lineno <= line <= s[0].end_lineno][-1]
        body = getattr(stmt, 'body', None)
        end = body[0].lineno - 1 if body and line < body[0].lineno else stmt.end_lineno
        for n in keys:
            if isinstance(n, int) and n not in EQUATIONS:
                raise ValueError(f'{path} line {line}: the paper has no Eq. {n}')
            spans.setdefault(n, set()).add((stmt.lineno, end, names, id(siblings),
                                            end == stmt.end_lineno))
    out = {}
    for n, found in spans.items():
        blocks = []
        for start, end, names, siblings, whole in sorted(found):
            last = blocks[-1] if blocks else None
            if last and last[3:] == (siblings, True) and whole and start - last[1] <= BLOCK:
                blocks[-1] = (last[0], end) + last[2:]
            else:
                blocks.append((start, end, names, siblings, whole))
        out[n] = [b[:3] for b in blocks]
    return out


def locate(source, path, where):
    """[(first line, last line, the names around them)] of the statements tagged `where`
    ('@prompt'), or of the definition `where` ('LHMix.score'), whole."""
    if where.startswith('@'):
        found = tagged_blocks(source, path).get(where, [])
    else:
        found = [(min([d.lineno for d in stmt.decorator_list] + [stmt.lineno]), stmt.end_lineno,
                  names) for stmt, names, _ in statements(ast.parse(source))
                 if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 and names + (stmt.name,) == tuple(where.split('.'))]
    if not found or len(found) > 1 and not where.startswith('@'):
        what = 'lines are tagged' if where.startswith('@') else 'definitions are named'
        raise ValueError(f'{path}: {len(found)} {what} `{where}` (ITEMS in tools/paper.py name '
                         'it: change them to match)')
    return found


def differences(readme):
    """({equation: [(title, anchor)]} of the bullets in the README's list of differences that name
    it, {anchor: title} of them all)."""
    section = re.search(rf'^## {re.escape(DIFFERENCES)}\n(.*?)(?=^## |\Z)', readme, re.M | re.S)
    if section is None:
        raise ValueError(f'README.md: no section "## {DIFFERENCES}"')
    by_equation, titles = {}, {}
    for anchor, title, text in BULLET.findall(section[1]):
        title = title.rstrip('.')
        named = sorted({int(n) for eqs in TAG.findall(title + text) for n in re.findall(r'\d+',
                                                                                    eqs)})
        if named and not anchor:
            raise ValueError(f'README.md: the difference "{title}" names Eq. {named[0]} but has no '
                             'anchor: start it - <a id="NAME"></a>**...')
        titles[anchor] = title
        for n in named:
            by_equation.setdefault(n, []).append((title, anchor))
    return by_equation, titles


def code(path, lines, first, last, names):
    """A block of lines under the link that names them."""
    where = f'line {first}' if first == last else f'lines {first}-{last}'
    anchor = f'L{first}' if first == last else f'L{first}-L{last}'
    inside = f', in `{".".join(names)}`' if names else ''
    return [f'[`{path}` {where}]({path}#{anchor}){inside}:', '```python',
            *lines[first - 1:last], '```', '']


def links(found):
    """The line that links a part of the page to its differences in the README."""
    if not found:
        return []
    return ["Compared with the authors' code: "
            + ', '.join(f'[{title}](README.md#{anchor})' for title, anchor in found) + '.', '']


def page(files, readme, items=ITEMS):
    """PAPER.md's text from {file name: text} (lhmix.py, and the files ITEMS name) and README.md."""
    lhmix, lines = files['lhmix.py'], {k: v.splitlines() for k, v in files.items()}
    blocks = tagged_blocks(lhmix)
    by_equation, titles = differences(readme)
    out = ['# The paper in code', '',
           'Generated by `python -m tools.paper` from the `# Eq. N` tags of '
           '[`lhmix.py`](lhmix.py) and the definitions that `tools/paper.py` names: do not edit '
           'it by hand.', '',
           'Kong, Zhang & Wang, *LH-Mix: Local Hierarchy Correlation Guided Mixup over '
           'Hierarchical Prompt Tuning* (KDD 2025, arXiv 2412.16963), in its order: Eqs. 1-8, '
           'each with the lines that compute its terms; the two sequences the paper displays, '
           'each with the code that builds it and what that code builds for a small tree; the '
           'paper\'s "two-step training strategy" (warm-up without Mixup, then Mixup) and its '
           'early stopping, which it gives in words. Quoted text is the paper\'s.', '']
    parts = []
    for n in EQUATIONS:  # each equation after the items placed before it, then the rest
        parts += [item for item in items if item['before'] == n] + [n]
    parts += [item for item in items if item['before'] is None]
    section = None
    for part in parts:
        sec = EQUATIONS[part][0] if isinstance(part, int) else part['section']
        if sec != section:
            out += [f'## Sec. {sec}', '']
            section = sec
        if isinstance(part, int):
            n, (_, latex), (what, bert) = part, EQUATIONS[part], ABOUT[part]
            if n not in blocks:
                raise ValueError(f'lhmix.py: no line is tagged Eq. {n}')
            out += [f'### Eq. {n}', '', '```math', *latex, '```', '', what, '']
            for first, last, names in blocks[n]:
                out += code('lhmix.py', lines['lhmix.py'], first, last, names)
            out += [bert, ''] if bert else []
            out += links(by_equation.get(n, []))
        else:
            out += [f'### {part["title"]}', '', *part['text']]
            for path, where in part['code']:
                for first, last, names in locate(files[path], path, where):
                    out += code(path, lines[path], first, last, names)
            for anchor in part['differences']:
                if anchor not in titles:
                    raise ValueError(f'README.md: no difference <a id="{anchor}"></a> (ITEMS in '
                                     f'tools/paper.py link it from {part["title"]})')
            out += [part['bert'], ''] if part.get('bert') else []
            out += links([(titles[a], a) for a in part['differences']])
    return '\n'.join(out)


def main():
    try:
        files = {}
        for name in ('lhmix.py', *{path for item in ITEMS for path, _ in item['code']}):
            with open(os.path.join(ROOT, name), encoding='utf-8') as f:
                files[name] = f.read()
        with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
            text = page(files, f.read())
    except (OSError, ValueError) as e:
        sys.exit(f'error: {e}')
    path = os.path.join(ROOT, 'PAPER.md')
    with open(path + '.tmp', 'w', encoding='utf-8') as f:
        f.write(text)
    os.replace(path + '.tmp', path)  # whole or not at all


if __name__ == '__main__':
    main()
