"""RESULTS.md against the tools that printed its tables.

The convention: text that a tool printed (a table of tools/summary.py, tools/claims.py) follows a
marker, a line of its own

    <!-- python -m tools.NAME ARG ... -->

then one blank line, then the command's stdout verbatim, then a blank line or the end of the file.
The command runs from the folder of RESULTS.md (the repository root), in the Python process
running the tests (one import of torch for all the markers, not one each); its arguments are split
as a shell splits them, and a glob among them expands to what it matches, in sorted order. Each
glob must match and each argument naming a path (holding a '/') must exist: the records the
tables come from are in the repository (results/records/). To update a table, run its command from
the repository root and put its output after the marker.
"""
import glob
import io
import json
import os
import re
import runpy
import shlex
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = re.compile(r'<!-- python -m (tools\.\w+(?: .*)?) -->')


def expand(arg, root):
    """What an argument names, as a shell expands it in `root`: a glob's matches, sorted; a path
    (an argument holding a '/') if it exists; any other argument as it is. [] if nothing."""
    if re.search(r'[*?[]', arg):
        return sorted(glob.glob(arg, root_dir=root))
    return [arg] if '/' not in arg or os.path.exists(os.path.join(root, arg)) else []


def run(argv, root):
    """(exit status, stdout, stderr) of `python -m ARGV...` run from `root`, as Python run there
    would give them, but in this process."""
    out, err = io.StringIO(), io.StringIO()
    cwd, saved_argv, saved_path = os.getcwd(), sys.argv, sys.path[:]
    module = sys.modules.pop(argv[0], None)  # as in a new process: the tool not yet imported
    os.chdir(root)
    sys.argv, sys.path[:0] = argv, [root]  # as -m puts the working folder first
    try:
        with redirect_stdout(out), redirect_stderr(err):
            runpy.run_module(argv[0], run_name='__main__', alter_sys=True)
        status = 0
    except SystemExit as e:  # sys.exit(message) prints the message and exits 1, as Python does
        status = e.code if isinstance(e.code, int) else 1 if e.code else 0
        err.write(e.code if isinstance(e.code, str) else '')
    except Exception as e:  # an uncaught error: Python prints its last line so and exits 1
        status = 1
        err.write(f'{type(e).__name__}: {e}')
    finally:
        os.chdir(cwd)
        sys.argv, sys.path[:] = saved_argv, saved_path
        if module:
            sys.modules[argv[0]] = module
    return status, out.getvalue(), err.getvalue()


def check(path):
    """Each problem of the markers in the file `path`: a marker not of the convention's form, its
    records missing, its command failing, or its output not the text after it."""
    root, name = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    with open(path, encoding='utf-8') as f:
        lines = f.read().split('\n')
    problems = []
    for i, line in enumerate(lines):
        if not line.startswith('<!-- python'):
            continue
        at, m = f'{name}:{i + 1}', MARKER.fullmatch(line)
        if not m:
            problems.append(f'{at}: a marker is `<!-- python -m tools.NAME ARG ... -->`, alone '
                            'on its line')
            continue
        if lines[i + 1:i + 2] != ['']:
            problems.append(f'{at}: a blank line must follow the marker')
            continue
        command, args = f'python -m {m.group(1)}', shlex.split(m.group(1))
        missing = [arg for arg in args if not expand(arg, root)]
        if missing:
            problems.append(f'{at}: {missing[0]} names no records (in {root})')
            continue
        argv = [x for arg in args for x in expand(arg, root)]
        status, stdout, stderr = run(argv, root)
        if status:
            problems.append(f'{at}: `{command}` failed (exit {status}): '
                            + stderr.strip().split('\n')[-1])
            continue
        out = stdout.removesuffix('\n').split('\n')
        todo = f'; run `{command}` in {root} and put its output after the marker'
        text = lines[i + 2:i + 2 + len(out)] + [None] * len(out)  # None: past the file's end
        j = next((j for j, o in enumerate(out) if text[j] != o), None)
        if j is not None:
            problems.append(f'{name}:{i + 3 + j}: `{command}` prints {out[j]!r} where '
                            + (f'{name} has {text[j]!r}' if text[j] is not None else
                               f'{name} ends') + todo)
        elif lines[i + 2 + len(out):i + 3 + len(out)] not in ([], ['']):
            problems.append(f'{name}:{i + 3 + len(out)}: {lines[i + 2 + len(out)]!r} follows '
                            f'the output of `{command}`, where a blank line or the end of the '
                            'file must' + todo)
    return problems


