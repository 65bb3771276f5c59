"""speed.py: Mixup's random batches as one packed row, whose documents attend to themselves only,
give the numbers of one document a row; the MLM positions padded for CUDA graphs give the same
loss; importing registers nothing. The CUDA cases exist where there is a GPU (test_gpu.py has the
graphed steps)."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import lhmix
import speed
from helpers import PARENTS, TEXTS, tiny_family, tiny_model

CUDA = torch.cuda.is_available()


def test_a_packed_row_lays_the_documents_out_one_after_another():
    """12 + 10 + 11 tokens in one row of 128, then padding as a document of its own."""
    torch.manual_seed(0)
    model, _ = tiny_model(lhmix.Hierarchy(PARENTS))
    docs, labels = [np.array([5, 6, 7]), np.array([8]), np.array([9, 10])], [[0, 2], [1], [3]]
    b = speed.pack_row(lhmix.make_batch(model, docs, labels), model.special['pad'])
    p, sep, pad = model.prefix, model.special['sep'], model.special['pad']
    rows = [p + [5, 6, 7, sep], p + [8, sep], p + [9, 10, sep]]
    assert b['input_ids'].tolist() == [rows[0] + rows[1] + rows[2] + [pad] * 95]
    assert b['position_ids'].tolist() == [[*range(12), *range(10), *range(11)] + [0] * 95]
    assert b['token_type_ids'].tolist() == [[0] * 128]
    assert b['cu_seq_lens_q'].tolist() == [0, 12, 22, 33, 128] and 'attention_mask' not in b
    assert b['starts'].tolist() == [0, 12, 22] and b['targets'][0].tolist() == [1, 0, 1, 0, 0, 0]
    long = [np.arange(5, 100)] * 2  # 2 x (8 + 95 + 1) = 208 tokens: a row of 256
    assert speed.pack_row(lhmix.make_batch(model, long, [[0]] * 2), 0)[
        'input_ids'].shape == (1, 256)


def test_masked_positions_padded_for_graphs_give_the_same_loss():
    """One count per batch shape: the mean + 8 sd of Binomial(cells, 0.15), + 1, rounded up to 64;
    the padding labelled -100, which the loss ignores."""
    torch.manual_seed(0)
    model, _ = tiny_model(lhmix.Hierarchy(PARENTS))
    docs = [np.arange(5, 5 + k) for k in (9, 14, 30)]
    a, b = (lhmix.make_batch(model, docs, [[0], [1], [2]], np.random.default_rng(3), 0.15)
            for _ in range(2))
    n, cells = len(a['mlm_pos']), a['input_ids'].numel()
    assert speed.pad_for_graphs(b, 0.15) is b
    assert len(b['mlm_pos']) == 64 * math.ceil((0.15 * cells + 8 * (cells * 0.15 * 0.85) ** 0.5
                                                + 1) / 64) > n
    assert torch.equal(a['input_ids'], b['input_ids']) and (b['mlm_labels'][n:] == -100).all()
    assert torch.equal(b['mlm_pos'][:n], a['mlm_pos'])
    assert torch.equal(b['mlm_labels'][:n], a['mlm_labels'])
    model.eval()  # no dropout: the two calls see the same network
    with torch.no_grad():
        assert model(**a)[0].item() == pytest.approx(model(**b)[0].item(), rel=1e-6)
    none = lhmix.make_batch(model, docs, [[0], [1], [2]])  # nothing masked: nothing to pad
    assert speed.pad_for_graphs(dict(none), 0.15).keys() == none.keys()


@pytest.mark.skipif(not speed.TRANSFORMERS_5, reason='packed rows need transformers 5')
@pytest.mark.parametrize('device, tol, atol', [('cpu', 1e-10, 1e-12)]
                         + [('cuda', 5e-2, 1e-3)] * CUDA)
@pytest.mark.parametrize('arch, mix', [('prompt', 'lhmix'), ('prompt', 'mixup'), ('bert', 'lhmix')])
def test_one_packed_row_gives_the_loss_and_gradients_of_one_document_a_row(arch, mix, device,
                                                                            tol, atol):
    """No dropout; float64 on the CPU, bf16 autocast on a GPU (flash-attention's varlen
    kernel)."""
    torch.manual_seed(0)
    dev = torch.device(device)
    model, tok = tiny_model(lhmix.Hierarchy(PARENTS), arch)
    model.to(dev, torch.float64 if device == 'cpu' else torch.float32).eval()
    speed.use_packed_rows(model)
    rng = np.random.default_rng(0)
    docs = [rng.integers(5, len(tok), int(k)) for k in rng.integers(3, 40, 7)]
    labels = [[0, 2], [1, 4], [0, 2, 3, 5], [1], [0], [1, 4], [0, 2, 5]]
    partner = torch.tensor([3, 0, 6, 1, 2, 5, 4])
    mixing = {'partner': partner, 'lam': torch.tensor([0.9, 0.5, 0.7, 0.6, 1.0, 0.55, 0.8])}
    if mix == 'lhmix':  # Eqs. 3-4 from the model's table, as train.py's step
        lhmix.use_local_hierarchies(model, torch.randn(7, 16), 1.0, 0.75)
        mixing = {'partner': partner, 'hierarchy_ids': torch.arange(7)}
    out = []
    for packed in (False, True):
        b = lhmix.make_batch(model, docs, labels, np.random.default_rng(1),
                             0.15 if model.mlm_term else 0)
        b = speed.pack_row(b, model.special['pad']) if packed else b
        model.zero_grad(set_to_none=True)
        with lhmix.autocast(dev):
            loss, _ = model(**speed.to_device({**b, **mixing}, dev))
        loss.backward()
        out.append((loss.item(), [p.grad for p in model.parameters()], b['input_ids'].shape))
    (whole, grads, shape), (packed, packed_grads, packed_shape) = out
    assert packed_shape[0] == 1 and shape[0] == 7 and packed == pytest.approx(whole, rel=tol)
    for g, h in zip(grads, packed_grads):  # None: a weight the arch does not use
        assert (g is None) == (h is None) and (g is None or (h - g).norm() <= tol * g.norm() + atol)


@pytest.mark.skipif(not speed.TRANSFORMERS_5, reason='packed rows need transformers 5')
@pytest.mark.parametrize('kind', [k for k, f in lhmix.FAMILIES.items() if f[3] is None])
def test_a_packed_row_of_each_family_that_packs_gives_a_padded_batchs_loss(kind):
    """Each family whose attention packs (lhmix.FAMILIES): one packed row, its positions from the
    family's first (RoBERTa's 2), gives the padded batch's loss in float64, no dropout, the MLM
    term and LH-Mix's Mixup on (positions from 0 move RoBERTa's loss by about 0.04)."""
    torch.manual_seed(0)
    h = lhmix.Hierarchy(PARENTS)
    model = lhmix.build_model(*tiny_family(kind, TEXTS + h.names), h, 'prompt')
    model.double().eval()
    speed.use_packed_rows(model)
    lhmix.use_local_hierarchies(model, torch.randn(5, 8, dtype=torch.float64), 1.0, 0.75)
    rng = np.random.default_rng(0)
    docs = [rng.integers(5, model.base_vocab, int(k)) for k in rng.integers(3, 30, 5)]
    b = lhmix.make_batch(model, docs, [[0, 2], [1, 4], [0, 3], [1], [0, 2, 5]],
                         np.random.default_rng(1), 0.15, [3, 0, 4, 1, 2], torch.arange(5))
    with torch.no_grad():
        padded = model(**b)[0].item()
        packed = model(**speed.pack_row(b, model.special['pad'], model.first_position))[0].item()
    assert packed == pytest.approx(padded, rel=1e-10)


@pytest.mark.parametrize('device, bf16, five, eager, used, said', [
    ('cpu', True, True, False, False, ''), ('cuda', True, True, False, True, ''),
    ('cuda', True, True, True, False, ''),
    ('cuda', False, True, False, False, 'CUDA graphs off: no bf16 on this GPU\n'),
    ('cuda', True, False, False, False,
     'CUDA graphs off: transformers 4 syncs inside the encoder\n'),
    ('cuda', False, False, True, False, '')])
def test_cuda_graphs_run_on_a_gpu_with_bf16_and_transformers_5_unless_eager(
        monkeypatch, capsys, device, bf16, five, eager, used, said):
    """Where they cannot run on a GPU, the reason is said once; on a CPU, or eager, nothing."""
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *a, **k: bf16)
    monkeypatch.setattr(speed, 'TRANSFORMERS_5', five)
    model, _ = tiny_model(lhmix.Hierarchy(PARENTS))
    assert speed.use_cuda_graphs(torch.device(device), model, eager) == used
    assert capsys.readouterr().err == said


IMPORT = """
import os, transformers
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
names = lambda: (set(transformers.AttentionInterface()), set(AttentionMaskInterface()))
before, env = names(), dict(os.environ)
import lhmix, speed
assert names() == before and 'packed' not in before[0] | before[1] and dict(os.environ) == env
for _ in range(2):  # a second model registers nothing more
    mlm = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=8))
    model = lhmix.LHMix(mlm, lhmix.Hierarchy({'a': None}), 10,
                        {'cls': 2, 'sep': 3, 'pad': 0, 'mask': 4})
    speed.use_packed_rows(model)
    assert names() == (before[0] | {'packed'}, before[1] | {'packed'}), names()
    assert mlm.config._attn_implementation == 'packed'
