"""Writes PAPER.md: each equation of the paper, what it does, and the lines of lhmix.py that
compute it, found by lhmix.py's own tags. Run it again whenever a tagged line of lhmix.py or the
README's list of differences changes (tools/test_paper.py fails until PAPER.md matches):

    python tools/paper.py

A tag is `Eq. N` (singular "Eq.", one number) in a comment that trails code on its line; one
comment may hold several (`# Eq. 1 / Eq. 6: p~ = f(h~)` tags Eqs. 1 and 6). A summary such as
`Eqs. 2-7`, a comment on a line of its own and a docstring are not tags. The page shows the
whole statement that holds a tagged line (of a compound statement, the header alone), verbatim,
linked to its lines. Each bullet of the README's list of differences that starts with a bold
title and names `Eq. N` the same way is pointed to from Eq. N.
"""
import ast
import io
import os
import re
import sys
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TAG = re.compile(r'\bEq\. (\d+)\b(?!-)')
DIFFERENCES = "Where this differs from the authors' code, and why"  # the README's section
# GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
DIFFERENCES_LINK = 'README.md#' + re.sub(r'[^\w\- ]', '', DIFFERENCES.lower()).replace(' ', '-')

# The paper's Eqs. 1-8, in its order: the subsection that holds each, the LaTeX of its equation
# environment line by line (whitespace aside, as the paper writes it; its \label left out), and
# what it does. GitHub renders a ```math block; a $$ block would lose \| and \{.
EQUATIONS = {
    1: ('3.2 Hierarchical Prompt for HTC', (
        r'\mathbf{p}^d=f_{\mathcal{V}^d}^d(\mathbf{h}_{\texttt{[MASK]}}^d),',
    ), "The verbalizer: the hidden state at depth d's slot (`[P]` here, the paper's `[MASK]`) "
       'scores the labels of depth d.'),
    2: ('3.2 Hierarchical Prompt for HTC', (
        r'\mathcal{L}^d (\mathbf{p}^d, \mathcal{V}^d_{pos}, \mathcal{V}^d_{neg})'
        r' = \log (1+\sum_{v \in \mathcal{V}^d_{neg}}e^{\mathbf{p}^d_{\cdot v}})'
        r' + \log (1+\sum_{v \in \mathcal{V}^d_{pos}}e^{-\mathbf{p}^d_{\cdot v}}),',
    ), "ZMLCE, depth d's loss: it pushes the scores of positive labels above 0 and those of "
       'negative labels below 0.'),
    3: ('4.1 Local Hierarchy Correlation', (
        r'\begin{aligned}',
        r'    s & = 0.5\left(\frac{\mathbf{h}_{i\texttt{[CLS]}} \cdot \mathbf{h}_{j\texttt{[CLS]}}}'
        r'{\|\mathbf{h}_{i\texttt{[CLS]}}\| \|\mathbf{h}_{j\texttt{[CLS]}}\|} + 1\right),',
        r'\end{aligned}',
    ), "The similarity of two texts' local hierarchies, from their [CLS] states in the frozen "
       'encoder: their cosine, mapped to [0, 1].'),
    4: ('4.2 Local Hierarchy Correlation Guided Mixup Ratio', (
        r'\lambda = -(\beta - 0.5)s^\alpha + \beta,',
    ), 'The Mixup ratio: the more similar two local hierarchies, the nearer lambda is to 0.5 '
       '(the more they mix); beta is its upper bound, alpha shapes the curve.'),
    5: ('4.3 Local Hierarchy Mixup', (
        r'\begin{aligned}',
        r'    \widetilde{\mathbf{h}}^d_{\texttt{[MASK]}} = \lambda \mathbf{h}^d_{i\texttt{[MASK]}}'
        r' + (1 - \lambda) \mathbf{h}^d_{j\texttt{[MASK]}}.',
        r'\end{aligned}',
    ), "Mixup: at each depth, a text's slot state and its partner's, mixed by the pair's "
       'lambda.'),
    6: ('4.3 Local Hierarchy Mixup', (
        r'\widetilde{\mathbf{p}}^d'
        r' = f_{\mathcal{V}^d}^d(\widetilde{\mathbf{h}}^d_{\texttt{[MASK]}}).',
    ), "Eq. 1's verbalizer scores the mixed slot states."),
    7: ('4.3 Local Hierarchy Mixup', (
        r'\begin{aligned}',
        r'    & \widetilde{\mathcal{L}}^d (\lambda, \widetilde{\mathbf{p}}^d,'
        r' \mathcal{V}^d_{i, pos}, \mathcal{V}^d_{i, neg}, \mathcal{V}^d_{j, pos},'
        r' \mathcal{V}^d_{j, neg})\\',
        r'    = & \lambda\mathcal{L}^d_i (\widetilde{\mathbf{p}}^d, \mathcal{V}^d_{i, pos},'
        r' \mathcal{V}^d_{i, neg}) + (1 - \lambda) \mathcal{L}^d_j (\widetilde{\mathbf{p}}^d,'
        r' \mathcal{V}^d_{j, pos}, \mathcal{V}^d_{j, neg}).',
        r'\end{aligned}',
    ), "Loss mixing: the mixed scores' ZMLCE against each text's own labels, weighted by "
       'lambda and 1 - lambda.'),
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
    ), "Eq. 7's gradient, a lambda-weighted sum of the two texts' ZMLCE gradients: torch's "
       'autograd computes it, and on CUDA the fused kernel.'),
}