def test_results_md_matches_the_tools_that_printed_it():
    pytest.importorskip('scipy')  # without it the tools leave the p-values out
    problems = check(os.path.join(ROOT, 'RESULTS.md'))
    assert not problems, '\n'.join(problems)


def first_screen():
    """The README's text before its first section, and its bullets' texts, each on one line."""
    text = open(os.path.join(ROOT, 'README.md'), encoding='utf-8').read()
    text = text[:text.index('\n## ')]
    return text, [' '.join(b.split()) for b in re.findall(r'(?m)^- (.*(?:\n  .*)*)', text)]


def claims_cells():
    """[(the verdict, marginal or not, the cell)] of RESULTS.md's claims tables' cells 'DIFFERENCE
    [LOW, HIGH] VERDICT' (held to the records by the test above); a cell's own verdict is the one
    before any '; paired at 100%: ...'."""
    text = open(os.path.join(ROOT, 'RESULTS.md'), encoding='utf-8').read()
    cells = re.findall(r'\| ([-+][\d.]+ \[[-+][\d.]+, [-+][\d.]+\] [a-zA-Z ()%:;\d]+?) (?=\|)',
                       text)
    return [(re.search(r'\] (supported|contradicted|inconclusive)', c)[1],
             c.split(';')[0].endswith(' (marginal)'), c) for c in cells]


def test_the_readmes_first_screen_says_what_the_claims_tables_say():
    """At most 6 bullets of at most 40 words, no other sentence over 45 words, the headline
    claims figure, the records' count of runs as that figure's title counts them (the rerun
    apart, said so) and of seeds a setting (10 but Fig. 5's grid). Each
    number of a bullet stands in a cell of RESULTS.md's claims tables with the verdict word last
    named before it in the bullet (Supported, contradicted: ...), and is followed by ', marginal'
    exactly where that cell's verdict is marked marginal: a claim moved to another verdict or
    mark is caught here."""
    text, bullets = first_screen()
    cells = claims_cells()
    assert 0 < len(bullets) <= 6 and all(len(b.split()) <= 40 for b in bullets), bullets
    prose = re.sub(r'(?m)^- .*(?:\n  .*)*', '', text)
    sentences = re.split(r'(?<=[.)])\s+(?=[A-Z*\[(!])', ' '.join(prose.split()))
    assert max(len(s.split()) for s in sentences) <= 45
    assert '](results/figures/claims_headline.svg)' in text and 'on DebTags' in prose
    seeds = {}  # per folder of records, each setting's count of runs (its seeds)
    for path in glob.glob(os.path.join(ROOT, 'results', 'records', '*', '*', 'test_metrics.json')):
        with open(path, encoding='utf-8') as f:
            args = json.load(f)['args']
        setting = json.dumps({k: v for k, v in args.items() if k != 'seed'}, sort_keys=True)
        counts = seeds.setdefault(path.split(os.sep)[-3], {})
        counts[setting] = counts.get(setting, 0) + 1
    rerun = sum(seeds.pop('rerun').values())
    runs, grid = sum(sum(c.values()) for c in seeds.values()), seeds.pop('fig5').values()
    assert {n for c in seeds.values() for n in c.values()} == {10}  # Table 3, Fig. 4
    assert (f' {runs} runs, 10 seeds a setting (Fig. 5\'s grid: {min(grid)} to {max(grid)} '
            f'seeds), and a rerun of {rerun} apart;' in ' '.join(prose.split()))
    with open(os.path.join(ROOT, 'results', 'figures', 'claims_headline.svg'),
              encoding='utf-8') as f:
        assert f'Headline claims against {runs} runs of ' in f.read()
    for bullet in bullets:
        for number in re.finditer(r'(?<![\w.])[-+]\d+\.\d\d\b', bullet):
            verdict = re.findall(r'(supported|contradicted|inconclusive)',
                                 bullet[:number.start()].lower())[-1]
            marked = bullet[number.end():].startswith(', marginal')
            assert any(re.search(rf'(?<![\d.]){re.escape(number[0])}(?!\d)', c)
                       for v, m, c in cells if (v, m) == (verdict, marked)), (
                verdict, marked, number[0], bullet)


