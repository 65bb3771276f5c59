"""Tests of lhmix.py, train.py and evaluate.py, in the paper's order (Kong, Zhang & Wang, KDD 2025).

Every expected value is computed here, independently: the paper's formulas written out in float64,
or worked by hand. Nothing is downloaded: models are `tiny` BERTs built locally, data are written
to tmp_path (or the synthetic demo set).
"""
import io
import json
import math
import os
import re
import zipfile
from xml.sax.saxutils import escape

os.environ['HF_HUB_OFFLINE'] = '1'  # never reach the hub, whatever a test does
os.environ['TRANSFORMERS_OFFLINE'] = '1'

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import evaluate  # noqa: E402
import lhmix  # noqa: E402
import train  # noqa: E402


# -----------------------------------------------------------------------------
# Eq. 2: ZMLCE, per row log(1 + sum_{neg} e^s) + log(1 + sum_{pos} e^-s)


def zmlce_ref(scores, targets, valid=None):
    """Eq. 2 by hand in float64, one row at a time, over the row's valid labels."""
    s = np.asarray(scores.detach().double() if torch.is_tensor(scores) else scores, dtype=np.float64)
    y = np.broadcast_to(np.asarray(targets, dtype=bool), s.shape)
    ok = np.ones(s.shape, bool) if valid is None else np.broadcast_to(np.asarray(valid, dtype=bool), s.shape)

    def log1p_sum_exp(xs):  # log(1 + sum e^x), shifted by max(0, x) so that e^1e4 does not overflow
        m = max([0.0, *xs])
        return m + math.log(math.exp(-m) + sum(math.exp(x - m) for x in xs))

    out = np.zeros(s.shape[:-1])
    for i in np.ndindex(out.shape):
        neg = [v for v, p, k in zip(s[i], y[i], ok[i]) if k and not p]
        pos = [-v for v, p, k in zip(s[i], y[i], ok[i]) if k and p]
        out[i] = log1p_sum_exp(neg) + log1p_sum_exp(pos)
    return out


def zmlce_authors(s, y, valid=None):
    """The authors' (HPT's) form: sign flip, mask with 1e12, append a zero logit, logsumexp."""
    y = y.to(s.dtype).expand_as(s)
    s = (1 - 2 * y) * s
    if valid is not None:
        s = s - (~valid).to(s.dtype) * 1e12
    zeros = torch.zeros_like(s[..., :1])
    neg = torch.logsumexp(torch.cat([s - y * 1e12, zeros], -1), -1)
    pos = torch.logsumexp(torch.cat([s - (1 - y) * 1e12, zeros], -1), -1)
    return neg + pos


def test_zmlce_matches_eq2_with_and_without_valid():
    g = torch.Generator().manual_seed(0)
    s = torch.randn(5, 7, generator=g, dtype=torch.float64) * 3
    y = torch.rand(5, 7, generator=g) < 0.3
    valid = torch.rand(5, 7, generator=g) < 0.7
    np.testing.assert_allclose(lhmix.zmlce(s, y).numpy(), zmlce_ref(s, y), rtol=1e-12)
    np.testing.assert_allclose(lhmix.zmlce(s, y, valid).numpy(), zmlce_ref(s, y, valid), rtol=1e-12)
    # float32 scores: same values to float32 precision
    np.testing.assert_allclose(lhmix.zmlce(s.float(), y, valid).numpy(), zmlce_ref(s.float(), y, valid), rtol=1e-5)


def test_zmlce_broadcasts_targets_over_depths_and_valid_over_batch():
    g = torch.Generator().manual_seed(1)
    s = torch.randn(3, 2, 6, generator=g, dtype=torch.float64)  # (B, D, V)
    y = torch.rand(3, 1, 6, generator=g) < 0.5                  # (B, 1, V)
    valid = torch.tensor([[1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 1, 1]], dtype=torch.bool)  # (D, V)
    loss = lhmix.zmlce(s, y, valid)
    assert loss.shape == (3, 2)
    np.testing.assert_allclose(loss.numpy(), zmlce_ref(s, y, valid), rtol=1e-12)


def test_zmlce_rows_without_positives_or_valid_labels():
    s = torch.tensor([[0.5, -1.0, 2.0], [0.5, -1.0, 2.0]], dtype=torch.float64)
    y = torch.zeros(2, 3, dtype=torch.bool)
    valid = torch.tensor([[True, True, True], [False, False, False]])
    expected = [math.log(1 + math.exp(0.5) + math.exp(-1.0) + math.exp(2.0)), 0.0]
    np.testing.assert_allclose(lhmix.zmlce(s, y, valid).numpy(), expected, rtol=1e-12)


def test_zmlce_huge_magnitudes_finite_and_at_analytic_limit():
    s = torch.tensor([[1e4, -1e4, 3.0], [-1e4, 1e4, 0.0]], requires_grad=True)
    y = torch.tensor([[0, 1, 1], [0, 1, 0]], dtype=torch.bool)
    loss = lhmix.zmlce(s, y)
    # row 0: log(1 + e^1e4) + log(1 + e^1e4 + e^-3) -> 2e4; row 1: log(1 + e^-1e4 + e^0) + log(1 + e^-1e4) -> log 2
    np.testing.assert_allclose(loss.detach().numpy(), [2e4, math.log(2)], rtol=1e-6)
    loss.sum().backward()
    # gradient of Eq. 2: e^s / (1 + sum_neg e^s) for negatives, -e^-s / (1 + sum_pos e^-s) for positives
    np.testing.assert_allclose(s.grad.numpy(), [[1, -1, 0], [0, 0, 0.5]], atol=1e-6)