def tags(source):
    """{line: [equation numbers]} of the tags in `source`."""
    lines, out = source.splitlines(), {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        (row, col), eqs = tok.start, [int(n) for n in TAG.findall(tok.string)]
        if tok.type == tokenize.COMMENT and eqs and lines[row - 1][:col].strip():  # trails code
            out[row] = eqs
    return out


def statements(node, names=()):
    """Every statement under `node` in source order, with the classes and functions around it;
    so the last one that holds a line is the innermost."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.stmt):
            yield child, names
        is_def = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        yield from statements(child, names + (child.name,) if is_def else names)


def differences(readme):
    """{equation: [titles]} of the bullets in the README's list of differences that name it."""
    section = re.search(rf'^## {re.escape(DIFFERENCES)}\n(.*?)(?=^## |\Z)', readme, re.M | re.S)
    if section is None:
        raise ValueError(f'README.md: no section "## {DIFFERENCES}"')
    out = {}
    for title, text in re.findall(r'^- \*\*(.+?)\*\*(.*?)(?=^\S|\Z)', section[1], re.M | re.S):
        for n in sorted({int(n) for n in TAG.findall(title + text)}):
            out.setdefault(n, []).append(title.rstrip('.'))
    return out


def page(source, readme):
    """PAPER.md's text from the text of lhmix.py and of README.md."""
    lines, stmts = source.splitlines(), list(statements(ast.parse(source)))
    shown = {n: {} for n in EQUATIONS}  # {(first line, last line): the names around them}
    for line, eqs in tags(source).items():
        stmt, names = [(s, around) for s, around in stmts if s.lineno <= line <= s.end_lineno][-1]
        body = getattr(stmt, 'body', None)
        end = body[0].lineno - 1 if body and line < body[0].lineno else stmt.end_lineno
        for n in eqs:
            if n not in EQUATIONS:
                raise ValueError(f'lhmix.py line {line}: the paper has no Eq. {n}')
            shown[n][stmt.lineno, end] = names
    diffs = differences(readme)
    out = ['# The paper in code', '',
           'Generated by `python tools/paper.py` from the `# Eq. N` tags of '
           '[`lhmix.py`](lhmix.py): do not edit it by hand.', '',
           'Eqs. 1-8 of Kong, Zhang & Wang, *LH-Mix: Local Hierarchy Correlation Guided Mixup '
           "over Hierarchical Prompt Tuning* (KDD 2025, arXiv 2412.16963) in the paper's order, "
           'each with the lines of `lhmix.py` that compute it.', '']
    section = None
    for n, (sec, latex, what) in EQUATIONS.items():
        if not shown[n]:
            raise ValueError(f'lhmix.py: no line is tagged Eq. {n}')
        if sec != section:
            out += [f'## Sec. {sec}', '']
            section = sec
        out += [f'### Eq. {n}', '', '```math', *latex, '```', '', what, '']
        for (start, end), names in sorted(shown[n].items()):
            where = f'line {start}' if start == end else f'lines {start}-{end}'
            anchor = f'L{start}' if start == end else f'L{start}-L{end}'
            inside = f', in `{".".join(names)}`' if names else ''
            out += [f'[`lhmix.py` {where}](lhmix.py#{anchor}){inside}:', '```python',
                    *lines[start - 1:end], '```', '']
        if n in diffs:
            links = ', '.join(f'[{title}]({DIFFERENCES_LINK})' for title in diffs[n])
            out += [f"Where this code differs from the authors': {links}.", '']
    return '\n'.join(out)


def main():
    try:
        with open(os.path.join(ROOT, 'lhmix.py'), encoding='utf-8') as f:
            source = f.read()
        with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
            readme = f.read()
        text = page(source, readme)
    except (OSError, ValueError) as e:
        sys.exit(f'error: {e}')
    path = os.path.join(ROOT, 'PAPER.md')
    with open(path + '.tmp', 'w', encoding='utf-8') as f:
        f.write(text)
    os.replace(path + '.tmp', path)  # whole or not at all


if __name__ == '__main__':
    main()
