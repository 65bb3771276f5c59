"""Tests of lhmix.py in the paper's order (Kong, Zhang & Wang, KDD 2025), then of its baseline,
its misuse and its import. Every expected value is computed here, independently: the paper's
formulas in float64, or worked by hand. They need lhmix.py alone, beside this file: nothing is
downloaded, and the models are tiny masked LMs of each family, with tokenizers, built here."""
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import warnings

os.environ['HF_HUB_OFFLINE'] = '1'  # never reach the hub, whatever a test does
os.environ['TRANSFORMERS_OFFLINE'] = '1'

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import lhmix  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors  # noqa: E402
from tokenizers import trainers  # noqa: E402
from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast  # noqa: E402

PARENTS = {'Sci': None, 'Art': None, 'Sci/quantum_physics': 'Sci', 'Sci/biology': 'Sci',
           'Art/jazz_music': 'Art', 'Sci/quantum_physics/optics': 'Sci/quantum_physics'}
DEPTHS = [1, 1, 2, 2, 2, 3]
TEXTS = ['light waves bend in glass', 'cells divide and grow', 'the band played a slow tune']


def tiny_model(hierarchy, arch='prompt', max_length=512):
    """build_model on a 2-layer, 128-wide BERT whose WordPiece vocabulary is the words of TEXTS
    and of the label names."""
    words = sorted({w for t in TEXTS + hierarchy.names for w in re.findall(r'\w+', t.lower())})
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, 'vocab.txt')
        with open(path, 'w') as f:
            f.write('\n'.join(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + words) + '\n')
        tok = BertTokenizerFast(path)
    mlm = BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=128, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=256))
    return lhmix.build_model(mlm, tok, hierarchy, arch, max_length), tok


# Each family (lhmix.FAMILIES): its tokenizer's kind, its transformers classes' prefix, its
# special tokens in the order of their ids, and what its config differs in from the defaults
# below. RoBERTa's <pad> is 1, so that its positions start at 2, of 514 as in roberta-base;
# DeBERTa's are deberta-v3-base's relative positions only.
WORDPIECE = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]']
ROBERTA = ['<s>', '<pad>', '</s>', '<unk>', '<mask>']
KINDS = {'bert': ('wordpiece', 'Bert', WORDPIECE, {}),
         'roberta': ('bpe', 'Roberta', ROBERTA, dict(max_position_embeddings=514,
                                                     type_vocab_size=1)),
         'xlm-roberta': ('unigram', 'XLMRoberta', ROBERTA, dict(max_position_embeddings=514,
                                                                type_vocab_size=1)),
         'camembert': ('unigram', 'Camembert', ROBERTA, dict(max_position_embeddings=514,
                                                             type_vocab_size=1)),
         'deberta-v2': ('unigram', 'DebertaV2', WORDPIECE, dict(
             relative_attention=True, position_biased_input=False, pos_att_type=['p2c', 'c2p'],
             norm_rel_ebd='layer_norm', share_att_key=True, position_buckets=256)),
         'modernbert': ('bpe', 'ModernBert', WORDPIECE, {}),
         'distilbert': ('wordpiece', 'DistilBert', WORDPIECE, dict(hidden_dim=256))}