def test_zmlce_equals_authors_plain_formula_values_and_gradients():
    g = torch.Generator().manual_seed(2)
    s = (torch.randn(4, 3, 8, generator=g, dtype=torch.float64) * 4).requires_grad_()
    y = torch.rand(4, 1, 8, generator=g) < 0.4
    valid = torch.rand(3, 8, generator=g) < 0.8
    ours = lhmix.zmlce(s, y, valid)
    theirs = zmlce_authors(s, y, valid)
    np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), rtol=1e-12)
    w = torch.rand(4, 3, generator=g, dtype=torch.float64)  # a non-uniform upstream gradient
    g1, = torch.autograd.grad((ours * w).sum(), s)
    g2, = torch.autograd.grad((theirs * w).sum(), s)
    np.testing.assert_allclose(g1.numpy(), g2.numpy(), atol=1e-12)


def test_zmlce_gradcheck_and_gradient_of_plain_formula():
    g = torch.Generator().manual_seed(3)
    s = torch.randn(3, 2, 5, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.rand(3, 1, 5, generator=g) < 0.5
    valid = torch.rand(2, 5, generator=g) < 0.8
    assert torch.autograd.gradcheck(lambda x: lhmix.zmlce(x, y, valid), (s,))
    # autograd of Eq. 2 written plainly, log(1 + sum exp)
    yb, ok = y.expand_as(s), valid.expand_as(s)
    plain = (torch.log1p((torch.exp(s) * (~yb & ok)).sum(-1))
             + torch.log1p((torch.exp(-s) * (yb & ok)).sum(-1)))
    g_plain, = torch.autograd.grad(plain.sum(), s)
    g_ours, = torch.autograd.grad(lhmix.zmlce(s, y, valid).sum(), s)
    np.testing.assert_allclose(g_ours.numpy(), g_plain.numpy(), atol=1e-12)
    assert (g_ours[~ok] == 0).all()  # invalid labels get exactly zero gradient


@pytest.mark.parametrize('dtype, tol', [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_zmlce_half_precision_close_to_fp32(dtype, tol):
    g = torch.Generator().manual_seed(4)
    s32 = torch.randn(4, 30, generator=g) * 5
    s32[0, :2] = torch.tensor([1e4, -1e4])
    s32 = s32.to(dtype).float()  # values exactly representable in dtype
    y = torch.rand(4, 30, generator=g) < 0.3
    valid = torch.rand(4, 30, generator=g) < 0.9
    s = s32.to(dtype).requires_grad_()
    loss = lhmix.zmlce(s, y, valid)
    loss.sum().backward()
    ref = s32.clone().requires_grad_()
    lhmix.zmlce(ref, y, valid).sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(s.grad).all() and s.grad.dtype == dtype
    np.testing.assert_allclose(loss.detach().double().numpy(), zmlce_ref(s32, y, valid), rtol=1e-5)
    np.testing.assert_allclose(s.grad.float().numpy(), ref.grad.numpy(), atol=tol)
    assert (s.grad[~valid] == 0).all()


@pytest.mark.skipif(not torch.cuda.is_available() or lhmix.triton is None, reason='needs a CUDA GPU and Triton')
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_zmlce_cuda_kernel_matches_eq2_and_cpu_gradient(dtype):
    g = torch.Generator().manual_seed(5)
    for shape, valid_shape in (((16, 2, 141), (2, 141)), ((3, 5000), None)):  # 5000: more than one block
        s = torch.randn(*shape, generator=g) * 4
        s.view(-1)[:2] = torch.tensor([1e4, -1e4])
        s = s.to(dtype).float()  # values exactly representable in dtype
        y = torch.rand(*shape[:-2], 1, shape[-1], generator=g) < 0.2
        valid = torch.rand(*valid_shape, generator=g) < 0.8 if valid_shape else None
        w = torch.rand(*shape[:-1], generator=g)
        cuda = s.to(dtype).cuda().requires_grad_()
        loss = lhmix.zmlce(cuda, y.cuda(), valid.cuda() if valid is not None else None)
        (loss * w.cuda()).sum().backward()
        cpu = s.clone().requires_grad_()
        (lhmix.zmlce(cpu, y, valid) * w).sum().backward()
        np.testing.assert_allclose(loss.detach().cpu().double().numpy(), zmlce_ref(s, y, valid), rtol=1e-5)
        assert cuda.grad.dtype == dtype
        np.testing.assert_allclose(cuda.grad.float().cpu().numpy(), cpu.grad.numpy(), atol=1e-6 if dtype == torch.float32 else 1e-2)


# Eq. 7: the two losses mixed per pair, one lambda per batch row


def test_mixed_zmlce_mixes_per_row():
    g = torch.Generator().manual_seed(5)
    s = torch.randn(4, 2, 6, generator=g, dtype=torch.float64)
    t_i, t_j = torch.rand(4, 1, 6, generator=g) < 0.5, torch.rand(4, 1, 6, generator=g) < 0.5
    valid = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1]], dtype=torch.bool)
    lam = torch.tensor([0.5, 0.6, 0.9, 1.0], dtype=torch.float64)
    got = lhmix.mixed_zmlce(s, t_i, t_j, lam, valid).numpy()
    L_i, L_j, lam_np = zmlce_ref(s, t_i, valid), zmlce_ref(s, t_j, valid), lam.numpy()[:, None]
    np.testing.assert_allclose(got, lam_np * L_i + (1 - lam_np) * L_j, rtol=1e-6)
    batch_mean = lam_np.mean() * L_i + (1 - lam_np.mean()) * L_j
    assert not np.allclose(got, batch_mean)  # not the authors' code's batch-mean lambda


# -----------------------------------------------------------------------------
# Eqs. 3-5: hierarchy similarity, mixing ratio, Mixup of hidden states


