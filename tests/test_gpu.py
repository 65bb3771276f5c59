"""train.py's GPU path, collected only where torch sees a CUDA GPU (conftest.py): a run and its
resumption on the GPU, whose CPU twins are test_train.py's demo runs, and, for each family of
lhmix.FAMILIES, CUDA-graphed steps against eager ones (eager ones alone where packed rows do not fit
the family), which have no CPU twin."""
import copy
import functools

import numpy as np
import pytest
import torch

import lhmix
import speed
import train
from helpers import PARENTS, TEXTS, is_whole_run, read_metrics, tiny_family


def test_a_run_on_the_gpu_and_its_resumption(tmp_path):
    """LH-Mix with Mixup from the first epoch on the GPU (graphed steps where CUDA graphs run, the
    local hierarchies' table on the GPU), then resumed there: train.py's device path end to end."""
    argv = ['--data', 'demo', '--model', 'tiny', '--device', 'cuda', '--train-fraction', '0.01',
            '--warmup-epochs', '0', '--out', str(tmp_path / 'run')]  # 12 documents: it learns
    train.main(argv + ['--epochs', '1'])
    train.main(argv + ['--epochs', '2', '--resume'])
    assert [m['mix'] for m in read_metrics(tmp_path / 'run')] == [True, True]
    assert is_whole_run(tmp_path / 'run')


# CUDA graphs: steps replayed from graphs give the eager numbers, in each family that
# packed rows fit; the others step eagerly

def _run_steps(model, docs, labels, ids, device, mix, graphs, steps=10):
    """train.py's step over two epochs' batches, LH-Mix's lambda from the model's table."""
    rng = np.random.default_rng(1)
    opt, scaler = speed.make_optimizer(model, 1e-3, graphs)
    step = functools.partial(train.train_step, model, opt, scaler)
    step = speed.CUDAGraphs(step) if graphs else step
    if graphs:
        speed.use_cuda_graphs(device, model)
    model.train()
    losses = []
    for _ in range(2):  # two epochs' batches
        for b in speed.epoch_batches(model, docs, labels, 8, rng, device, 0.15, mix, graphs,
                                     hierarchy_ids=torch.from_numpy(ids)):
            losses.append(step(b)[0].item())
    return losses[:steps], step


def _tiny(kind):
    """A tiny LHMix of `kind`'s family on PARENTS, without dropout (the runs compared draw no
    random masks)."""
    torch.manual_seed(0)
    h = lhmix.Hierarchy(PARENTS)
    model = lhmix.build_model(*tiny_family(kind, TEXTS + h.names), h, 'prompt')
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


def _data(model):
    """48 random documents of 18 to 40 word-pieces, their labels and local hierarchies."""
    rng = np.random.default_rng(0)
    docs = [rng.integers(5, model.base_vocab, int(k)) for k in rng.integers(18, 40, 48)]
    return docs, [[0, 2], [1, 4], [0, 3], [1, 5]] * 12, np.arange(48) % 4


PADDED = [k for k, family in lhmix.FAMILIES.items() if family[3]]  # packed rows do not fit


@pytest.mark.parametrize('kind', [k for k in lhmix.FAMILIES if k not in PADDED])
@pytest.mark.parametrize('mix', [False, True])
def test_cuda_graph_steps_match_eager_on_gpu_bf16(mix, kind):
    device = torch.device('cuda')
    model = _tiny(kind)
    if not speed.use_cuda_graphs(device, model):
        pytest.skip('CUDA graphs do not run on this GPU')
    lhmix.use_local_hierarchies(model.to(device), torch.randn(4, 32), 1.0, 0.75)
    twin = copy.deepcopy(model)
    docs, labels, ids = _data(model)
    graphed, step = _run_steps(twin, docs, labels, ids, device, mix, graphs=True)
    eager, _ = _run_steps(model, docs, labels, ids, device, mix, graphs=False)
    assert 1 <= len(step.graphs) <= 6  # captured once per batch shape (packed: one), replayed
    assert graphed == pytest.approx(eager, rel=2e-2, abs=2e-2)  # bf16 autocast


@pytest.mark.parametrize('kind', PADDED)
def test_a_family_that_packed_rows_do_not_fit_steps_eagerly_and_says_why(kind, capsys):
    device = torch.device('cuda')
    if not torch.cuda.is_bf16_supported():
        pytest.skip('CUDA graphs do not run on this GPU')
    model = _tiny(kind)
    assert not speed.use_cuda_graphs(device, model)
    assert capsys.readouterr().err == f'CUDA graphs off: {kind}: {lhmix.FAMILIES[kind][3]}\n'
    lhmix.use_local_hierarchies(model.to(device), torch.randn(4, 32), 1.0, 0.75)
    losses, _ = _run_steps(model, *_data(model), device, True, graphs=False, steps=12)
    assert np.isfinite(losses).all() and np.mean(losses[6:]) < np.mean(losses[:6]), losses
