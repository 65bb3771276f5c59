"""The tests' set-up: the repository root first on the path, so that `import lhmix, data, runs,
train, evaluate` and `from tools import summary` find this checkout's files however pytest is
started (pytest puts this folder on the path too: `import helpers`); the hub never reached; one
demo run that several files read."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ['HF_HUB_OFFLINE'] = '1'  # never reach the hub, whatever a test does
os.environ['TRANSFORMERS_OFFLINE'] = '1'
# The GPU's tests are collected where there is one: on a CPU, nothing is skipped for want of it.
collect_ignore = [] if torch.cuda.is_available() else ['test_gpu.py']


@pytest.fixture(scope='session')
def run(tmp_path_factory):
    """A finished train.py run of two epochs on the demo set (helpers.FAST), read and never
    changed by the tests that take it."""
    import train
    from helpers import FAST
    out = tmp_path_factory.mktemp('demo') / 'run'
    train.main(FAST + ['--epochs', '2', '--out', str(out)])
    return out