def test_hierarchy_similarity_eq3():
    rng = np.random.default_rng(6)
    a, b = rng.normal(size=(5, 16)), rng.normal(size=(5, 16))
    expected = 0.5 * ((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)) + 1)
    got = lhmix.hierarchy_similarity(torch.from_numpy(a), torch.from_numpy(b)).double().numpy()
    np.testing.assert_allclose(got, expected, atol=1e-6)
    same = lhmix.hierarchy_similarity(torch.from_numpy(a), torch.from_numpy(a))
    opposite = lhmix.hierarchy_similarity(torch.from_numpy(a), torch.from_numpy(-a))
    np.testing.assert_allclose(same.numpy(), 1, atol=1e-6)
    np.testing.assert_allclose(opposite.numpy(), 0, atol=1e-6)


@pytest.mark.parametrize('alpha, beta', [(1.0, 0.75), (0.5, 1.0), (2.0, 0.6)])
def test_mixup_ratio_eq4(alpha, beta):
    s = torch.tensor([0.0, 1.0, 0.1, 0.37, 0.8], dtype=torch.float64)
    got = lhmix.mixup_ratio(s, alpha, beta).numpy()
    expected = [-(beta - 0.5) * x ** alpha + beta for x in s.tolist()]
    np.testing.assert_allclose(got, expected, rtol=1e-14)
    assert got[0] == pytest.approx(beta) and got[1] == pytest.approx(0.5)  # unrelated: beta; identical: 0.5


def test_mix_hidden_eq5_per_row():
    g = torch.Generator().manual_seed(7)
    h_i, h_j = torch.randn(3, 2, 4, generator=g), torch.randn(3, 2, 4, generator=g)
    lam = torch.tensor([0.5, 0.75, 1.0])
    a, b, l = h_i.double().numpy(), h_j.double().numpy(), lam.double().numpy()[:, None, None]
    np.testing.assert_allclose(lhmix.mix_hidden(h_i, h_j, lam).numpy(), l * a + (1 - l) * b, atol=1e-6)


def test_pair_and_ratio_lhmix_composes_eq3_and_eq4():
    torch.manual_seed(0)
    table = torch.randn(10, 8)
    rows = torch.tensor([3, 1, 4, 1, 5, 9])
    perm, lam = lhmix.pair_and_ratio('lhmix', 6, table[rows], alpha=2.0, beta=0.9)  # the batch's rows
    assert sorted(perm.tolist()) == list(range(6))
    t = table.double().numpy()
    for b in range(6):
        u, v = t[rows[b]], t[rows[perm[b]]]
        s = 0.5 * (u @ v / (np.linalg.norm(u) * np.linalg.norm(v)) + 1)
        assert lam[b].item() == pytest.approx(-(0.9 - 0.5) * s ** 2 + 0.9, abs=1e-6)


def test_pair_and_ratio_mixup_folds_beta_into_half_to_one():
    torch.manual_seed(0)
    perm, lam = lhmix.pair_and_ratio('mixup', 20000, mix_alpha=1.0)
    assert lam.min() >= 0.5 and lam.max() <= 1.0
    assert lam.mean().item() == pytest.approx(0.75, abs=0.01)  # max(U, 1-U), U ~ Beta(1,1): uniform on [0.5, 1]
    assert sorted(perm.tolist()) == list(range(20000))


# -----------------------------------------------------------------------------
# Sec. 3: the hierarchy


def write_lines(path, lines):
    path.write_text(''.join(line + '\n' for line in lines), encoding='utf-8')
    return str(path)


def test_hierarchy_from_taxonomy(tmp_path):
    path = write_lines(tmp_path / 'toy.taxonomy', ['Root\tCS\tMedical', 'CS\tML\tDB', '', 'Medical\tCancer',
                                                   'ML\tDeep_Learning'])
    h = lhmix.Hierarchy.from_taxonomy(path, {'ML': 'machine learning'})
    assert h.labels == ['CS', 'Medical', 'ML', 'DB', 'Cancer', 'Deep_Learning']
    assert h.depth == [1, 1, 2, 2, 2, 3] and h.num_depths == 3
    assert h.by_depth == [[0, 1], [2, 3, 4], [5]]
    assert h.names == ['CS', 'Medical', 'machine learning', 'DB', 'Cancer', 'Deep Learning']
    assert h.closure([5]) == [0, 2, 5]
    assert h.closure([5, 4]) == [0, 1, 2, 4, 5]
    assert h.closure([]) == []


def test_hierarchy_from_parent_map():
    h = lhmix.Hierarchy({'a': None, 'b': 'Root', 'a/c_d': 'a', 'a/c_d/e': 'a/c_d'})
    assert h.parent == [-1, -1, 0, 2] and h.depth == [1, 1, 2, 3]
    assert h.names == ['a', 'b', 'c d', 'e']
    with pytest.raises(ValueError, match="'zz'.*'a'"):
        lhmix.Hierarchy({'a': 'zz'})


@pytest.mark.parametrize('lines, line_no, label, what', [
    (['Root\tA\tB', 'A\tx', 'B\tx'], 3, 'x', 'two parents'),
    (['Root\tA', 'B\tC', 'C\tB'], 2, 'C', 'cycle'),
    (['Root\tA', 'Z\tq'], 2, 'Z', 'refers to nothing'),
])
def test_bad_taxonomy_names_label_and_line(tmp_path, lines, line_no, label, what):
    path = write_lines(tmp_path / 'bad.taxonomy', lines)
    with pytest.raises(ValueError) as e:
        lhmix.Hierarchy.from_taxonomy(path)
    msg = str(e.value)
    assert msg.startswith(f'{path}:{line_no}:') and repr(label) in msg and what in msg


# -----------------------------------------------------------------------------
# Sec. 3.2: the hierarchical prompt template, verbalizer (Eq. 1) and batching