def results_text():
    """RESULTS.md with its lines joined by single spaces."""
    with open(os.path.join(ROOT, 'RESULTS.md'), encoding='utf-8') as f:
        return ' '.join(f.read().split())


def test_the_bert_rows_means_now_as_results_md_gives_them_beside_the_old():
    """The sentence on Table 3's redrawn BERT rows: each row's old and new test micro / macro
    means; the new, each the mean of its 10 records' F1 (float64, in points), here."""
    text = results_text()
    for name, mix in (('BERT', 'none'), ('+ Mixup', 'mixup'), ('+ LH-Mix', 'lhmix')):
        f1 = []
        for path in glob.glob(os.path.join(ROOT, 'results', 'records', 'table3', '*',
                                           'test_metrics.json')):
            with open(path, encoding='utf-8') as f:
                record = json.load(f)
            if (record['args']['arch'], record['args']['mix']) == ('bert', mix):
                f1.append([100 * record['micro_f1'], 100 * record['macro_f1']])
        micro, macro = sum(x for x, _ in f1) / len(f1), sum(y for _, y in f1) / len(f1)
        assert len(f1) == 10 and re.search(
            rf'[;:] {re.escape(name)} [\d.]+ / [\d.]+, {micro:.2f} / {macro:.2f}[;)]', text), name


def test_the_fresh_clones_run_as_results_md_gives_it():
    """The paragraph on Table 3's Prompt at seed 0 from a fresh clone: its test F1 and the
    record's (points), their difference, and the sd of a same-seed difference, which the rerun's
    ten seeds give (first runs against the rerun, paired by seed, float64, n - 1); the clone's
    record names its commit and the data digests of every record with provenance, and its set-up
    log the encoder's digest."""
    def f1(path):
        with open(os.path.join(ROOT, 'results', path, 'test_metrics.json'), encoding='utf-8') as f:
            record = json.load(f)
        return record, [100 * record['micro_f1'], 100 * record['macro_f1']]

    clone, new = f1('clone/prompt-none-s0')
    _, old = f1('records/table3/prompt-none-s0')
    sd = []
    for k in range(2):
        d = [f1(f'records/rerun/prompt-none-s{s}')[1][k]
             - f1(f'records/table3/prompt-none-s{s}')[1][k] for s in range(10)]
        mean = sum(d) / 10
        sd.append((sum((x - mean) ** 2 for x in d) / 9) ** 0.5)
    assert (f'tested at {new[0]:.2f} / {new[1]:.2f}, its record {old[0]:.2f} / {old[1]:.2f}: '
            f'{new[0] - old[0]:+.2f} / {new[1] - old[1]:+.2f}, inside a rerun\'s spread (sd of a '
            f'same-seed difference, from the rerun below: {sd[0]:.2f} / {sd[1]:.2f})'
            ) in results_text()
    provenance = clone['provenance']
    assert provenance['commit'].startswith('77b3b37') and not provenance['dirty']
    assert (provenance['gpu'], clone['args']['mix'], clone['args']['seed']) == (
        'NVIDIA H200', 'none', 0)
    with open(os.path.join(ROOT, 'results', 'records', 'table3', 'bert-none-s0',
                           'test_metrics.json'), encoding='utf-8') as f:
        assert json.load(f)['provenance']['data'] == provenance['data']
    with open(os.path.join(ROOT, 'results', 'clone', 'setup.txt'), encoding='utf-8') as f:
        digest = re.search(r'^([0-9a-f]{64})  models/minilm/model.safetensors$', f.read(), re.M)
    assert 'fresh clone of 77b3b37' in results_text() and (
        f'(sha256 {digest[1][:8]}...)' in results_text())


def bench_logs(name, head):
    """{key: the log it printed} of a bench file whose logs each follow a line `head` (a regex)."""
    with open(os.path.join(ROOT, 'results', 'bench', name), encoding='utf-8') as f:
        parts = re.split(rf'^{head}$', f.read(), flags=re.M)[1:]
    return dict(zip(parts[::2], parts[1::2]))