def tiny_family(kind, texts):
    """Return (a random 2-layer, 128-wide masked LM of the family `kind`, as tiny_bert's, and its
    tokenizer trained on `texts` by `tokenizers`), the same in every process. The tokenizer is of
    the family's kind, in its fast class (ModernBERT's: PreTrainedTokenizerFast, as its hub
    repository) with its special tokens: BERT's uncased WordPiece, its vocabulary the texts'
    words and characters, as WordPiece's trainer breaks ties in an order that changes from
    process to process; GPT-2's byte-level BPE; SentencePiece's Unigram ('▁' before each word),
    its pieces sorted, their scores rounded and a character's the lowest, as the trainer's differ
    so too."""
    model, name, special, extra = KINDS[kind]
    pad, unk, cls, sep, mask = (special[i] for i in (
        (1, 3, 0, 2, 4) if special == ROBERTA else (0, 1, 2, 3, 4)))
    if model == 'wordpiece':
        tok = Tokenizer(models.WordPiece(unk_token=unk))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        words = sorted({w for t in texts for w, _ in tok.pre_tokenizer.pre_tokenize_str(
            tok.normalizer.normalize_str(t))})
        chars = sorted({c for w in words for c in w})
        vocab = dict.fromkeys(special + chars + ['##' + c for c in chars] + words)
        tok.model = models.WordPiece({p: i for i, p in enumerate(vocab)}, unk_token=unk)
    elif model == 'bpe':
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.train_from_iterator(texts, trainers.BpeTrainer(
            vocab_size=1000, special_tokens=special, show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    else:
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        # Its trainer keeps a piece only if two distinct words hold it: each word's plural too
        # makes the words pieces, as in a vocabulary learned from much text.
        tok.train_from_iterator(texts + [w + 's' for t in texts for w in t.split()],
                                trainers.UnigramTrainer(vocab_size=1000, special_tokens=special,
                                                        unk_token=unk, show_progress=False))
        pieces = json.loads(tok.to_str())['model']['vocab'][len(special):]
        low = round(min(s for _, s in pieces), 6)
        tok.model = models.Unigram([(p, 0.0) for p in special] + sorted(
            (p, low if len(p) == 1 else round(s, 6)) for p, s in pieces), special.index(unk), False)
    tok.post_processor = processors.TemplateProcessing(  # cls $A sep, as the family's own
        single=f'{cls} $A {sep}', special_tokens=[(t, special.index(t)) for t in (cls, sep)])
    tokenizer = getattr(transformers, 'PreTrainedTokenizerFast' if kind == 'modernbert' else
                        name + 'TokenizerFast')(tokenizer_object=tok, pad_token=pad,
                                                unk_token=unk, cls_token=cls, sep_token=sep,
                                                mask_token=mask)
    ids = {k + '_token_id': special.index(t) for k, t in (
        ('pad', pad), ('bos', cls), ('eos', sep), ('cls', cls), ('sep', sep))}
    config = getattr(transformers, name + 'Config')(
        vocab_size=len(tokenizer), hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=256, **ids, **extra)
    with torch.random.fork_rng():  # The same weights in every process, the caller's seed kept
        torch.manual_seed(0)
        return transformers.AutoModelForMaskedLM.from_config(config), tokenizer


def error(call, kind=ValueError):
    """The message of the `kind` error that `call` raises, checked to be one line."""
    with pytest.raises(kind) as e:
        call()
    assert '\n' not in str(e.value)
    return str(e.value)


# ZMLCE: Eq. 2, per row log(1 + sum_{neg} e^s) + log(1 + sum_{pos} e^-s), and its gradient, Eq. 8

def zmlce_refs(scores, targets, valid=None):
    """Eqs. 2 and 8 in float64, a row at a time over its valid labels: the loss and its gradient
    e^{s_k} / (1 + sum_neg e^s) for a negative k, -e^{-s_k} / (1 + sum_pos e^-s) for a positive k,
    0 if invalid. Each 1 + sum is divided by e^m, m = max(0, exponents): e^1e4 stays finite."""
    s = np.asarray(scores.detach().double() if torch.is_tensor(scores) else scores, np.float64)
    y = np.broadcast_to(np.asarray(targets, dtype=bool), s.shape)
    ok = np.broadcast_to(np.asarray(True if valid is None else valid, dtype=bool), s.shape)
    loss, grad = np.zeros(s.shape[:-1]), np.zeros(s.shape)
    for i in np.ndindex(loss.shape):
        for positive, sign in ((False, 1.0), (True, -1.0)):
            ks = [k for k in range(s.shape[-1]) if ok[i][k] and y[i][k] == positive]
            x = [sign * s[i][k] for k in ks]  # the exponents: s for negatives, -s for positives
            m = max([0.0, *x])
            total = math.exp(-m) + sum(math.exp(v - m) for v in x)
            loss[i] += m + math.log(total)
            for k, v in zip(ks, x):
                grad[i][k] = sign * math.exp(v - m) / total
    return loss, grad


def zmlce_authors(s, y, valid=None):
    """The authors' (HPT's) form: sign flip, mask with 1e12, append a zero logit, logsumexp."""
    y = y.to(s.dtype).expand_as(s)
    s = (1 - 2 * y) * s
    if valid is not None:
        s = s - (~valid).to(s.dtype) * 1e12
    zeros = torch.zeros_like(s[..., :1])
    return (torch.logsumexp(torch.cat([s - y * 1e12, zeros], -1), -1)  # negatives
            + torch.logsumexp(torch.cat([s - (1 - y) * 1e12, zeros], -1), -1))  # positives


def test_zmlce_and_refs_by_hand():
    # one negative, one positive at 0: loss 2 log 2, gradient 1 / (1 + 1), -1 / (1 + 1); invalid: 0
    loss, grad = zmlce_refs([[0.0, 0.0, 5.0]], [[0, 1, 0]], [[1, 1, 0]])
    np.testing.assert_allclose(np.r_[loss, grad[0]], [2 * math.log(2), 0.5, -0.5, 0])
    # two negatives at log 2 and 0: gradient 2 / (1 + 2 + 1), 1 / 4
    np.testing.assert_allclose(zmlce_refs([[math.log(2), 0.0]], [[0, 0]])[1], [[0.5, 0.25]])
    # rows without positives, or without valid labels
    s, valid = torch.tensor([[0.5, -1.0, 2.0]] * 2), torch.tensor([[True] * 3, [False] * 3])
    expected = [math.log(1 + math.exp(0.5) + math.exp(-1.0) + math.exp(2.0)), 0.0]
    np.testing.assert_allclose(lhmix.zmlce(s, torch.zeros(2, 3), valid), expected, rtol=1e-6)
    # huge magnitudes: finite, at the analytic limit
    s = torch.tensor([[1e4, -1e4, 3.0], [-1e4, 1e4, 0.0]], requires_grad=True)
    loss = lhmix.zmlce(s, torch.tensor([[0, 1, 1], [0, 1, 0]], dtype=torch.bool))
    # row 0: log(1 + e^1e4) + log(1 + e^1e4 + e^-3) -> 2e4; row 1: log(2 + e^-1e4) + log(1 + e^-1e4)
    np.testing.assert_allclose(loss.detach().numpy(), [2e4, math.log(2)], rtol=1e-6)
    loss.sum().backward()
    # Eq. 8: e^s / (1 + sum_neg e^s) for negatives, -e^-s / (1 + sum_pos e^-s) for positives
    np.testing.assert_allclose(s.grad.numpy(), [[1, -1, 0], [0, 0, 0.5]], atol=1e-6)


# float64 (and the authors' form) on plain rows and on (B, D, V) rows with targets broadcast over
# depths and valid over the batch; half precision on the CPU; the fused CUDA kernel (with a GPU)
# The CUDA cases exist where a CUDA GPU and Triton do (on a CPU, nothing is skipped for want of
# them); the cpu cases beside them, and the fused kernel under Triton's interpreter, are their
# twins.
CUDA = torch.cuda.is_available() and lhmix.triton is not None
CASES = ([('cpu', torch.float64, 1e-12, *shapes) for shapes in (
    ((5, 7), (5, 7), None), ((5, 7), (5, 7), (5, 7)), ((3, 2, 6), (3, 1, 6), (2, 6)),
    ((4, 3, 8), (4, 1, 8), (3, 8)))]
    + [('cpu', dtype, tol, (4, 30), (4, 30), (4, 30))
       for dtype, tol in ((torch.float16, 2e-3), (torch.bfloat16, 1e-2))]
    + [('cuda', dtype, tol, *shapes) for dtype, tol in ((torch.float32, 1e-6),
                                                         (torch.bfloat16, 1e-2)) if CUDA
       for shapes in (((16, 2, 141), (16, 1, 141), (2, 141)), ((3, 5000), (3, 5000), None))])


@pytest.mark.parametrize('device, dtype, tol, s_shape, y_shape, v_shape', CASES)
def test_zmlce_eq2_eq8_against_float64(device, dtype, tol, s_shape, y_shape, v_shape):
    g = torch.Generator().manual_seed(0)
    s = torch.randn(*s_shape, generator=g, dtype=torch.float64) * 4
    if dtype != torch.float64:  # finite at any magnitude
        s.view(-1)[:2] = torch.tensor([1e4, -1e4])
    s = s.to(dtype).double()  # values exactly representable in dtype
    y = torch.rand(*y_shape, generator=g) < 0.3
    valid = torch.rand(*v_shape, generator=g) < 0.8 if v_shape else None
    w = torch.rand(*s_shape[:-1], generator=g, dtype=torch.float64)  # a non-uniform upstream grad
    x = s.to(device, dtype, copy=True).requires_grad_()
    loss = lhmix.zmlce(x, y.to(device), valid if valid is None else valid.to(device))
    grad, = torch.autograd.grad((loss * w.to(device, loss.dtype)).sum(), x)
    ref, ref_grad = zmlce_refs(s, y, valid)
    assert loss.shape == s_shape[:-1] and grad.dtype == dtype
    np.testing.assert_allclose(loss.detach().cpu().double(), ref, rtol=min(tol, 1e-5))
    np.testing.assert_allclose(grad.cpu().double(), ref_grad * w.numpy()[..., None], atol=tol)
    if dtype == torch.float64:
        assert torch.autograd.gradcheck(lambda x: lhmix.zmlce(x, y, valid), (x,))
        theirs = zmlce_authors(x, y, valid)
        np.testing.assert_allclose(loss.detach(), theirs.detach(), rtol=1e-12)
        np.testing.assert_allclose(grad, torch.autograd.grad((theirs * w).sum(), x)[0], atol=1e-12)
        np.testing.assert_allclose(lhmix.zmlce(s.float(), y, valid), ref, rtol=1e-5)  # float32


FUSED_ON_CPU = """
import torch, lhmix
assert type(lhmix._zmlce_kernel).__name__ == 'InterpretedFunction'
torch.manual_seed(0)
for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
    for s_shape, y_shape, v_shape, scale in (((16, 2, 141), (16, 1, 141), (2, 141), 3.0),
                                             ((3, 5000), (3, 5000), None, 3.0),
                                             ((4, 37), (4, 37), (4, 37), 1e4)):
        s = (torch.randn(s_shape) * scale).to(dtype)
        y, up = torch.rand(y_shape) < 0.1, torch.rand(s_shape[:-1]) + 0.5
        valid = None if v_shape is None else torch.rand(v_shape) < 0.8
        x = s.clone().requires_grad_()
        loss = lhmix.FusedZMLCE.apply(x, y, valid)
        (loss * up).sum().backward()
        print(repr((s.double().tolist(), y.tolist(), None if valid is None else valid.tolist(),
                    up.double().tolist(), loss.double().tolist(), x.grad.double().tolist(),
                    tol)))
# 3 documents, 2 depths of 3 labels each: no gold label at both depths, every label gold at both,
# every label gold at the first and none at the second
s, up = torch.randn(3, 2, 6) * 3, torch.rand(3, 2) + 0.5
valid = torch.arange(6) // 3 == torch.arange(2)[:, None]
y = torch.tensor([[0] * 6, [1] * 6, [1, 1, 1, 0, 0, 0]], dtype=torch.bool)[:, None]
x = s.clone().requires_grad_()
loss = lhmix.FusedZMLCE.apply(x, y, valid)
(loss * up).sum().backward()
print(repr((s.double().tolist(), y.tolist(), valid.tolist(), up.double().tolist(),
            loss.double().tolist(), x.grad.double().tolist(), 1e-6)))
"""


@pytest.fixture(scope='module')
def fused_on_cpu():
    """The Triton kernel itself (FusedZMLCE), run on the CPU by Triton's interpreter in a child
    process (TRITON_INTERPRET=1 before the kernel is decorated): each case's inputs and outputs."""
    pytest.importorskip('triton', reason='Triton is not installed (pip install triton): the '
                        'fused kernel runs only on a GPU here')
    here = os.path.dirname(os.path.abspath(lhmix.__file__))
    p = subprocess.run([sys.executable, '-c', FUSED_ON_CPU], cwd=here, capture_output=True,
                       text=True, timeout=600, env={**os.environ, 'TRITON_INTERPRET': '1'})
    assert p.returncode == 0, p.stderr[-3000:]
    return [eval(line, {'nan': math.nan, 'inf': math.inf}) for line in p.stdout.splitlines()]


def test_fused_zmlce_kernel_on_a_cpu_by_tritons_interpreter(fused_on_cpu):
    """Against Eqs. 2 and 8 in float64: the loss and the gradient of a non-uniform weighting of
    it, at e^1e4 too."""
    cases = fused_on_cpu[:-1]
    assert len(cases) == 6
    for s, y, valid, up, loss, grad, tol in cases:
        ref, ref_grad = zmlce_refs(s, y, valid)
        np.testing.assert_allclose(loss, ref, rtol=1e-5)
        np.testing.assert_allclose(grad, ref_grad * np.asarray(up)[..., None], atol=tol)


def test_fused_zmlce_kernel_at_depths_with_no_gold_label_or_every_label_gold(fused_on_cpu):
    """Eq. 2's empty sum is 0 (its 1 alone, log 1): a depth with no gold label costs
    log(1 + sum e^s) over its labels, one with every label gold log(1 + sum e^-s); Eq. 8's
    gradient is up * e^s / (1 + sum e^s), -up * e^-s / (1 + sum e^-s), 0 at other depths."""
    s, y, valid, up, loss, grad, tol = fused_on_cpu[-1]
    s, y, grad = np.array(s), np.array(y)[:, 0], np.array(grad)
    assert valid == [[True] * 3 + [False] * 3, [False] * 3 + [True] * 3]
    for b, d in np.ndindex(3, 2):
        at = slice(3 * d, 3 * d + 3)
        assert y[b, at].all() or not y[b, at].any()
        sign = -1.0 if y[b, at].all() else 1.0
        e = np.exp(sign * s[b, d, at])
        assert loss[b][d] == pytest.approx(math.log1p(e.sum()), rel=1e-6)
        want = np.zeros(6)
        want[at] = sign * up[b][d] * e / (1 + e.sum())
        np.testing.assert_allclose(grad[b, d], want, atol=tol)


# Eqs. 3-7: hierarchy similarity, mixing ratio, Mixup of hidden states, mixed loss

def _cos_ratio(u, v, alpha, beta):  # Eqs. 3 and 4 in float64
    s = 0.5 * (u @ v / (np.linalg.norm(u) * np.linalg.norm(v)) + 1)
    return s, -(beta - 0.5) * s ** alpha + beta


def test_hierarchy_similarity_eq3_clamped_to_0_1():
    rng = np.random.default_rng(6)
    a, b = rng.normal(size=(5, 16)), rng.normal(size=(5, 16))
    for other, s in ((b, [_cos_ratio(u, v, 1, 1)[0] for u, v in zip(a, b)]), (a, 1), (-a, 0)):
        got = lhmix.hierarchy_similarity(torch.from_numpy(a), torch.from_numpy(other))
        np.testing.assert_allclose(got.double().numpy(), s, atol=1e-6)  # identical: 1, opposite: 0
    # cos of a vector with its negation rounds to slightly below -1 in float32 for some vectors
    a = torch.randn(4096, 7, generator=torch.Generator().manual_seed(3))
    raw = 0.5 * (F.cosine_similarity(a, -a, dim=-1) + 1)
    assert (raw < 0).any()  # the case being tested occurs
    s = lhmix.hierarchy_similarity(a, -a)
    assert torch.isfinite(lhmix.mixup_ratio(s, 0.3, 0.75)).all()
    np.testing.assert_allclose(s.double().numpy(), np.clip(raw.double().numpy(), 0, 1))


@pytest.mark.parametrize('alpha, beta', [(1.0, 0.75), (0.5, 1.0), (2.0, 0.6)])
def test_mixup_ratio_eq4_and_lhmix_ratios_of_one_way_pairs(tiny, alpha, beta):
    s = torch.tensor([0.0, 1.0, 0.1, 0.37, 0.8], dtype=torch.float64)
    got = lhmix.mixup_ratio(s, alpha, beta).numpy()
    np.testing.assert_allclose(got, [-(beta - 0.5) * x ** alpha + beta for x in s.tolist()],
                               rtol=1e-14)
    assert got[0] == pytest.approx(beta) and got[1] == pytest.approx(0.5)  # unrelated; identical
    # a model's step: each document's lambda from its row of the table and its partner's
    model, _ = tiny
    table = torch.randn(10, 128, generator=torch.Generator().manual_seed(0))
    rows, partner = [3, 1, 4, 1, 5, 9], torch.tensor([1, 2, 3, 3, 0, 4])  # 3: its own partner
    lhmix.use_local_hierarchies(model, table, alpha, beta)
    b = lhmix.make_batch(model, [np.array([5, 6])] * 6, [[0]] * 6)
    lam = model(**b, partner=partner, hierarchy_ids=torch.tensor(rows))[1]
    t = table.double().numpy()
    expected = [_cos_ratio(t[rows[b]], t[rows[partner[b]]], alpha, beta)[1] for b in range(6)]
    np.testing.assert_allclose(lam, expected, atol=1e-6)
    assert lam[3] == pytest.approx(0.5)


def test_vanilla_mixup_ratio_folds_a_beta_draw_per_document():
    """Table 3's + Mixup: each document's ratio is numpy's Beta(a, a) draw, folded by hand to
    max(lambda, 1 - lambda), in float32, from the generator's stream as it stands."""
    for a in (1.0, 0.4):
        rng = np.random.default_rng(11)
        rng.random(3)  # a stream already in use
        got = lhmix.vanilla_mixup_ratio(rng, a, 500)
        draws = np.random.default_rng(11)
        draws.random(3)
        want = [x if x >= 0.5 else 1 - x for x in draws.beta(a, a, 500)]
        assert got.dtype == torch.float32 and got.shape == (500,)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-7)
        assert 0.5 <= got.min() and got.max() <= 1 and rng.random() == draws.random()


def test_mix_hidden_eq5():
    g = torch.Generator().manual_seed(7)
    h_i, h_j = torch.randn(3, 2, 4, generator=g), torch.randn(3, 2, 4, generator=g)
    lam = torch.tensor([0.5, 0.75, 1.0])
    a, b, l = h_i.double().numpy(), h_j.double().numpy(), lam.double().numpy()[:, None, None]
    np.testing.assert_allclose(lhmix.mix_hidden(h_i, h_j, lam), l * a + (1 - l) * b, atol=1e-6)


# The hierarchy (Sec. 3); the prompt template, verbalizer (Eq. 1), model and batches (Sec. 3.2)

def test_hierarchy_from_a_parent_map():
    parents = {'CS': 'Root', 'Medical': 'Root', 'ML': 'CS', 'DB': 'CS', 'Cancer': 'Medical',
               'Deep_Learning': 'ML'}
    h = lhmix.Hierarchy(parents, {'ML': 'machine learning'})
    assert h.labels == ['CS', 'Medical', 'ML', 'DB', 'Cancer', 'Deep_Learning']
    assert h.depth == [1, 1, 2, 2, 2, 3] and h.num_depths == 3
    assert h.by_depth == [[0, 1], [2, 3, 4], [5]] and h.path(5) == [0, 2, 5]
    assert h.names == ['CS', 'Medical', 'machine learning', 'DB', 'Cancer', 'Deep Learning']
    assert h.closure([5]) == [0, 2, 5] and h.closure([5, 4]) == [0, 1, 2, 4, 5]
    assert h.closure([]) == [] and h.closure(iter([3, 3])) == [0, 3]
    assert h.closure(np.array([5, 4])) == [0, 1, 2, 4, 5]  # numpy's integers are ids too
    h = lhmix.Hierarchy({'a': None, 'b': 'Root', 'a/c_d': 'a', 'a/c_d/e': 'a/c_d'})
    assert h.parent == [-1, -1, 0, 2] and h.depth == [1, 1, 2, 3]
    assert h.names == ['a', 'b', 'c d', 'e'] and len(h) == 4 and h.index['a/c_d'] == 2


def test_a_broken_tree_or_label_id_names_the_label_and_where_it_was_read():
    assert error(lambda: lhmix.Hierarchy({'a': 'zz'})) == \
        "label 'a': parent 'zz' of 'a' refers to nothing"
    lines = {'A': 'f.taxonomy:1', 'B': 'f.taxonomy:2', 'C': 'f.taxonomy:3'}
    assert error(lambda: lhmix.Hierarchy({'A': None, 'B': 'C', 'C': 'B'}, None, lines)) == \
        "f.taxonomy:2: cycle through label 'B'"
    h = lhmix.Hierarchy({'A': None, 'B': 'A'})
    for v in (-1, 2):  # -1 would add nothing, 2 would fail on a list index
        assert error(lambda: h.closure([1, v])) == (
            f"label id {v}: give ids 0 to 1")


@pytest.fixture(scope='module')
def tiny():
    torch.manual_seed(0)
    return tiny_model(lhmix.Hierarchy(PARENTS))


def test_template_embeddings_batch_layout_and_mlm_masks_only_text(tiny):
    assert lhmix.template(3, 101, 102, [7, 8, 9], 5) == [101, 7, 5, 8, 5, 9, 5, 102]
    model, tok = tiny
    V, cls, sep, mask, base = 6, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id, len(tok)
    d1, d2, d3, slot = base + V, base + V + 1, base + V + 2, base + V + 3
    assert model.prefix == [cls, d1, slot, d2, slot, d3, slot, sep]  # depth d's [P] at 2d
    hidden = torch.arange(20.0).reshape(2, 10, 1)  # depth d's [P] at 2d from the start
    assert model.slots(hidden, torch.tensor([10, 0])).flatten().tolist() == [12, 14, 16, 2, 4, 6]
    emb = model.mlm.get_input_embeddings().weight.detach()
    assert emb.shape[0] == base + V + 3 + 1
    for v, name in enumerate(['sci', 'art', 'quantum physics', 'biology', 'jazz music', 'optics']):
        pieces = tok.convert_tokens_to_ids(name.split())
        assert tok.unk_token_id not in pieces
        torch.testing.assert_close(emb[base + v], emb[pieces].mean(0))  # mean of its name
    torch.testing.assert_close(emb[slot], emb[mask])  # [P] starts as [MASK]
    docs, labels = [np.array([5, 6, 7]), np.array([8]), np.array([9, 10])], [[0, 2], [1], [3]]
    b = lhmix.make_batch(model, docs, labels)  # [3], a leaf alone, gains its parent 0
    p, sep, pad = model.prefix, model.special['sep'], model.special['pad']
    rows, T = [p + [5, 6, 7, sep], p + [8, sep], p + [9, 10, sep]], 16  # 12 tokens -> 16
    assert b['input_ids'].tolist() == [r + [pad] * (T - len(r)) for r in rows]
    assert b['attention_mask'].tolist() == [[1] * len(r) + [0] * (T - len(r)) for r in rows]
    assert b['starts'].tolist() == [0, 16, 32] and 'position_ids' not in b
    assert b['targets'].tolist() == [[1, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0], [1, 0, 0, 1, 0, 0]]
    long = lhmix.make_batch(model, [np.arange(5, 13)], [[0]])  # 8 + 8 + 1 = 17 tokens
    assert long['input_ids'].shape == (1, 24)  # on the CPU a multiple of 8 (on a GPU, 16: 32)
    # MLM: masks drawn in the texts only
    rng = np.random.default_rng(0)
    texts = [rng.integers(5, len(tok), n) for n in [150] + list(rng.integers(1, 12, 60))]
    labels = [[0]] * len(texts)
    plain = lhmix.make_batch(model, texts, labels)['input_ids'].reshape(-1)
    b = lhmix.make_batch(model, texts, labels, np.random.default_rng(1), mlm_rate=0.15)
    ids, pos, P = b['input_ids'].reshape(-1), b['mlm_pos'], len(model.prefix)
    col, row = pos % b['input_ids'].shape[1], pos // b['input_ids'].shape[1]
    assert ((col >= P) & (col < P + torch.tensor([len(t) for t in texts])[row])).all()  # text only
    assert torch.equal(b['mlm_labels'], plain[pos])  # labels: the original ids
    others = torch.ones(ids.numel(), dtype=torch.bool).index_fill(0, pos, False)
    assert torch.equal(ids[others], plain[others])  # nothing else touched
    assert 0.10 < len(pos) / sum(len(t) for t in texts) < 0.20
    assert 0.6 < (ids[pos] == model.special['mask']).float().mean() < 0.95  # most of them [MASK]
    docs = [np.arange(5, 5 + k) for k in (9, 14, 30)]
    # MLM on but so rare that nothing is drawn, as in a short last batch: no MLM term, finite
    c = lhmix.make_batch(model, docs[:2], [[0], [1]], np.random.default_rng(0), 1e-12)
    assert 'mlm_pos' not in c and torch.isfinite(model(**c)[0])


def test_a_text_cut_to_max_length_keeps_its_first_word_pieces(tiny):
    """At max_length 12 the 3-depth template takes 8 tokens and the closing [SEP] one: a text of
    5 word-pieces (words of the tiny vocabulary) keeps its first 3 and counts as cut; one of 3
    keeps all and does not."""
    model, tok = tiny
    tokens, cut = lhmix.tokenize(tok, ['light waves bend in glass', 'cells divide and'],
                                 model.text_budget(12))
    kept = [tok.convert_tokens_to_ids(t.split()) for t in ('light waves bend', 'cells divide and')]
    assert [t.tolist() for t in tokens] == kept and cut == 1
    b = lhmix.make_batch(model, tokens, [[0], [1]])
    assert b['attention_mask'].sum(1).tolist() == [12, 12]  # max_length tokens, then padding
    assert b['input_ids'][:, 8:12].tolist() == [k + [tok.sep_token_id] for k in kept]


def test_forward_and_predict_follow_eqs_1_5_6_7():
    model, tok = tiny_model(lhmix.Hierarchy(PARENTS))
    model.eval()  # no dropout: the hand computation below sees the same hidden states
    toks, _ = lhmix.tokenize(tok, TEXTS, 50)
    b = lhmix.make_batch(model, toks, [[0, 2, 5], [0, 3], [1, 4]])
    feed = {k: b[k] for k in ('input_ids', 'attention_mask', 'starts')}
    perm, lam = torch.tensor([2, 0, 0]), torch.tensor([0.9, 0.6, 0.5])  # 0 mixes with itself
    l, y = lam.double().numpy()[:, None], b['targets'][:, None].numpy()
    with torch.no_grad():
        model.label_bias.copy_(torch.linspace(-0.3, 0.3, 6))
        hidden = model.encode(b['input_ids'], b['attention_mask'])
        h = hidden[:, [2, 4, 6]]  # the three [P] slots
        E = model.mlm.get_input_embeddings().weight[len(tok):len(tok) + 6]

        def scores(x):  # Eq. 1: MLM head transform, dotted with label embeddings, plus bias
            return model.mlm.cls.predictions.transform(x) @ E.t() + model.label_bias
        valid = np.array([[d == k + 1 for d in DEPTHS] for k in range(3)])
        plain = zmlce_refs(scores(h), y, valid)[0].sum(1).mean()
        mixed = scores(lam[:, None, None] * h + (1 - lam[:, None, None]) * h[perm])  # Eqs. 5-6
        L_i, L_j = zmlce_refs(mixed, y, valid)[0], zmlce_refs(mixed, y[perm.numpy()], valid)[0]
        assert model(**b) == (pytest.approx(plain, rel=1e-5), None)
        eq7 = (l * L_i + (1 - l) * L_j).sum(1).mean()
        assert model(**b, partner=perm, lam=lam)[0].item() == pytest.approx(eq7, rel=1e-5)
        # prediction: at depth d, the labels of depth d whose score is > 0
        s = scores(h).numpy()
        expected = np.array([[s[n, DEPTHS[v] - 1, v] for v in range(6)] for n in range(3)])
        got = model.label_scores(**feed)  # each label's score is its own depth's
        np.testing.assert_allclose(got.numpy(), expected, atol=1e-5)
        # score_documents: the same scores in input order, whatever the length order
        scored = lhmix.score_documents(model, [toks[2], toks[0], toks[1]], batch_size=2)
        assert type(scored) is np.ndarray and scored.dtype == np.float32
        np.testing.assert_allclose(scored, expected[[2, 0, 1]], atol=1e-5)


def test_the_api_is_all_and_the_docstring_lists_it_in_order():
    """__all__ is the docstring's list, in its order (the paper's), with the parentheses read out;
    it holds every public name that lhmix defines, each with a docstring (ARCHS, a dict: a
    comment), and `from lhmix import *` brings it and nothing else."""
    listing = lhmix.__doc__.split('in order:')[1]
    while '(' in listing:
        listing = re.sub(r'\([^()]*\)', '', listing)
    listed = [n.strip() for n in re.split(r'[;,.]', listing) if n.strip()]
    assert listed == lhmix.__all__ and len(listed) == 27
    defined = {n for n, v in vars(lhmix).items() if not n.startswith('_')
               and getattr(v, '__module__', None) == 'lhmix'}
    assert defined | {'ARCHS', 'FAMILIES'} == set(lhmix.__all__)
    for name in lhmix.__all__:
        assert name == 'ARCHS' or getattr(lhmix, name).__doc__, name
    names = {}
    exec('from lhmix import *', names)
    assert set(names) - {'__builtins__'} == set(lhmix.__all__)


def test_scoring_leaves_the_model_in_its_mode_so_the_next_step_uses_dropout():
    """A training loop scores dev documents between steps: after a step and score_documents,
    the model is still training, so the next step's loss is the one with dropout (the same
    dropout masks, drawn after the same seed), not the clean one; a model in eval mode stays."""
    torch.manual_seed(0)
    model, tok = tiny_model(lhmix.Hierarchy(PARENTS))
    toks, _ = lhmix.tokenize(tok, TEXTS, 50)
    b = lhmix.make_batch(model, toks, [[0, 2], [0, 3], [1, 4]])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    model(**b)[0].backward()
    opt.step()
    with torch.no_grad():
        model.eval()
        clean = model(**b)[0].item()
        model.train()
        torch.manual_seed(1)
        dropped = model(**b)[0].item()
        lhmix.score_documents(model, toks)
        assert model.training
        torch.manual_seed(1)
        assert model(**b)[0].item() == dropped and abs(dropped - clean) > 1e-3
        model.eval()
        lhmix.score_documents(model, toks)
        assert not model.training


def test_mlm_term_is_the_cross_entropy_of_the_mlm_head_at_the_masked_positions(tiny):
    """HPT's auxiliary loss by hand: the head (transform, then the decoder tied to the input
    embeddings) at each masked position, cross-entropy against the original word-piece in
    float64, averaged over the masked positions, added to Eq. 2's loss."""
    model, tok = tiny
    model.eval()
    toks, _ = lhmix.tokenize(tok, TEXTS * 4, 50)
    b = lhmix.make_batch(model, toks, [[0, 2, 5], [0, 3], [1, 4]] * 4,
                         np.random.default_rng(5), mlm_rate=0.3)
    pos, gold = b['mlm_pos'], b['mlm_labels']
    assert len(pos) > 5 and (gold >= 0).all()
    with torch.no_grad():
        hidden = model.encode(b['input_ids'], b['attention_mask'])
        h = hidden[:, [2, 4, 6]]
        E = model.mlm.get_input_embeddings().weight
        scores = model.mlm.cls.predictions.transform(h) @ E[len(tok):len(tok) + 6].t() \
            + model.label_bias
        valid = np.array([[d == k + 1 for d in DEPTHS] for k in range(3)])
        eq2 = zmlce_refs(scores, b['targets'][:, None].numpy(), valid)[0].sum(1).mean()
        at = model.mlm.cls.predictions.transform(hidden.flatten(0, 1)[pos]).double()
        logits = (at @ E.double().t() + model.mlm.get_output_embeddings().bias.double()).numpy()
        lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
        ce = (lse - logits[np.arange(len(pos)), gold.numpy()]).mean()
        loss, lam = model(**b)
    assert lam is None and loss.item() == pytest.approx(eq2 + ce, rel=1e-5)
    assert ce > 1  # a real term: an untrained head is far from the masked word-pieces


def test_mlm_masking_selects_15_percent_of_text_then_80_10_10():
    """Over about 15,000 masked positions (a 1,000-word vocabulary: a random replacement is the
    original word with probability ~1/995, counted exactly below): 15% of the text chosen, of
    them 80% [MASK], 10% another word-piece of the batch's texts, 10% kept; 5 binomial sds."""
    torch.manual_seed(0)
    mlm = BertForMaskedLM(BertConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64))
    model = lhmix.LHMix(mlm, lhmix.Hierarchy(PARENTS), 1000,
                        {'pad': 0, 'cls': 2, 'sep': 3, 'mask': 4})
    rng = np.random.default_rng(0)
    texts = [rng.integers(5, 1000, 200) for _ in range(500)]
    b = lhmix.make_batch(model, texts, [[0]] * 500, np.random.default_rng(1), mlm_rate=0.15)
    ids, pos, gold = b['input_ids'].view(-1), b['mlm_pos'], b['mlm_labels']
    n, words = len(pos), np.concatenate(texts)
    counts = np.bincount(words, minlength=1000) / len(words)
    masked = (ids[pos] == 4).sum().item()
    kept = (ids[pos] == gold).sum().item()
    other = n - masked - kept
    p_same = counts[gold.numpy()].mean()  # a replacement drawn equal to the original
    for got, p, total in ((n, 0.15, len(words)), (masked, 0.8, n),
                          (kept, 0.1 + 0.1 * p_same, n), (other, 0.1 * (1 - p_same), n)):
        assert abs(got - p * total) < 5 * math.sqrt(total * p * (1 - p)), (got, p, total)
    replaced = set(ids[pos][(ids[pos] != 4) & (ids[pos] != gold)].tolist())
    # drawn from all the texts: not from the first text's 200 word-pieces alone
    assert replaced <= set(words.tolist()) and not replaced <= set(texts[0].tolist())