PARENTS = {'Sci': None, 'Art': None, 'Sci/quantum_physics': 'Sci', 'Sci/biology': 'Sci',
           'Art/jazz_music': 'Art', 'Sci/quantum_physics/optics': 'Sci/quantum_physics'}
DEPTHS = [1, 1, 2, 2, 2, 3]
TEXTS = ['light waves bend in glass', 'cells divide and grow', 'the band played a slow tune']


@pytest.fixture(scope='module')
def tiny():
    torch.manual_seed(0)
    return lhmix.build_model('tiny', lhmix.Hierarchy(PARENTS), 'prompt', TEXTS)


def test_template_layout():
    ids = lhmix.template(3, 101, 102, [7, 8, 9], 5)
    assert ids == [101, 7, 5, 8, 5, 9, 5, 102]
    assert [ids[2 * d] for d in (1, 2, 3)] == [5, 5, 5]  # slot of depth d at position 2d


def test_model_prefix_slots_and_new_token_embeddings(tiny):
    model, tok = tiny
    V, cls, sep, mask = 6, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id
    base = len(tok)
    d1, d2, d3, slot = base + V, base + V + 1, base + V + 2, base + V + 3
    assert model.prefix == [cls, d1, slot, d2, slot, d3, slot, sep]
    hidden = torch.arange(10.0).reshape(1, 10, 1)
    assert model.slots(hidden).flatten().tolist() == [2.0, 4.0, 6.0]
    emb = model.mlm.get_input_embeddings().weight.detach()
    assert emb.shape[0] == base + V + 3 + 1
    for v, name in enumerate(['sci', 'art', 'quantum physics', 'biology', 'jazz music', 'optics']):
        pieces = tok.convert_tokens_to_ids(name.split())
        assert tok.unk_token_id not in pieces
        torch.testing.assert_close(emb[base + v], emb[pieces].mean(0))  # label token = mean of its name
    torch.testing.assert_close(emb[slot], emb[mask])  # slot starts as [MASK]


def test_make_batch_layout(tiny):
    model, _ = tiny
    texts = [np.array([5, 6, 7]), np.array([8])]
    b = lhmix.make_batch(model, texts, [[0, 2], [1]], multiple=8)
    p, sep, pad = model.prefix, model.special['sep'], model.special['pad']
    row0 = p + [5, 6, 7, sep]
    row1 = p + [8, sep]
    T = 16  # 12 tokens rounded up to a multiple of 8
    assert b['input_ids'].tolist() == [row0 + [pad] * (T - len(row0)), row1 + [pad] * (T - len(row1))]
    assert b['attention_mask'].tolist() == [[1] * len(row0) + [0] * (T - len(row0)),
                                            [1] * len(row1) + [0] * (T - len(row1))]
    assert b['targets'].tolist() == [[1, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0]]


def test_make_batch_mlm_masks_only_text(tiny):
    model, tok = tiny
    rng = np.random.default_rng(0)
    texts = [rng.integers(5, len(tok), n) for n in [150] + list(rng.integers(1, 12, 60))]  # many text ends
    labels = [[0]] * len(texts)
    plain = lhmix.make_batch(model, texts, labels, 8)['input_ids'].reshape(-1)
    b = lhmix.make_batch(model, texts, labels, 8, np.random.default_rng(1), mlm_rate=0.15)
    ids, pos, T, P = b['input_ids'].reshape(-1), b['mlm_pos'], b['input_ids'].shape[1], len(model.prefix)
    col, row = pos % T, pos // T
    assert ((col >= P) & (col < P + torch.tensor([len(t) for t in texts])[row])).all()  # text part only
    assert torch.equal(b['mlm_labels'], plain[pos])  # labels: the original ids
    others = torch.ones(ids.numel(), dtype=torch.bool)
    others[pos] = False
    assert torch.equal(ids[others], plain[others])  # nothing else touched
    assert 0.10 < len(pos) / sum(len(t) for t in texts) < 0.20
    assert 0.6 < (ids[pos] == model.special['mask']).float().mean() < 0.95  # most of them [MASK]


def test_mlm_loss_finite_when_nothing_is_masked(tiny):
    model, _ = tiny
    # MLM on (rate > 0) but so low that no word-piece is drawn, as happens to a short last batch
    b = lhmix.make_batch(model, [np.array([5]), np.array([6])], [[0], [1]], 8,
                         np.random.default_rng(0), mlm_rate=1e-12)
    assert len(b.get('mlm_pos', [])) == 0
    model.eval()
    assert torch.isfinite(model(**b))


def test_forward_and_predict_follow_eqs_1_5_6_7():
    model, tok = lhmix.build_model('tiny', lhmix.Hierarchy(PARENTS), 'prompt', TEXTS)
    model.eval()  # no dropout: the hand computation below sees the same hidden states
    toks, _ = lhmix.tokenize(tok, TEXTS, 50)
    b = lhmix.make_batch(model, toks, [[0, 2, 5], [0, 3], [1, 4]], 8)
    with torch.no_grad():
        model.label_bias.copy_(torch.linspace(-0.3, 0.3, 6))
        hidden = model.encode(b['input_ids'], b['attention_mask'])
        h = hidden[:, [2, 4, 6]]  # the three [P] slots
        E = model.mlm.get_input_embeddings().weight[len(tok):len(tok) + 6]

        def scores(x):  # Eq. 1: MLM head transform, dotted with label embeddings, plus bias
            return model.mlm.cls.predictions.transform(x) @ E.t() + model.label_bias

        valid = np.array([[d == k + 1 for d in DEPTHS] for k in range(3)])
        y = b['targets'][:, None].numpy()
        plain = zmlce_ref(scores(h), y, valid).sum(1).mean()
        perm, lam = torch.tensor([2, 0, 1]), torch.tensor([0.9, 0.6, 0.5])
        mixed = scores(lam[:, None, None] * h + (1 - lam[:, None, None]) * h[perm])  # Eqs. 5-6
        l = lam.double().numpy()[:, None]
        eq7 = (l * zmlce_ref(mixed, y, valid) + (1 - l) * zmlce_ref(mixed, y[perm.numpy()], valid)).sum(1).mean()
        assert model(**b).item() == pytest.approx(plain, rel=1e-5)
        assert model(**b, perm=perm, lam=lam).item() == pytest.approx(eq7, rel=1e-5)
        # prediction: at depth d, the labels of depth d whose score is > 0
        s = scores(h).numpy()
        expected = np.array([[s[n, DEPTHS[v] - 1, v] > 0 for v in range(6)] for n in range(3)])
        assert np.array_equal(model.predict(b['input_ids'], b['attention_mask']).numpy(), expected)