assert transformers.AttentionInterface()['packed'] is speed.document_attention
assert AttentionMaskInterface()['packed'] is ALL_MASK_ATTENTION_FUNCTIONS['sdpa']
"""


@pytest.mark.skipif(not speed.TRANSFORMERS_5, reason='packed rows need transformers 5')
def test_import_registers_nothing_and_packed_rows_register_their_attention_once():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, '-c', IMPORT], cwd=root, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]


# train_batches: Mixup partners a uniformly random permutation of a uniformly random batch (as
# the authors' randperm(B) and Zhang et al.'s Mixup); without Mixup, length-bucketed batches

def _wos_lengths(n=640, seed=1234):  # like WOS's word-pieces: normal(284, 100), cut to 8..509
    return np.clip(np.random.default_rng(seed).normal(284, 100, n).round().astype(int), 8, 509)


def test_mixup_partners_random_permutation_of_a_random_batch():
    lengths, B, epochs = _wos_lengths(), 16, 200
    rng = np.random.default_rng(0)
    rows, fixed, two_cycle, mine, theirs = 0, 0, 0, [], []
    for _ in range(epochs):
        for idx, partner in speed.train_batches(lengths, B, rng, mixing=True):
            if len(idx) < B:
                continue
            i = np.arange(B)
            rows, fixed = rows + B, fixed + (partner == i).sum()
            two_cycle += (partner[partner] == i).sum()  # i in a cycle of length 1 or 2
            moved = partner != i  # a row mixed with another document
            mine += lengths[idx[moved]].tolist()
            theirs += lengths[idx[partner[moved]]].tolist()
    # a uniform permutation of 16 has in expectation 1 fixed point and 1/2 two-cycle: 1/16 of the
    # rows are their own partner (clean), 2/16 are partners' partners; tolerances: 5 binomial sd
    for count, p in ((fixed, 1 / B), (two_cycle, 2 / B)):
        assert abs(count / rows - p) < 5 * math.sqrt(p * (1 - p) / rows)
    # a partner's length is any document's: no correlation (sd of r ~ 1 / sqrt(n))
    assert abs(np.corrcoef(mine, theirs)[0, 1]) < 5 / math.sqrt(len(mine))


@pytest.mark.parametrize('n, batch', [(640, 16), (17, 16), (33, 16), (7, 4), (1, 16), (3, 2),
                                      (5000, 16)])
def test_train_batches_each_document_once_per_epoch(n, batch):
    lengths = _wos_lengths(n, seed=n)
    rng = np.random.default_rng(n)
    for mixing in (True, False):
        for _ in range(3):
            batches = speed.train_batches(lengths, batch, rng, mixing)
            ids = np.concatenate([idx for idx, _ in batches])
            assert ids.dtype == np.int64 and sorted(ids.tolist()) == list(range(n))
            assert all(0 < len(idx) <= batch for idx, _ in batches)
            for idx, partner in batches:  # a permutation of the batch's positions ([0] for 1)
                assert partner is None if not mixing else (
                    partner.dtype == np.int64 and sorted(partner) == list(range(len(idx))))
    if n >= 640:  # without Mixup, length-bucketed: far less padding than random batches
        bucketed, shuffled = (sum(lengths[i].max() * len(i) - lengths[i].sum() for i, _ in
                                  speed.train_batches(lengths, batch, rng, mix)) for mix in (0, 1))
        assert bucketed < 0.2 * shuffled


def test_a_packed_row_a_multiple_of_128_long_still_ends_in_a_padding_document():
    """100 + 28 = 128 tokens: the row is 256 long, so that at least one padding token, a document
    of its own, ends it (cu_seq_lens_q: 0, 100, 128, 256)."""
    b = speed.pack_row(lhmix.pad_rows([np.arange(1, 101), np.arange(1, 29)], 0, 16), 0)
    assert b['input_ids'].shape == (1, 256) and (b['input_ids'][0, 128:] == 0).all()
    assert b['cu_seq_lens_q'].tolist() == [0, 100, 128, 256] and b['starts'].tolist() == [0, 100]


@pytest.mark.parametrize('n, want', [(100, 256), (300, 512)])
def test_masked_positions_padded_for_graphs_count_by_hand(n, want):
    """800 cells at 0.15: 120 + 8 sqrt(800 * 0.15 * 0.85) + 1 = 201.8, up to 256 (6 sds would give
    192); 300 positions, past that count, are padded to its next multiple, 512."""
    batch = {'input_ids': torch.zeros(4, 200, dtype=torch.long),
             'mlm_pos': torch.arange(1, n + 1), 'mlm_labels': torch.arange(1, n + 1)}
    speed.pad_for_graphs(batch, 0.15)
    assert len(batch['mlm_pos']) == len(batch['mlm_labels']) == want
    assert batch['mlm_pos'].tolist() == [*range(1, n + 1)] + [0] * (want - n)
    assert batch['mlm_labels'].tolist() == [*range(1, n + 1)] + [-100] * (want - n)


def test_length_bucketed_batches_come_in_a_random_order():
    """Without Mixup, the batches are cut from length-sorted chunks but then shuffled: over 20
    epochs of 40 batches, the shortest batch is not always first, and the batch lengths in the
    order given are not sorted."""
    lengths, rng, first = _wos_lengths(), np.random.default_rng(0), []
    for _ in range(20):
        batches = speed.train_batches(lengths, 16, rng, mixing=False)
        means = [lengths[idx].mean() for idx, _ in batches]
        assert len(batches) == 40 and means != sorted(means)
        first.append(int(np.argmin(means)))
    assert len(set(first)) > 1


# epoch_batches: a step's batch, whole, from one call

CLOSED = {0: [0], 1: [1], 2: [0, 2], 3: [0, 3], 4: [1, 4], 5: [0, 2, 5]}  # PARENTS' paths by hand


@pytest.mark.parametrize('graphed', [False, True])
def test_an_epochs_batches_come_whole_from_one_call(graphed):
    """10 documents in batches of 4: each once an epoch with its own labels closed upward; LH-Mix's
    batches carry their partners and documents' local hierarchies, vanilla Mixup's a ratio each in
    [0.5, 1], the warm-up's neither; for CUDA graphs, Mixup's batches in one packed row, and every
    batch's masked positions padded to 64s."""
    torch.manual_seed(0)
    model, _ = tiny_model(lhmix.Hierarchy(PARENTS))
    rng, cpu = np.random.default_rng(0), torch.device('cpu')
    docs = [rng.integers(5, 20, int(k)) for k in rng.integers(3, 30, 10)]
    labels = [[i % 6] for i in range(10)]
    for kind in ({'hierarchy_ids': torch.arange(10) + 100}, {'mix_alpha': 1.0}, None):
        got = list(speed.epoch_batches(model, docs, labels, 4, np.random.default_rng(1), cpu, 0.15,
                                       kind is not None, graphed, **(kind or {})))
        assert sorted(len(b['targets']) for b in got) == [2, 4, 4]
        for b in got:
            assert ('partner' in b, 'hierarchy_ids' in b, 'lam' in b) == (
                kind is not None, kind is not None and 'mix_alpha' not in kind,
                kind is not None and 'mix_alpha' in kind)
            assert ('cu_seq_lens_q' in b) == (graphed and kind is not None)
            assert len(b['mlm_pos']) % 64 == 0 if graphed else len(b['mlm_pos']) < 64
            if 'lam' in b:
                assert ((b['lam'] >= 0.5) & (b['lam'] <= 1)).all()
            if 'hierarchy_ids' in b:
                docs_in = (b['hierarchy_ids'] - 100).tolist()
                assert [r.nonzero().flatten().tolist() for r in b['targets']] == [
                    CLOSED[i % 6] for i in docs_in]
        if kind and 'hierarchy_ids' in kind:
            assert sorted(i for b in got for i in (b['hierarchy_ids'] - 100).tolist()) == [
                *range(10)]


def test_graphed_mixup_batches_pack_each_familys_positions_from_its_first():
    """epoch_batches for CUDA graphs packs Mixup's batches with positions from the model's first:
    RoBERTa's documents start at 2, then count up; the padding document's positions are 0."""
    torch.manual_seed(0)
    h = lhmix.Hierarchy(PARENTS)
    model = lhmix.build_model(*tiny_family('roberta', TEXTS + h.names), h, 'prompt')
    docs = [np.arange(5, 5 + k) for k in (3, 4)]
    b, = speed.epoch_batches(model, docs, [[0], [1]], 2, np.random.default_rng(0),
                             torch.device('cpu'), 0.0, True, True, hierarchy_ids=torch.arange(2))
    n = len(model.prefix) + 1  # each document: the prefix, its text, [SEP]
    lengths = np.diff(b['cu_seq_lens_q'].numpy())[:2]
    assert sorted(lengths.tolist()) == [n + 3, n + 4]
    assert b['position_ids'][0].tolist() == [*range(2, 2 + lengths[0]),
                                             *range(2, 2 + lengths[1])] + [0] * (
        b['input_ids'].shape[1] - lengths.sum())