def bench_row(log, name):
    """(ms, x limit, padding) of a step's row in a bench log; the limit's ms, 1.000 and the floor's
    padding (the limit times the floor's kernels) for 'limit'."""
    floor = 'floor, graphed' if 'floor, graphed' in log else 'floor, eager'
    row = re.search(rf'^{re.escape(floor if name == "limit" else name)} +([\d.]+) +([\d.]+) +'
                    r'([\d.]+%)$', log, re.M).groups()
    return (re.search(r'limit: ([\d.]+) ms', log)[1], '1.000', row[2]) if name == 'limit' else row


def performance_rows(table):
    """The rows of RESULTS.md's Performance table number `table` (0, 1), cells without bold."""
    with open(os.path.join(ROOT, 'RESULTS.md'), encoding='utf-8') as f:
        section = f.read().split('## Performance')[1]
    tables = re.findall(r'((?:^\|.*\n)+)', section, re.M)
    return [line.replace('*', '').strip('| ').split(' | ') for line in
            tables[table].splitlines()[2:]]


def test_the_performance_tables_are_the_benchmarks_logs():
    """RESULTS.md's Performance: BERT's table, each row's ms and x limit at 1cd2ab3 and 1f9a129 and
    the padding at 1f9a129, as the two logs printed them; the families' table, each family's limit
    and x limit of the floor and of LH-Mix's steps, graphed where its log has graphed rows."""
    logs = bench_logs('1cd2ab3-1f9a129.txt', r'(\w+) round 1')
    rows = performance_rows(0)
    assert len(rows) == 7
    for row in rows:
        name = row[0].replace(' (one packed row)', '')
        name = 'limit' if name.startswith('limit') else name
        (a, x, _), (b, y, pad) = (bench_row(logs[c], name) for c in ('1cd2ab3', '1f9a129'))
        assert row[1:] == [a, x, b, y, pad], row
    families = {**bench_logs('families-1f9a129.txt', r'family ([\w-]+)'),
                'bert': logs['1f9a129']}
    names = {'BERT': 'bert', 'RoBERTa': 'roberta', 'XLM-RoBERTa': 'xlm-roberta', 'CamemBERT':
             'camembert', 'DistilBERT': 'distilbert', 'DeBERTa-v2': 'deberta-v2',
             'ModernBERT': 'modernbert'}
    rows = performance_rows(1)
    assert [r[0] for r in rows] == list(names)
    for row in rows:
        log = families[names[row[0]]]
        way = 'graphed' if 'LH-Mix, graphed' in log else 'eager'
        cells = [bench_row(log, 'limit')[0]] + [bench_row(log, f'{n}, {way}{r}')[1] for n, r in (
            ('floor', ''), ('LH-Mix', ''), ('LH-Mix', ', random batches'))]
        assert row[1:5] == cells and row[5].startswith(way), row


def test_every_recorded_run_started_from_the_same_label_embeddings():
    """One setting for all the records: each Prompt run's relatives.json holds the same shares at
    initialisation. A run made without the setting's label_names.tsv starts elsewhere (its label
    tokens from the whole tag, 'admin::backup'), and sessions that differ in it are caught here."""
    paths = glob.glob(os.path.join(ROOT, 'results', 'records', '*', '*', 'relatives.json'))
    starts = {}
    for path in paths:
        with open(path, encoding='utf-8') as f:
            shares = json.load(f)['relatives_among_nearest']
        starts.setdefault(json.dumps({k: v['init'] for k, v in shares.items()}), path)
    assert paths and len(starts) == 1, starts


# The checker, on a fabricated tool (tools.show prints a row per record: its name and value;
# it ends as sys.exit ends on an argument that is an error message or an exit status) and
# records; RESULTS lines by hand.
SHOW = """import sys
for record in sys.argv[1:]:
    if record.startswith('error:') or record.isdigit():
        sys.exit(int(record) if record.isdigit() else record)
    print(f'| {record} | {open(record + "/value.txt").read().strip()} |')
"""
RESULTS = ['# Results', '', 'The values:', '<!-- python -m tools.show records/r* -->', '',
           '| records/r1 | one |', '| records/r10 | ten |', '| records/r2 | two |', '',
           '<!-- not a marker -->', 'The end.', '']