# -----------------------------------------------------------------------------
# Sec. 4.1: local hierarchy sequences and the cached [CLS] table


def test_local_hierarchy_ids(tiny):
    model, tok = tiny
    name_ids = model.name_ids(tok)
    ids = lhmix.local_hierarchy_ids(model, [0, 1, 2], name_ids)
    w = tok.convert_tokens_to_ids
    d1, d2, d3 = model.depth_ids
    assert ids == [tok.cls_token_id, d1, w('sci'), w('art'), d2, w('quantum'), w('physics'), d3, tok.sep_token_id]


def test_local_hierarchy_table_equals_live_frozen_encoder(tiny):
    model, tok = tiny
    sets = [[0, 2], [1], [2, 0], [0, 2, 5], [1, 4]]
    model.eval()
    lhmix.local_hierarchy_table(model, tok, sets)
    assert not model.training  # mode restored
    model.train()  # dropout on: the table must still come from the eval-mode encoder
    table, index = lhmix.local_hierarchy_table(model, tok, sets, batch_size=2)  # padded chunks of 2
    assert model.training
    assert len(table) == 4 and index[0] == index[2] and len(set(index.tolist())) == 4
    model.eval()
    name_ids = model.name_ids(tok)
    live = []
    with torch.no_grad():
        for s in sets:
            ids = torch.tensor([lhmix.local_hierarchy_ids(model, sorted(s), name_ids)])
            live.append(model.encode(ids, torch.ones_like(ids))[0, 0].double().numpy())
    for n in range(len(sets)):
        np.testing.assert_allclose(table[index[n]].double().numpy(), live[n], atol=1e-4)
    u, v = live[0], live[3]
    s = 0.5 * (u @ v / (np.linalg.norm(u) * np.linalg.norm(v)) + 1)
    assert lhmix.hierarchy_similarity(table[index[0]], table[index[3]]).item() == pytest.approx(s, abs=1e-5)


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


@pytest.mark.parametrize('n', sorted(HPT_SPLITS))
def test_wos_split_equals_hpt(n):
    parts = lhmix.wos_split(n)
    for part, (size, head, tail, total) in zip(parts, HPT_SPLITS[n]):
        assert (len(part), list(part[:5]), list(part[-5:]), int(part.sum())) == (size, head, tail, total)
    assert sorted(np.concatenate(parts).tolist()) == list(range(n))  # disjoint and covering


def test_wos_split_small_n_in_full():
    assert [p.tolist() for p in lhmix.wos_split(12)] == [list(p) for p in HPT_SPLIT_12]


# (Y1, Y2, Domain, area, Abstract, the abstract cleaned by hand as HPT's clean_str + stop words + 1-letter)
WOS_ROWS = [
    ('0', '0', 'CS ', 'Machine learning', '"We propose a NEW method, for (deep) learning; it\'s 2x faster!"',
     "propose new method deep learning 's 2x faster"),
    ('0', '0', 'CS', 'Machine Learning ', 'Kernels in R are used. A b c', 'kernels used'),
    ('0', '0', 'CS', 'Machine learning', 'Gradient descent converges', 'gradient descent converges'),
    ('0', '0', 'CS', 'Machine learning', "Neural networks: don't overfit?", "neural networks n't overfit"),
    ('0', '1', 'CS', 'Cryptography', 'Lattice-based encryption & keys', 'lattice based encryption keys'),
    ('1', '0', 'Medical', 'Depression ', 'Patients with mood disorders', 'patients mood disorders'),
    ('1', '0', 'Medical', 'Depression', 'Cells were "stained" with X-ray dye & imaged at 40 \u03bcm.',
     'cells stained ray dye imaged 40'),
    ('1', '1', 'Medical', 'Cancer', 'Tumour growth in mice', 'tumour growth mice'),
    ('2', '0', 'Psychology', 'Depression', 'Cognitive therapy trial', 'cognitive therapy trial'),
    ('2', '1', 'Psychology', 'Attention', 'Visual attention and memory', 'visual attention memory'),
    ('2', '1', 'Psychology ', 'Attention', 'Selective attention tasks', 'selective attention tasks'),
    ('1', '1', 'Medical', 'Cancer', 'Chemotherapy outcomes (2019)', 'chemotherapy outcomes 2019'),
]
WOS_HEADER = ['Y1', 'Y2', 'Y', 'Domain', 'area', 'keywords', 'Abstract']


def wos_table():
    return [WOS_HEADER] + [[y1, y2, str(2 * int(y1) + int(y2)), dom, area, 'kw; kw2', text]
                           for y1, y2, dom, area, text, _ in WOS_ROWS]