@pytest.mark.parametrize('device, bf16, want', [('cpu', True, None), ('cuda', True, torch.bfloat16),
                                               ('cuda', False, torch.float16)])
def test_autocast_bf16_on_gpus_that_have_it_else_fp16_none_on_the_cpu(monkeypatch, device, bf16,
                                                                      want):
    """The precision inside lhmix.autocast, as torch reports it, on a GPU with or without bf16
    (what torch.cuda reports patched) and on the CPU, whatever the GPU."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *a, **k: bf16)
    with lhmix.autocast(torch.device(device)):
        got = {d: torch.get_autocast_dtype(d) if torch.is_autocast_enabled(d) else None
               for d in ('cpu', 'cuda')}
    assert got == {'cpu': None, 'cuda': None, device: want}


# Local hierarchies (Sec. 4.1): the sequences and the cached [CLS] table

def test_local_hierarchy_ids_and_table_equal_live_frozen_encoder(tiny):
    model, tok = tiny
    ids = lhmix.local_hierarchy_ids(model, [0, 1, 2], model.name_ids(tok))
    w, (d1, d2, d3) = tok.convert_tokens_to_ids, model.depth_ids
    assert ids == [tok.cls_token_id, d1, w('sci'), w('art'), d2, w('quantum'), w('physics'), d3,
                   tok.sep_token_id]
    flat, _ = tiny_model(lhmix.Hierarchy(PARENTS), 'bert')  # no depth tokens: names alone
    assert lhmix.local_hierarchy_ids(flat, [0, 1, 2], flat.name_ids(tok)) == [
        tok.cls_token_id, w('sci'), w('art'), w('quantum'), w('physics'), tok.sep_token_id]
    sets = [[0, 2], [1], [2, 0], [0, 2, 5], [1, 4], [5]]  # [5], a leaf alone: closed upward
    lhmix.local_hierarchy_table(model.eval(), tok, sets)
    assert not model.training  # mode restored
    model.train()  # dropout on: the table must still come from the eval-mode encoder
    table, index = lhmix.local_hierarchy_table(model, tok, sets, batch_size=2)  # chunks of 2
    assert model.training and table.dtype == torch.float32 and index.dtype == torch.int64
    assert table.device == next(model.parameters()).device and index.device.type == 'cpu'
    assert len(table) == 4 and index[0] == index[2] and index[5] == index[3]
    assert len(set(index.tolist())) == 4
    model.eval()
    # Sec. 4.1's sequences by hand: [CLS] [D1] <depth-1 names> [D2] <depth-2 names> [D3] ... [SEP]
    # (labels: 0 Sci, 1 Art, 2 quantum_physics, 4 jazz_music, 5 optics; depth tokens follow the
    # base vocabulary and the 6 label tokens), encoded straight by the masked LM's encoder
    by_hand = ['D1 sci D2 quantum physics D3', 'D1 art D2 D3', 'D1 sci D2 quantum physics D3',
               'D1 sci D2 quantum physics D3 optics', 'D1 art D2 jazz music D3']
    depth_token = {'D1': len(tok) + 6, 'D2': len(tok) + 7, 'D3': len(tok) + 8}
    live = []
    with torch.no_grad():
        for n, words in enumerate(by_hand):
            ids = torch.tensor([[depth_token.get(w) or tok.convert_tokens_to_ids(w)
                                 for w in ['[CLS]', *words.split(), '[SEP]']]])
            assert tok.unk_token_id not in ids
            out = model.mlm.base_model(input_ids=ids, attention_mask=torch.ones_like(ids))
            live.append(out.last_hidden_state[0, 0].double().numpy())
            np.testing.assert_allclose(table[index[n]].double().numpy(), live[n], atol=1e-4)
    s = lhmix.hierarchy_similarity(table[index[0]], table[index[3]]).item()
    assert s == pytest.approx(_cos_ratio(live[0], live[3], 1, 1)[0], abs=1e-5)


# Table 3's flat BERT (HGCLR's baseline), not LH-Mix: a linear layer on [CLS], BCE

def bce(scores, y):  # -y log sigmoid(s) - (1 - y) log(1 - sigmoid(s)), mean over labels
    s = np.asarray(scores, np.float64)
    return (np.logaddexp(0, -s) * y + np.logaddexp(0, s) * (1 - y)).mean(-1)


def test_flat_bert_scores_by_a_linear_layer_on_dropout_of_cls_and_trains_by_bce():
    """By hand in float64: every label's score is W dropout(h_[CLS]) + b, the mask 0 or
    1 / (1 - p) (redrawn from the same seed); the loss is BCE's mean over the labels, and with
    Mixup Eq. 7 of BCE on the mixed [CLS] states; a label is predicted where its score is > 0."""
    assert lhmix.ARCHS == {'prompt': lhmix.LHMix, 'bert': lhmix.FlatBERT}
    torch.manual_seed(0)
    model, tok = tiny_model(lhmix.Hierarchy(PARENTS), 'bert')
    assert type(model) is lhmix.FlatBERT and model.arch == 'bert' and not model.mlm_term
    assert not isinstance(model, lhmix.LHMix) and lhmix.LHMix.mlm_term
    assert model.prefix == [tok.cls_token_id] and not hasattr(model, 'label_bias')
    # no prompt: no label, depth or slot token in the vocabulary
    assert model.mlm.get_input_embeddings().num_embeddings == len(tok) and not model.depth_ids
    p = model.mlm.config.hidden_dropout_prob
    W, bias = (x.detach().double().numpy() for x in (model.classifier.weight,
                                                     model.classifier.bias))
    h = torch.randn(4, 1, 128)
    torch.manual_seed(1)
    got = model.train().score(h)
    torch.manual_seed(1)  # the mask that dropout draws for a tensor of h's shape
    kept = (F.dropout(torch.ones_like(h), p) != 0).numpy()
    assert p > 0 and 0 < kept.mean() < 1
    np.testing.assert_allclose(got.detach(), (h.numpy() * kept / (1 - p)) @ W.T + bias,
                               atol=1e-5)
    np.testing.assert_allclose(model.eval().score(h).detach(), h.numpy() @ W.T + bias, atol=1e-5)
    toks, _ = lhmix.tokenize(tok, TEXTS, 50)
    b = lhmix.make_batch(model, toks, [[0, 2, 5], [0, 3], [1, 4]])
    perm, lam = torch.tensor([2, 0, 0]), torch.tensor([0.9, 0.6, 0.5])
    l, t = lam.double().numpy(), b['targets'].double().numpy()
    with torch.no_grad():
        cls = model.mlm.base_model(b['input_ids'], b['attention_mask']).last_hidden_state[:, 0]
        cls = cls.double().numpy()
        s = cls @ W.T + bias
        mixed = (l[:, None] * cls + (1 - l[:, None]) * cls[perm]) @ W.T + bias  # Eq. 5
        assert model(**b)[0].item() == pytest.approx(bce(s, t).mean(), rel=1e-6)
        eq7 = (l * bce(mixed, t) + (1 - l) * bce(mixed, t[perm])).mean()
        assert model(**b, partner=perm, lam=lam)[0].item() == pytest.approx(eq7, rel=1e-6)
        scores = lhmix.score_documents(model, toks)
    np.testing.assert_allclose(scores, s, atol=1e-5)
    assert np.array_equal(scores > 0, s > 0) and (s > 0).any() and not (s > 0).all()


def test_flat_bert_head_starts_as_hgclr_initialises_it_and_the_encoder_as_it_was():
    """normal(0, initializer_range = 0.02), zero bias (HGCLR's init_weights), not PyTorch's
    uniform default (sd 1 / sqrt(3 * 128) = 0.051 at hidden 128): 5 sampling sds of the sd. The
    encoder's weights are the masked LM's, untouched."""
    torch.manual_seed(0)
    model, tok = tiny_model(lhmix.Hierarchy(PARENTS), 'bert')
    torch.manual_seed(0)  # tiny_model's masked LM again, from the same seed
    again = BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=128, num_hidden_layers=2,
                                       num_attention_heads=2, intermediate_size=256))
    for (k, v), (k2, w) in zip(model.mlm.state_dict().items(), again.state_dict().items()):
        assert k == k2 and torch.equal(v, w), k
    w, n = model.classifier.weight.detach().double(), model.classifier.weight.numel()
    assert model.mlm.config.initializer_range == 0.02 and n == 6 * 128
    assert abs(w.std().item() - 0.02) < 5 * 0.02 / math.sqrt(2 * n)
    assert abs(w.mean().item()) < 5 * 0.02 / math.sqrt(n)
    assert torch.equal(model.classifier.bias, torch.zeros(6))


# The masked LMs of lhmix.FAMILIES, each a tiny one with a tokenizer of its kind (tiny_family)

# The texts that the families' tokenizers are trained on: TEXTS and the label names in a text, so
# that 'Art', 'biology' and 'optics' are one token each in every family's vocabulary (byte-level
# BPE's 'Ġname' mid-text), a label at each depth.
FAMILY_TEXTS = TEXTS + ['Sci Art quantum physics biology jazz music optics']
ROBERTAS = ('roberta', 'xlm-roberta', 'camembert')  # <s> ... </s>, positions from <pad> + 1
# lhmix._family's refusal of a masked LM of another kind, by its model_type
OTHER_KIND = ("a {!r} model: LH-Mix takes a masked LM of bert, roberta, xlm-roberta, camembert, "
              'deberta-v2, modernbert, distilbert (DeBERTa with its legacy head, the default)')


def family_model(kind, arch='prompt'):
    """build_model on tiny_family(kind) and PARENTS, in eval mode, with TEXTS' word-pieces."""
    mlm, tok = tiny_family(kind, FAMILY_TEXTS)
    torch.manual_seed(0)
    model = lhmix.build_model(mlm, tok, lhmix.Hierarchy(PARENTS), arch).eval()
    return model, tok, lhmix.tokenize(tok, TEXTS, 50)[0]


@pytest.mark.parametrize('kind', KINDS)
def test_each_familys_prompt_is_in_its_own_special_tokens_and_positions(kind):
    """By hand: `cls [D1] [P] [D2] [P] [D3] [P] sep` in the family's own ids (<s> 0, </s> 2 in
    RoBERTa's, XLM-R's and CamemBERT's vocabularies here; [CLS] 2, [SEP] 3 in the others'), the
    depth tokens and the slot after the base vocabulary and the 6 label tokens. Positions count
    from 2 in RoBERTa's (its <pad> 1, + 1), from 0 in the others': given explicitly from
    first_position, as in a packed row (speed.py), they are the encoder's own."""
    model, tok, docs = family_model(kind)
    assert model.mlm.config.model_type == kind
    cls, sep = (0, 2) if kind in ROBERTAS else (2, 3)
    assert tok.convert_ids_to_tokens([cls, sep]) == (
        ['<s>', '</s>'] if kind in ROBERTAS else ['[CLS]', '[SEP]'])
    d1, d2, d3, slot = (len(tok) + 6 + i for i in range(4))
    assert model.prefix == [cls, d1, slot, d2, slot, d3, slot, sep]
    assert model.first_position == (2 if kind in ROBERTAS else 0)
    b = lhmix.make_batch(model, docs, [[0]] * 3)
    mask = b['attention_mask'].bool()
    T = mask.shape[1]
    with torch.no_grad():
        alone = model.encode(b['input_ids'], b['attention_mask'])
        given = model.encode(b['input_ids'], b['attention_mask'], position_ids=torch.arange(
            model.first_position, model.first_position + T).expand(3, T))
    torch.testing.assert_close(given[mask], alone[mask])


@pytest.mark.parametrize('kind', KINDS)
def test_a_label_scores_what_its_familys_mlm_head_gives_its_name_less_the_decoder_bias(kind):
    """At initialisation, a label whose name is one token t ('Art', 'biology', 'optics': depths
    1, 2, 3) scores, at its depth's slot (2d), the family's own MLM head's logit of t there
    (mlm(...).logits, the whole masked LM on the same input) less the head's decoder bias of t:
    the label's row is t's input embedding, to which the decoder's weight is tied, and its label
    bias starts at 0, where the decoder's bias is its own (made random here). t is the name's
    word-piece as in a text, after a space (byte-level BPE's 'Ġname'). And the MLM term is the
    cross-entropy of the same logits at the masked positions, against the original ids."""
    model, tok, docs = family_model(kind)
    bias = model.mlm.get_output_embeddings().bias
    with torch.no_grad():
        bias.normal_()
    b = lhmix.make_batch(model, docs, [[0, 2, 5], [0, 3], [1, 4]])
    with torch.no_grad():
        logits = model.mlm(input_ids=b['input_ids'], attention_mask=b['attention_mask']).logits
    scores = lhmix.score_documents(model, docs)
    space = {'wordpiece': '', 'bpe': 'Ġ', 'unigram': '▁'}[KINDS[kind][0]]
    for v, name, slot in ((1, 'Art', 2), (3, 'biology', 4), (5, 'optics', 6)):
        t = tok.convert_tokens_to_ids(space + (name.lower() if space == '' else name))
        assert t != tok.unk_token_id
        want = (logits[:, slot, t] - bias[t]).detach().numpy()
        np.testing.assert_allclose(scores[:, v], want, atol=1e-5)
    m = lhmix.make_batch(model, docs * 4, [[0]] * 12, np.random.default_rng(0), mlm_rate=0.3)
    plain = {k: v for k, v in m.items() if not k.startswith('mlm_')}
    with torch.no_grad():
        logits = model.mlm(input_ids=m['input_ids'], attention_mask=m['attention_mask']).logits
        term = (model(**m)[0] - model(**plain)[0]).item()
    at = logits.flatten(0, 1)[m['mlm_pos']].double()
    ce = (torch.logsumexp(at, 1) - at[torch.arange(len(at)), m['mlm_labels']]).mean().item()
    assert len(m['mlm_pos']) > 5 and term == pytest.approx(ce, rel=1e-5)


@pytest.mark.parametrize('kind', KINDS)
def test_each_familys_flat_bert_scores_a_linear_layer_on_its_first_token(kind):
    """--arch bert: the family's own cls token alone as prompt, every label's score (B, 1, V)
    W h + b of its state (eval mode: no dropout), by hand from the encoder's states."""
    model, tok, docs = family_model(kind, 'bert')
    assert model.prefix == [0 if kind in ROBERTAS else 2]
    b = lhmix.make_batch(model, docs, [[0]] * 3)
    with torch.no_grad():
        h = model.mlm.base_model(b['input_ids'], b['attention_mask']).last_hidden_state[:, :1]
        assert model.score(h).shape == (3, 1, 6)
        want = h[:, 0].double() @ model.classifier.weight.double().t() + model.classifier.bias
    np.testing.assert_allclose(lhmix.score_documents(model, docs), want.numpy(), atol=1e-5)


@pytest.mark.parametrize('kind', KINDS)
def test_each_family_trains_by_lhmix_with_the_mlm_term(kind):
    """10 steps of Adam (lr 1e-3) on 6 documents, Mixup by LH-Mix's ratios (Eqs. 3-7) and the
    MLM term at 15%: finite losses, and the loss of the same documents without Mixup or
    masking (eval mode) falls by 0.05 or more (0.14 to 0.37 with torch 2.13 on a CPU)."""
    model, tok, docs = family_model(kind)
    docs, labels = docs * 2, [[0, 2, 5], [0, 3], [1, 4]] * 2
    table, rows = lhmix.local_hierarchy_table(model, tok, labels)
    lhmix.use_local_hierarchies(model, table, 1.0, 0.75)
    fixed = lhmix.make_batch(model, docs, labels)

    def loss():
        with torch.no_grad():
            return model.eval()(**fixed)[0].item()
    before, rng = loss(), np.random.default_rng(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(10):
        b = lhmix.make_batch(model, docs, labels, rng, 0.15, rng.permutation(6), rows)
        step = model(**b)[0]
        assert 'mlm_pos' in b and torch.isfinite(step)
        opt.zero_grad()
        step.backward()
        opt.step()
    assert loss() < before - 0.05


# The masked LM that a run starts from: tiny_bert, or a folder or hub id (load_pretrained)

def test_tiny_bert_vocabulary_is_the_words_its_tokenizer_sees():
    """The words of texts and label names as BERT's uncased normalizer leaves them: lower-cased,
    accents stripped, a CJK character a word; most frequent first, ties in order of appearance."""
    texts = ['La lumière, la RÉFRACTION!', 'réfraction 日本']
    mlm, tok = lhmix.tiny_bert(texts + ['Économie', 'Mathématiques'])  # two label names
    words = ['la', 'refraction', 'lumiere', ',', '!', '日', '本', 'economie', 'mathematiques']
    assert tok.convert_ids_to_tokens(list(range(len(tok)))) == [
        '[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + words
    assert mlm.config.vocab_size == 5 + 9
    assert tok.convert_ids_to_tokens(tok('Lumière ÉCONOMIE réfraction mathématiques 日本')[
        'input_ids']) == ['[CLS]', 'lumiere', 'economie', 'refraction', 'mathematiques', '日', '本',
                          '[SEP]']


def test_a_pretrained_model_must_bring_its_config_tokenizer_and_encoder(tmp_path, capsys):
    """A BERT without its MLM head (as all-MiniLM-L6-v2) loads, with one warning; an LH-Mix
    checkpoint (its weights under mlm.) has none of a masked LM's 37 encoder weights (5 of the
    embeddings, 16 a layer); a folder without config.json or a tokenizer is named."""
    mlm, tok = lhmix.tiny_bert(TEXTS)
    for x in (mlm.base_model, tok):  # an encoder without the MLM head, as all-MiniLM-L6-v2
        x.save_pretrained(tmp_path / 'encoder')
    from transformers.utils import logging
    assert logging.is_progress_bar_enabled() and capsys.readouterr()  # save_pretrained's bars
    lhmix.load_pretrained(str(tmp_path / 'encoder'))
    # No 'Loading weights' bar among a run's lines, and the bars are on again for the caller.
    assert capsys.readouterr().err == (
        f"warning: model '{tmp_path / 'encoder'}' has no MLM-head weights: the head starts "
        'random\n') and logging.is_progress_bar_enabled()
    ck = tmp_path / 'ck'  # an LH-Mix checkpoint's folder: its model's weights, under mlm.
    model, tok = tiny_model(lhmix.Hierarchy(PARENTS))
    tok.save_pretrained(ck)
    model.mlm.config.save_pretrained(ck)
    save_file({k: v.clone() for k, v in model.state_dict().items()}, ck / 'model.safetensors',
              {'format': 'pt'})
    msg = error(lambda: lhmix.load_pretrained(str(ck)))
    tail = ('embeddings.LayerNorm.bias, ...): not a pretrained masked LM (to continue a run: '
            'train.py --resume; to score a checkpoint: evaluate.py --ckpt)')
    assert re.fullmatch(re.escape(f"model '{ck}': 37 encoder weights missing (") + r'(bert\.)?'
                        + re.escape(tail), msg), msg  # transformers 4 names them without bert.
    (tmp_path / 'empty').mkdir()  # transformers' own message would be of sentencepiece
    need = ('the folder needs config.json and a tokenizer, sentencepiece.bpe.model or spm.model or '
            'tokenizer.json or vocab.json or vocab.txt')
    assert error(lambda: lhmix.load_pretrained(str(tmp_path / 'empty'))) == \
        f"model '{tmp_path / 'empty'}': {need}"
    for name in ('tokenizer.json', 'vocab.txt'):  # transformers 4 writes both, 5 the first
        (tmp_path / 'encoder' / name).unlink(missing_ok=True)
    assert error(lambda: lhmix.load_pretrained(str(tmp_path / 'encoder'))) == (
        f"model '{tmp_path / 'encoder'}': {need}")


def test_a_roberta_needs_its_encoder_not_its_head_and_another_kind_is_refused_unread(tmp_path,
                                                                                      capsys):
    """A RoBERTa saved without its MLM head loads with the warning, its encoder's weights those
    saved; one without an encoder weight (under its base model's prefix, roberta.) is refused,
    naming it. An ELECTRA folder is refused by its config.json, in the families' one line,
    before its weights (here not weights at all) are read."""
    mlm, tok = tiny_family('roberta', FAMILY_TEXTS)
    for x in (mlm.base_model, tok):
        x.save_pretrained(tmp_path / 'encoder')
    capsys.readouterr()
    loaded, _ = lhmix.load_pretrained(str(tmp_path / 'encoder'))
    assert capsys.readouterr().err == (f"warning: model '{tmp_path / 'encoder'}' has no MLM-head "
                                       'weights: the head starts random\n')
    for k, v in mlm.base_model.state_dict().items():
        assert torch.equal(loaded.base_model.state_dict()[k], v), k
    for x in (mlm, tok):
        x.save_pretrained(tmp_path / 'broken')
    weights = tmp_path / 'broken' / 'model.safetensors'
    gone = 'roberta.encoder.layer.1.output.dense.weight'
    tensors = load_file(weights)
    del tensors[gone]
    save_file(tensors, weights, {'format': 'pt'})
    assert error(lambda: lhmix.load_pretrained(str(tmp_path / 'broken'))) == (
        f"model '{tmp_path / 'broken'}': 1 encoder weights missing ({gone}, ...): not a "
        'pretrained masked LM (to continue a run: train.py --resume; to score a checkpoint: '
        'evaluate.py --ckpt)')
    electra = tmp_path / 'electra'
    transformers.ElectraConfig(vocab_size=len(tok)).save_pretrained(electra)
    tok.save_pretrained(electra)
    (electra / 'model.safetensors').write_bytes(b'not weights')
    assert error(lambda: lhmix.load_pretrained(str(electra))) == OTHER_KIND.format('electra')


# Misuse: one line naming the fix, before anything is computed

def test_a_masked_lm_of_another_kind_is_refused_in_one_line_naming_the_families():
    """An ELECTRA generator, and a DeBERTa-v2 with its newer head (legacy=False, whose
    get_output_embeddings is a dense layer, not the decoder), in either arch: refused as the
    model is built, in one line, before its embeddings grow."""
    tok = tiny_family('bert', FAMILY_TEXTS)[1]
    sizes = dict(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=32)
    for kind, mlm in (('electra', transformers.ElectraForMaskedLM(transformers.ElectraConfig(
            embedding_size=32, **sizes))), ('deberta-v2', transformers.DebertaV2ForMaskedLM(
                transformers.DebertaV2Config(legacy=False, **sizes)))):
        for arch in lhmix.ARCHS:
            assert error(lambda: lhmix.build_model(mlm, tok, lhmix.Hierarchy(PARENTS), arch)) \
                == OTHER_KIND.format(kind)
            assert mlm.get_input_embeddings().num_embeddings == len(tok)


def test_misuse_ends_in_one_line_naming_the_fix(monkeypatch):
    """Mixing by local hierarchies before the model has them, by no ratio or by two, a ratio
    without a partner, a ratio that is not a tensor or not in [0, 1], a ratio, partner or
    hierarchy id list not one per document, label lists that are not one per text, labels given
    by name, a label id outside the tree, MLM masking without a random generator, a max_length
    that leaves no text word-piece: each refused before the encoder runs, in one line that names
    what to give."""
    model, tok = tiny_model(lhmix.Hierarchy(PARENTS))
    docs = [np.array([5, 6, 7]), np.array([8])]
    b, pair, ids = lhmix.make_batch(model, docs, [[0], [1]]), torch.tensor([1, 0]), torch.arange(2)
    assert 'call lhmix.use_local_hierarchies(model, table, alpha, beta) first' in error(
        lambda: model(**b, partner=pair, hierarchy_ids=ids))
    lhmix.use_local_hierarchies(model, torch.randn(2, 8), 1.0, 0.75)
    for lam in ([0.0, 1.0], [1.0, 0.5]):  # the ends of [0, 1] are ratios
        assert torch.equal(model(**b, partner=pair, lam=torch.tensor(lam))[1], torch.tensor(lam))
    monkeypatch.setattr(model, 'encode', lambda *a, **k: pytest.fail('the encoder ran'))
    one = 'Mixup takes `partner` and either `lam` (vanilla) or `hierarchy_ids`'
    for mixing in ({'partner': pair}, {'partner': pair, 'lam': torch.ones(2), 'hierarchy_ids': ids},
                   {'lam': torch.ones(2)}, {'hierarchy_ids': ids}):
        assert error(lambda: model(**b, **mixing)) == one
    assert error(lambda: model(**b, partner=pair, lam=0.7)) == (
        'lam 0.7 for 2 documents: give a tensor of shape (2,)')
    for lam in ([0.5, 1.5], [-0.25, 0.5], [0.5, math.nan]):
        assert error(lambda: model(**b, partner=pair, lam=torch.tensor(lam))) == (
            f'lam {lam}: give ratios in [0, 1]')
    for name, mixing in (('lam', {'lam': torch.ones(3)}), ('lam', {'lam': torch.ones(2, 1)}),
                         ('partner', {'lam': torch.ones(2)}),
                         ('hierarchy_ids', {'hierarchy_ids': torch.arange(1)})):
        mixing = {'partner': torch.tensor([1, 0, 0] if name == 'partner' else [1, 0]), **mixing}
        shape = tuple(mixing[name].shape)
        assert error(lambda: model(**b, **mixing)) == (
            f'{name} {shape} for 2 documents: give a tensor of shape (2,)')
    assert error(lambda: lhmix.make_batch(model, docs, [['Sci'], [1]]), TypeError) == (
        "label 'Sci': give label ids, not names (hierarchy.index[name])")
    for labels in ([[0]], [[0], [1], [2]]):
        assert error(lambda: lhmix.make_batch(model, docs, labels)) == (
            f'2 texts, {len(labels)} label lists: give one per text')
    for v in (-1, 6):
        outside = f"label id {v}: give ids 0 to 5"
        assert error(lambda: lhmix.make_batch(model, docs, [[0], [2, v]])) == outside
        assert error(lambda: lhmix.local_hierarchy_table(model, tok, [[0], [v]])) == outside
    assert 'rng=numpy.random.default_rng(seed)' in error(
        lambda: lhmix.make_batch(model, docs, [[0], [1]], mlm_rate=0.15))
    # the prompt of 3 depths is 8 tokens, and [SEP] closes the text: 10 leaves it 1 word-piece
    mlm = model.mlm
    assert lhmix.LHMix(mlm, model.hierarchy, len(tok), model.special, 10).text_budget(10) == 1
    for n in (9, 513):
        assert error(lambda: lhmix.LHMix(mlm, model.hierarchy, len(tok), model.special, n)) == (
            f'max_length {n} leaves {n - 9} text tokens (at most 512 positions): give 10 to 512')


def test_labels_whose_names_have_no_word_piece_are_named_in_one_warning_with_the_cause():
    """'___' (underscores read as spaces) and 'ML/' (an empty last part) hold no word; '&' is
    unknown to the vocabulary ([UNK] alone): one warning names each group with its cause and fix,
    and they start as [UNK]; 'rock & roll' has word-pieces, and a tree whose names all have some
    warns not. The flat BERT, which reads the names in local hierarchies, warns too."""
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        tiny_model(lhmix.Hierarchy(PARENTS))

    def warned(causes):
        return ('labels whose names give only [UNK] start alike and are alike in local '
                f'hierarchies: {causes}; rename them (label_names.tsv in the data folder; '
                'Hierarchy(parents, names)) or take a model with their words (--model)')
    empty = 'its name holds no word'
    unknown = "the vocabulary lacks its name's words"
    for parents, named, message in (
            ({'Sci': None, 'ML/': None, 'Sci/___': 'Sci', 'Sci/rock_&_roll': 'Sci'},
             ['ML/', 'Sci/___'], warned({'ML/': empty, 'Sci/___': empty})),
            ({'Sci': None, 'Sci/&': 'Sci', 'Sci/_': 'Sci'}, ['Sci/&', 'Sci/_'],
             warned({'Sci/&': unknown, 'Sci/_': empty}))):
        for arch in ('prompt', 'bert'):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter('always')
                model, tok = tiny_model(lhmix.Hierarchy(parents), arch)
            assert [str(w.message) for w in caught if w.filename == lhmix.__file__] == [message]
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')  # the warning just held
            model, tok = tiny_model(lhmix.Hierarchy(parents))
        emb = model.mlm.get_input_embeddings().weight
        for v, label in enumerate(parents):  # the label tokens follow the base vocabulary
            unk = torch.equal(emb[len(tok) + v], emb[tok.unk_token_id])
            assert unk == (label in named), label


# Importing lhmix, or building a model, changes nothing outside it

IMPORT = """
import os, transformers, torch
from transformers.masking_utils import AttentionMaskInterface
names = lambda: (set(transformers.AttentionInterface()), set(AttentionMaskInterface()))
before, env = names(), dict(os.environ)
import lhmix
mlm = transformers.BertForMaskedLM(transformers.BertConfig(
    vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
    intermediate_size=8))
attention = mlm.config._attn_implementation
for arch in lhmix.ARCHS.values():
    arch(mlm, lhmix.Hierarchy({'a': None}), 10, {'cls': 2, 'sep': 3, 'pad': 0, 'mask': 4})
assert names() == before and dict(os.environ) == env
assert mlm.config._attn_implementation == attention
"""


def test_import_and_a_model_register_nothing_and_leave_the_environment():
    here = os.path.dirname(os.path.abspath(lhmix.__file__))
    p = subprocess.run([sys.executable, '-c', IMPORT], cwd=here, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]


def test_mlm_random_replacements_draw_every_word_of_a_short_batch():
    """The 10% random replacements draw uniformly from all the batch's text word-pieces, the
    last one included: one text [10, 11, 12], every position chosen (rate 1), 3,000 batches.
    At the first position (gold 10) word w stands with probability 0.1 * [w == 10] (kept)
    + 0.1 / 3 (drawn); 5 binomial sds."""
    rng, n = np.random.default_rng(0), 3000
    seen = np.zeros(13, int)
    for _ in range(n):
        ids = torch.tensor([[2, 10, 11, 12, 3]])
        pos, gold = lhmix.mask_tokens(ids, [1], [np.array([10, 11, 12])], rng, 1.0, 4)
        assert pos.tolist() == [1, 2, 3] and gold.tolist() == [10, 11, 12]
        seen[ids[0, 1].item()] += 1
    for w, p in ((10, 0.1 + 0.1 / 3), (11, 0.1 / 3), (12, 0.1 / 3), (4, 0.8)):
        assert abs(seen[w] - p * n) < 5 * math.sqrt(n * p * (1 - p)), (w, seen[w], p * n)


def test_a_mixup_batch_carries_its_partners_and_ratios_as_given_or_drawn(tiny):
    """make_batch's Mixup fields: the partners and local hierarchies as given (LH-Mix); vanilla
    Mixup's ratios max(x, 1 - x) of Beta(a, a) drawn by the given rng, after the masks (none here),
    by hand with numpy; a draw without rng is refused, naming it."""
    model, _ = tiny
    docs = [np.array([5, 6]), np.array([7])]
    b = lhmix.make_batch(model, docs, [[0], [1]], partner=[1, 0], hierarchy_ids=[3, 4])
    assert b['partner'].tolist() == [1, 0] and b['hierarchy_ids'].tolist() == [3, 4]
    b = lhmix.make_batch(model, docs, [[0], [1]], np.random.default_rng(0), partner=[1, 0],
                         mix_alpha=0.2)
    x = np.random.default_rng(0).beta(0.2, 0.2, 2)
    np.testing.assert_allclose(b['lam'].double().numpy(), np.maximum(x, 1 - x), rtol=1e-6)
    assert 'rng=numpy.random.default_rng(seed)' in error(
        lambda: lhmix.make_batch(model, docs, [[0], [1]], partner=[1, 0], mix_alpha=0.2))