@pytest.fixture
def fabricated(tmp_path):
    (tmp_path / 'tools').mkdir()
    (tmp_path / 'tools' / 'show.py').write_text(SHOW)
    for name, value in (('r1', 'one'), ('r2', 'two'), ('r10', 'ten')):
        (tmp_path / 'records' / name).mkdir(parents=True)
        (tmp_path / 'records' / name / 'value.txt').write_text(value + '\n')

    def check_lines(lines):
        (tmp_path / 'RESULTS.md').write_text('\n'.join(lines))
        return check(str(tmp_path / 'RESULTS.md'))
    return check_lines


def test_the_output_after_each_marker_passes_and_no_marker_passes(fabricated):
    assert fabricated(RESULTS) == []
    assert fabricated(RESULTS[:-1]) == []  # no newline at the end of the file
    assert fabricated(RESULTS[:8]) == []   # the output ends the file
    assert fabricated(RESULTS[:3] + RESULTS[9:]) == []  # no marker at all
    # two markers, one a path, the other quoted
    assert fabricated(RESULTS + ['<!-- python -m tools.show "records/r2" -->', '',
                                 '| records/r2 | two |']) == []


@pytest.mark.parametrize('edit, problem', [
    ({6: '| records/r10 | 10 |'}, "RESULTS.md:7: `python -m tools.show records/r*` prints "
     "'| records/r10 | ten |' where RESULTS.md has '| records/r10 | 10 |'; run `python -m "
     "tools.show records/r*` in ROOT and put its output after the marker"),
    ({8: '| records/r3 | three |'}, "RESULTS.md:9: '| records/r3 | three |' follows the output "
     "of `python -m tools.show records/r*`, where a blank line or the end of the file must; run "
     "`python -m tools.show records/r*` in ROOT and put its output after the marker"),
    ({4: None}, 'RESULTS.md:4: a blank line must follow the marker'),
    ({3: '<!-- python -m tools.show records/r[12]/ -->'}, 'RESULTS.md:6: `python -m tools.show '
     "records/r[12]/` prints '| records/r1/ | one |' where RESULTS.md has '| records/r1 | one |';"
     ' run `python -m tools.show records/r[12]/` in ROOT and put its output after the marker'),
    ({3: '<!-- python -m tools.show records/s* -->'}, 'RESULTS.md:4: records/s* names no records '
     '(in ROOT)'),
    ({3: '<!-- python -m tools.show records/r3 -->'}, 'RESULTS.md:4: records/r3 names no records '
     '(in ROOT)'),
    ({3: '<!-- python -m tools.show nothing -->'}, 'RESULTS.md:4: `python -m tools.show nothing` '
     "failed (exit 1): FileNotFoundError: [Errno 2] No such file or directory: "
     "'nothing/value.txt'"),
    ({3: "<!-- python -m tools.show 'error: no such run' -->"}, "RESULTS.md:4: `python -m "
     "tools.show 'error: no such run'` failed (exit 1): error: no such run"),
    ({3: '<!-- python -m tools.show records/r1 2 -->'}, 'RESULTS.md:4: `python -m tools.show '
     'records/r1 2` failed (exit 2): '),
    ({3: '<!-- python tools/show.py records/r* -->'}, 'RESULTS.md:4: a marker is `<!-- python '
     '-m tools.NAME ARG ... -->`, alone on its line'),
])
def test_a_marker_whose_text_or_records_differ_is_named_with_its_line(fabricated, tmp_path,
                                                                      edit, problem):
    lines = [edit.get(i, line) for i, line in enumerate(RESULTS)]
    assert fabricated([line for line in lines if line is not None]) == [
        problem.replace('ROOT', str(tmp_path))]


def test_a_shorter_file_names_where_it_ends(fabricated, tmp_path):
    assert fabricated(RESULTS[:7]) == [
        "RESULTS.md:8: `python -m tools.show records/r*` prints '| records/r2 | two |' where "
        f'RESULTS.md ends; run `python -m tools.show records/r*` in {tmp_path} and put its '
        'output after the marker']