def write_data_txt(folder):
    os.makedirs(folder, exist_ok=True)
    return write_lines(folder / 'Data.txt', ['\t'.join(r) for r in wos_table()])


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
    h, splits = lhmix.load_wos(str(tmp_path))
    assert h.labels == ['CS', 'Medical', 'Psychology', 'Machine learning', 'Cryptography',
                        'Depression (Medical)', 'Cancer', 'Depression (Psychology)', 'Attention']
    assert h.names == ['CS', 'Medical', 'Psychology', 'Machine learning', 'Cryptography',
                       'Depression', 'Cancer', 'Depression', 'Attention']  # the frequent spelling wins
    assert h.depth == [1, 1, 1, 2, 2, 2, 2, 2, 2] and h.parent == [-1, -1, -1, 0, 0, 1, 1, 2, 2]
    # domains sorted by name (CS 0, Medical 1, Psychology 2: the Y1 codes here), then areas by (Y1, Y2)
    area_id = {('0', '0'): 3, ('0', '1'): 4, ('1', '0'): 5, ('1', '1'): 6, ('2', '0'): 7, ('2', '1'): 8}
    docs = [(clean, [int(y1), area_id[y1, y2]]) for y1, y2, _, _, _, clean in WOS_ROWS]
    for name, idx in zip(('train', 'dev', 'test'), HPT_SPLIT_12):
        assert splits[name] == [docs[i] for i in idx]


def test_load_wos_xlsx_and_zip_parse_like_data_txt(tmp_path, no_network):
    write_data_txt(tmp_path / 'txt')
    (tmp_path / 'xlsx').mkdir()
    (tmp_path / 'xlsx' / 'Data.xlsx').write_bytes(xlsx_bytes(wos_table()))
    (tmp_path / 'zip').mkdir()
    with zipfile.ZipFile(tmp_path / 'zip' / 'WebOfScience.zip', 'w') as z:
        z.writestr('Meta-data/Data.xlsx', xlsx_bytes(wos_table()))
    h0, s0 = lhmix.load_wos(str(tmp_path / 'txt'))
    for folder in ('xlsx', 'zip'):
        h, s = lhmix.load_wos(str(tmp_path / folder))
        assert (h.labels, h.names, h.parent) == (h0.labels, h0.names, h0.parent)
        assert s == s0


def test_load_wos_missing_files_no_download(tmp_path, no_network):
    folder = tmp_path / 'wos'
    folder.mkdir()
    with pytest.raises(FileNotFoundError) as e:
        lhmix.load_wos(str(folder))
    assert str(folder) in str(e.value) and 'Data.txt' in str(e.value)
    assert os.listdir(folder) == []  # no partial download left behind


def test_load_wos_wrong_field_count_names_line(tmp_path):
    rows = ['\t'.join(r) for r in wos_table()]
    rows[3] = rows[3].rsplit('\t', 1)[0]  # line 4: the abstract is missing
    path = write_lines(tmp_path / 'Data.txt', rows)
    with pytest.raises(ValueError, match=re.escape(f'{path}:4:')):
        lhmix.load_wos(str(tmp_path))


def test_load_wos_line_number_counts_blank_lines(tmp_path):
    rows = ['\t'.join(r) for r in wos_table()]
    rows[3] = rows[3].rsplit('\t', 1)[0]
    path = write_lines(tmp_path / 'Data.txt', rows[:2] + [''] + rows[2:])  # the bad row is now line 5
    with pytest.raises(ValueError, match=re.escape(f'{path}:5:')):
        lhmix.load_wos(str(tmp_path))


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
    h, splits = lhmix.load_hiagm(str(write_hiagm(tmp_path)))
    assert h.labels == ['CCAT', 'GCAT', 'C15', 'C17', 'C151']
    assert h.names == ['Corporate/Industrial', 'GCAT', 'Performance', 'C17', 'C151']
    assert splits['train'] == [('profits rose', [0, 2, 4]), ('markets fell', [0, 1, 3])]  # closed upward
    assert splits['dev'] == [('war news', [1])]
    assert splits['test'] == [('a b', [0, 1, 2])]


def test_load_hiagm_bad_lines(tmp_path):
    good = json.dumps({'token': 'x', 'label': ['GCAT']})
    bad = write_hiagm(tmp_path / 'bad', val_lines=[good, '{"token": "x", "label": ['])
    with pytest.raises(ValueError, match=re.escape(f"{bad / 'toy_val.json'}:2: malformed JSON")):
        lhmix.load_hiagm(str(bad))
    unknown = write_hiagm(tmp_path / 'unknown', train_lines=[good, good, json.dumps({'token': 'x', 'label': ['NOPE']})])
    with pytest.raises(ValueError, match=re.escape(f"{unknown / 'toy_train.json'}:3: label 'NOPE'")):
        lhmix.load_hiagm(str(unknown))


def test_load_hiagm_json_line_not_an_object(tmp_path):
    folder = write_hiagm(tmp_path, val_lines=['[1, 2]'])
    with pytest.raises(ValueError, match=re.escape(f"{folder / 'toy_val.json'}:1:")):
        lhmix.load_hiagm(str(folder))


# -----------------------------------------------------------------------------
# Evaluation: F1 (HiAGM convention), Student's t and Welch's test (the paper's appendix)


def test_f1_hand_worked():
    gold = [[0, 1], [0], [2]]
    pred = [[0], [0, 2], [1, 2]]
    # label 0: tp 2 of 2 predicted, 2 gold -> 1; label 1: 0; label 2: P 1/2, R 1 -> 2/3; label 3 absent -> 0
    # micro: tp 3, predicted 5, gold 4 -> P .6, R .75 -> 2/3
    f = evaluate.f1_scores(pred, gold, 4)
    assert f['micro_f1'] == pytest.approx(2 / 3) and f['macro_f1'] == pytest.approx((1 + 0 + 2 / 3 + 0) / 4)
    m = np.zeros((3, 4), bool)
    for i, ls in enumerate(pred):
        m[i, ls] = True
    assert evaluate.f1_scores(m, gold, 4)['macro_f1'] == pytest.approx(5 / 12)
    # labels 0 and 2 only: tp 3, predicted 4, gold 3 -> micro 6/7; macro (1 + 2/3) / 2
    sub = evaluate.f1_scores(pred, gold, 4, labels=[0, 2])
    assert sub['micro_f1'] == pytest.approx(6 / 7) and sub['macro_f1'] == pytest.approx(5 / 6)
    assert evaluate.f1_scores(pred, gold, 4, labels=[3])['macro_f1'] == 0.0


def simpson(f, a, b, n=20000):
    x = np.linspace(a, b, n + 1)
    w = np.ones(n + 1)
    w[1:-1:2], w[2:-1:2] = 4, 2
    return (b - a) / (3 * n) * (w * f(x)).sum()


@pytest.mark.parametrize('t', [0.0, 0.1, -1.0, 2.5, 10.0, -100.0])
def test_t_test_p_closed_forms(t):
    assert evaluate.t_test_p(t, 1) == pytest.approx(1 - 2 * math.atan(abs(t)) / math.pi, abs=1e-12)
    assert evaluate.t_test_p(t, 2) == pytest.approx(1 - abs(t) / math.sqrt(2 + t * t), abs=1e-12)
    c = abs(t) / math.sqrt(4 + t * t)  # df = 4: I_x(2, 1/2) integrated by hand, x = 4 / (4 + t^2)
    assert evaluate.t_test_p(t, 4) == pytest.approx(1 - 1.5 * c + 0.5 * c ** 3, abs=1e-12)


@pytest.mark.parametrize('a, b, x', [(2, 3, 0.4), (3.5, 2.5, 0.8), (6, 4, 0.55), (2.5, 7, 0.1), (2, 2, 0.5)])
def test_betainc_against_integration(a, b, x):
    density = lambda u: u ** (a - 1) * (1 - u) ** (b - 1)  # noqa: E731
    assert evaluate.betainc(a, b, x) == pytest.approx(simpson(density, 0, x) / simpson(density, 0, 1), abs=1e-9)
    assert evaluate.betainc(a, b, 0.0) == 0.0 and evaluate.betainc(a, b, 1.0) == 1.0


def test_welch_by_hand():
    x, y = [1, 2, 3, 4], [2, 4, 6, 8, 10]
    # means 2.5 and 6; s^2/n: (5/3)/4 = 5/12 and 10/5 = 2
    t, df, p = evaluate.welch(x, y)
    assert t == pytest.approx(-3.5 / math.sqrt(29 / 12), rel=1e-12)
    assert df == pytest.approx((29 / 12) ** 2 / ((5 / 12) ** 2 / 3 + 2 ** 2 / 4), rel=1e-12)  # = 2523 / 457
    # two-sided p: 1 - 2 * integral_0^|t| of Student's density with df degrees of freedom
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    density = lambda u: c * (1 + u * u / df) ** (-(df + 1) / 2)  # noqa: E731
    assert p == pytest.approx(1 - 2 * simpson(density, 0, abs(t)), abs=1e-9)


# -----------------------------------------------------------------------------
# Checkpoints: a round trip without pickle gives the same model and predictions


def test_checkpoint_round_trip_without_pickle(tmp_path, monkeypatch):
    import pickle
    torch.manual_seed(1)
    h = lhmix.Hierarchy(PARENTS)
    model, tok = lhmix.build_model('tiny', h, 'prompt', TEXTS)
    with torch.no_grad():
        model.label_bias.copy_(torch.tensor([0.5, -0.5, 0.2, -0.2, 0.1, -0.1]))
    tokens, _ = lhmix.tokenize(tok, TEXTS * 3, 50)
    before = lhmix.predict(model, tokens)
    lhmix.save_checkpoint(str(tmp_path / 'ck'), model, tok, {'epoch': 7})

    def forbidden(*a, **k):
        raise AssertionError('pickle used')
    for mod, name in ((torch, 'load'), (pickle, 'load'), (pickle, 'loads')):
        monkeypatch.setattr(mod, name, forbidden)
    loaded, tok2, meta = lhmix.load_checkpoint(str(tmp_path / 'ck'))
    monkeypatch.undo()
    assert meta['epoch'] == 7 and meta['arch'] == 'prompt' and loaded.hierarchy.labels == h.labels
    assert loaded.prefix == model.prefix and tok2.convert_ids_to_tokens(tokens[0].tolist()) == TEXTS[0].split()
    want = model.state_dict()
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, want[k]), k
    after = lhmix.predict(loaded, tokens)
    assert before.any() and not before.all() and np.array_equal(before, after)


# -----------------------------------------------------------------------------
# End to end on the demo set with the tiny model (train.py, evaluate.py)

METRIC_KEYS = {'epoch', 'mix', 'train_loss', 'dev_micro_f1', 'dev_macro_f1', 'seconds', 'samples_per_s'}


def read_metrics(out):
    with open(out / 'metrics.jsonl') as f:
        return [json.loads(line) for line in f]


def demo_args(out, *extra):
    return ['--data', 'demo', '--model', 'tiny', '--device', 'cpu', '--train-fraction', '0.5', '--batch', '8',
            '--warmup-epochs', '1', '--out', str(out), *extra]


@pytest.fixture(scope='module')
def demo_run(tmp_path_factory):
    """Two epochs, then --resume up to three; and three epochs in one go."""
    out, straight = tmp_path_factory.mktemp('e2e') / 'run', tmp_path_factory.mktemp('e2e') / 'straight'
    train.main(demo_args(out, '--epochs', '2'))
    first = read_metrics(out)
    train.main(demo_args(out, '--epochs', '3', '--resume'))
    train.main(demo_args(straight, '--epochs', '3'))
    return out, first, read_metrics(out), straight


def test_train_metrics_and_resume(demo_run):
    out, first, metrics, straight = demo_run
    assert [m['epoch'] for m in first] == [0, 1]
    assert [m['epoch'] for m in metrics] == [0, 1, 2]  # continued, no duplicates
    assert metrics[:2] == first  # the earlier lines are kept as they were
    assert all(set(m) == METRIC_KEYS for m in metrics)
    assert [m['mix'] for m in metrics] == [False, True, True]  # warm-up epoch without Mixup
    best = max(m['dev_macro_f1'] for m in metrics)
    assert best > metrics[0]['dev_macro_f1']
    with open(out / 'test_metrics.json') as f:
        test = json.load(f)
    assert metrics[test['best_epoch']]['dev_macro_f1'] == best
    state = torch.load(out / 'last' / 'train_state.pt', weights_only=True)
    assert {'optimizer', 'scaler', 'table', 'rows'} <= set(state)
    with open(out / 'last' / 'lhmix.json') as f:
        assert json.load(f)['state']['epoch'] == 3
    # per-epoch random streams: the resumed run is the uninterrupted one
    timing = ('seconds', 'samples_per_s', 'train_loss')
    assert [{k: v for k, v in m.items() if k not in timing} for m in metrics] == \
        [{k: v for k, v in m.items() if k not in timing} for m in read_metrics(straight)]
    # the summed loss may differ in the last float bits (seen with transformers 4.46)
    assert [m['train_loss'] for m in metrics] == pytest.approx([m['train_loss'] for m in read_metrics(straight)], rel=1e-6)


def test_evaluate_reproduces_test_metrics(demo_run, tmp_path):
    out = demo_run[0]
    evaluate.main(['--ckpt', str(out / 'best'), '--data', 'demo', '--device', 'cpu', '--out', str(tmp_path / 'e.json'),
                   '--save-predictions', str(tmp_path / 'p.jsonl')])
    with open(out / 'test_metrics.json') as f:
        test = json.load(f)
    with open(tmp_path / 'e.json') as f:
        ev = json.load(f)
    for k in ('micro_f1', 'macro_f1', 'per_depth', 'by_frequency'):
        assert ev[k] == test[k], k
    # the same figures from the saved predictions, scored by hand-checked f1_scores
    h, splits = lhmix.load_demo()
    with open(tmp_path / 'p.jsonl') as f:
        pred = [[h.index[v] for v in json.loads(line)['labels']] for line in f]
    f1 = evaluate.f1_scores(pred, [ls for _, ls in splits['test']], len(h))
    assert (f1['micro_f1'], f1['macro_f1']) == pytest.approx((test['micro_f1'], test['macro_f1']))


@pytest.mark.parametrize('arch, mix', [('bert', 'lhmix'), ('prompt', 'none'), ('prompt', 'mixup')])
def test_train_one_epoch_variants(tmp_path, arch, mix):
    out = tmp_path / 'run'
    train.main(['--data', 'demo', '--model', 'tiny', '--device', 'cpu', '--train-fraction', '0.1', '--epochs', '1',
                '--warmup-epochs', '0', '--arch', arch, '--mix', mix, '--out', str(out)])
    line, = read_metrics(out)
    assert line['mix'] == (mix != 'none')
    # the best checkpoint reproduces the logged dev figures
    model, tok, meta = lhmix.load_checkpoint(str(out / 'best'))
    assert meta['arch'] == arch and len(model.prefix) == (1 if arch == 'bert' else 2 * 3 + 2)  # demo: 3 depths
    _, splits = lhmix.load_demo()
    tokens, _ = lhmix.tokenize(tok, [t for t, _ in splits['dev']], meta['args']['max_length'] - len(model.prefix) - 1)
    dev = evaluate.f1_scores(lhmix.predict(model, tokens), [ls for _, ls in splits['dev']], len(model.hierarchy))
    assert (dev['micro_f1'], dev['macro_f1']) == pytest.approx((line['dev_micro_f1'], line['dev_macro_f1']))


# -----------------------------------------------------------------------------
# Bad input: one clear error, nothing written


@pytest.mark.parametrize('flag, value, shown', [('--alpha', '0', '0.0'), ('--beta', '0.5', '0.5'),
                                                ('--beta', '1.2', '1.2')])
def test_train_rejects_bad_hyperparameters(tmp_path, capsys, flag, value, shown):
    with pytest.raises(SystemExit) as e:
        train.main(['--data', 'demo', '--out', str(tmp_path / 'out'), flag, value])
    err = capsys.readouterr().err
    assert e.value.code == 2 and flag in err and f'got {shown}' in err  # argparse's usage error
    assert not (tmp_path / 'out').exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason='needs a machine without a GPU')
def test_train_rejects_cuda_without_gpu(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(['--data', 'demo', '--device', 'cuda', '--out', str(tmp_path / 'out')])
    assert e.value.code == 2 and '--device cuda' in capsys.readouterr().err
    assert not (tmp_path / 'out').exists()


def test_train_malformed_json_names_line_and_writes_nothing(tmp_path):
    good = json.dumps({'token': 'x', 'label': ['GCAT']})
    data = write_hiagm(tmp_path / 'data', val_lines=[good, good, 'not json'])
    with pytest.raises(SystemExit) as e:
        train.main(['--data', str(data), '--model', 'tiny', '--device', 'cpu', '--out', str(tmp_path / 'out')])
    assert f"{data / 'toy_val.json'}:3: malformed JSON" in str(e.value.code)
    assert not (tmp_path / 'out').exists()
