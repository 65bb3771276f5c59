"""LH-Mix: Local Hierarchy Correlation Guided Mixup over Hierarchical Prompt Tuning.

A single-file reference of Kong, Zhang & Wang (KDD 2025), read top-down in the paper's order:
  1. the label hierarchy and the hierarchical prompt template (Sec. 3)
  2. the model: verbalizer (Eq. 1) and the flat BERT ablation
  3. local hierarchy correlation (Sec. 4.1, Eq. 3)
  4. the mixing ratio (Sec. 4.2, Eq. 4)
  5. Mixup of slot hidden states and loss mixing (Sec. 4.3, Eqs. 5-7)
  6. ZMLCE, the zero-bounded multi-label cross-entropy (Eq. 2), as a fused autograd Function
followed by what train.py and evaluate.py share: data, batching, prediction, F1, checkpoints.
"""
import json
import math
import os
import re
import shutil
import tempfile
import zipfile
from collections import Counter
from xml.etree import ElementTree

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# 1. Hierarchy and template (Sec. 3)


class Hierarchy:
    """A label tree. Labels get ids in the order given; depth 1 is the top level.

    `parents` maps each label to its parent (None or 'Root' for a top-level label);
    `names` gives readable names for the verbalizer (default: the part after the last '/').
    `lines` (optional) maps a label to the source line that defined it, for error messages.
    """

    def __init__(self, parents, names=None, lines=None):
        lines = lines or {}
        self.labels = list(parents)
        self.index = {v: i for i, v in enumerate(self.labels)}
        self.parent = []
        for v in self.labels:
            p = parents[v]
            if p in (None, 'Root'):
                self.parent.append(-1)
            elif p not in self.index:
                raise ValueError(f"{lines.get(v, 'label ' + repr(v))}: parent {p!r} of {v!r} refers to nothing")
            else:
                self.parent.append(self.index[p])
        self.depth = []
        for i, v in enumerate(self.labels):
            d, j = 1, self.parent[i]
            while j >= 0:
                d, j = d + 1, self.parent[j]
                if d > len(self.labels):
                    raise ValueError(f"{lines.get(v, 'label ' + repr(v))}: cycle through label {v!r}")
            self.depth.append(d)
        self.num_depths = max(self.depth)
        self.by_depth = [[i for i, d in enumerate(self.depth) if d == k + 1] for k in range(self.num_depths)]
        names = names or {}
        self.names = [names.get(v, v.rsplit('/', 1)[-1]).replace('_', ' ') for v in self.labels]

    def __len__(self):
        return len(self.labels)

    def closure(self, label_ids):
        """The label set closed upward: every ancestor of a gold label is gold too."""
        out = set()
        for i in label_ids:
            while i >= 0 and i not in out:
                out.add(i)
                i = self.parent[i]
        return sorted(out)

    @classmethod
    def from_taxonomy(cls, path, names=None):
        """HiAGM format: one line per parent, `parent<TAB>child<TAB>child...`, the root is `Root`."""
        parents, lines = {}, {}
        with open(path, encoding='utf-8') as f:
            for n, line in enumerate(f, 1):
                cells = [c.strip() for c in line.rstrip('\n').split('\t') if c.strip()]
                if not cells:
                    continue
                where = f'{path}:{n}'
                if len(cells) < 2:
                    raise ValueError(f'{where}: a taxonomy line needs a parent and at least one child')
                if cells[0] != 'Root' and cells[0] not in parents:
                    # defer: the parent may be declared later; checked below
                    lines.setdefault(cells[0], where)
                for child in cells[1:]:
                    if child in parents:
                        raise ValueError(f'{where}: label {child!r} has two parents '
                                         f'({parents[child]!r} on {lines[child]} and {cells[0]!r})')
                    parents[child], lines[child] = cells[0], where
        for p, where in list(lines.items()):
            if p not in parents:
                raise ValueError(f'{where}: {p!r} is neither Root nor a child of any label (refers to nothing)')
        return cls(parents, names, lines)

    def to_dict(self):
        return {'labels': self.labels, 'names': self.names,
                'parents': [self.labels[p] if p >= 0 else None for p in self.parent]}

    @classmethod
    def from_dict(cls, d):
        return cls(dict(zip(d['labels'], d['parents'])), dict(zip(d['labels'], d['names'])))


def template(num_depths, cls_id, sep_id, depth_ids, slot_id):
    """Sec. 3.2: `[CLS] [D1] [P] [D2] [P] ... [DD] [P] [SEP]`; the text and `[SEP]` follow.
    The hidden state of the slot after [Dd] sits at position 2d."""
    ids = [cls_id]
    for d in range(num_depths):
        ids += [depth_ids[d], slot_id]
    return ids + [sep_id]


# -----------------------------------------------------------------------------
# 2. The model: hierarchical prompt with verbalizer (Eq. 1), or the flat BERT ablation


class LHMix(nn.Module):
    """A masked language model with D depth tokens, a slot token and one token per label
    appended to its vocabulary (ids base_vocab + [labels | depths | slot]).

    arch='prompt': the score of label v at depth d is the MLM head's transform of h^d_[P] dotted
    with v's (tied input/output) embedding plus a bias, over V^d only (Eq. 1).
    arch='bert': the paper's flat ablation, [CLS] -> linear over all labels.
    """

    def __init__(self, mlm, hierarchy, arch, base_vocab, special):
        super().__init__()
        if arch not in ('prompt', 'bert'):
            raise ValueError(f'unknown arch {arch!r} (prompt or bert)')
        self.mlm, self.hierarchy, self.arch, self.base_vocab = mlm, hierarchy, arch, base_vocab
        self.special = special  # cls, sep, pad, mask token ids of the tokenizer
        V, D = len(hierarchy), hierarchy.num_depths
        self.depth_ids = [base_vocab + V + d for d in range(D)]
        self.slot_id = base_vocab + V + D
        if mlm.get_input_embeddings().num_embeddings != base_vocab + V + D + 1:
            resize(mlm, base_vocab + V + D + 1)
        H = mlm.config.hidden_size
        if hasattr(mlm, 'cls'):  # BERT family: dense -> act -> LayerNorm
            self.transform = mlm.cls.predictions.transform
        elif hasattr(mlm, 'lm_head'):  # RoBERTa family
            head = mlm.lm_head
            self.transform = lambda x: head.layer_norm(F.gelu(head.dense(x)))
        else:
            raise ValueError(f'{type(mlm).__name__}: only BERT- and RoBERTa-style MLM heads are supported')
        if arch == 'prompt':
            self.label_bias = nn.Parameter(torch.zeros(V))
            self.prefix = template(D, special['cls'], special['sep'], self.depth_ids, self.slot_id)
            valid = torch.tensor([[hierarchy.depth[v] == d + 1 for v in range(V)] for d in range(D)])
        else:
            self.prefix = [special['cls']]
            self.classifier = nn.Linear(H, V)
            valid = torch.ones(1, V, dtype=torch.bool)
        self.register_buffer('valid', valid, persistent=False)  # (rows, V): labels each row scores

    def init_new_tokens(self, tokenizer):
        """Label tokens start as the mean word-piece embedding of the label's name (Eq. 1);
        depth tokens are random, as the paper says; the slot starts as [MASK] (as the authors' code)."""
        emb = self.mlm.get_input_embeddings().weight
        V, std = len(self.hierarchy), self.mlm.config.initializer_range
        with torch.no_grad():
            for v, ids in enumerate(self.name_ids(tokenizer)):
                emb[self.base_vocab + v] = emb[ids].mean(0)
            for d in self.depth_ids:
                emb[d].normal_(0.0, std)
            emb[self.slot_id] = emb[self.special['mask']]

    def name_ids(self, tokenizer):
        out = []
        for name in self.hierarchy.names:
            ids = tokenizer(name, add_special_tokens=False)['input_ids']
            out.append(ids or [tokenizer.unk_token_id])
        return out

    def text_budget(self, max_length):
        """Word-pieces of text that fit `max_length` next to the prefix and the closing [SEP]."""
        return max_length - len(self.prefix) - 1

    def encode(self, input_ids, attention_mask):
        return self.mlm.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def slots(self, hidden):
        """(B, rows, H): the [P] slot of each depth (positions 2, 4, ..., 2D), or [CLS] for bert."""
        if self.arch == 'prompt':
            return hidden[:, 2:2 * len(self.depth_ids) + 1:2]
        return hidden[:, :1]

    def score(self, slot_hidden):
        """Eq. 1: (B, rows, V) label scores; only `self.valid` entries are meaningful."""
        if self.arch == 'bert':
            return self.classifier(slot_hidden)
        label_emb = self.mlm.get_input_embeddings().weight[self.base_vocab:self.base_vocab + len(self.hierarchy)]
        return self.transform(slot_hidden) @ label_emb.t() + self.label_bias

    def mlm_loss(self, hidden, positions, labels):
        """HPT's auxiliary MLM loss, with the head run only at the masked positions."""
        x = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)
        logits = self.mlm.get_output_embeddings()(self.transform(x))
        return F.cross_entropy(logits.float(), labels)

    def forward(self, input_ids, attention_mask, targets, perm=None, lam=None, mlm_pos=None, mlm_labels=None):
        """Training loss. targets: (B, V) bool. With `perm`/`lam`, Mixup (Sec. 4.3): the slot
        hidden states of each pair are interpolated (Eq. 5), scored by the same verbalizer (Eq. 6)
        and the two losses mixed per pair (Eq. 7). Per-document loss sums the depths; batch mean."""
        hidden = self.encode(input_ids, attention_mask)
        h = self.slots(hidden)
        t = targets[:, None, :]
        if perm is None:
            loss = zmlce(self.score(h), t, self.valid)
        else:
            loss = mixed_zmlce(self.score(mix_hidden(h, h[perm], lam)), t, t[perm], lam, self.valid)
        loss = loss.sum(-1).mean()
        if mlm_pos is not None:
            loss = loss + self.mlm_loss(hidden, mlm_pos, mlm_labels)
        return loss

    @torch.no_grad()
    def predict(self, input_ids, attention_mask):
        """Sec. 3: at depth d, the labels of V^d whose score is > 0. (B, V) bool."""
        scores = self.score(self.slots(self.encode(input_ids, attention_mask)))
        return ((scores > 0) & self.valid).any(1)


def resize(mlm, n):
    try:  # transformers >= 4.46 would otherwise mean-initialise rows we overwrite anyway
        mlm.resize_token_embeddings(n, mean_resizing=False)
    except TypeError:
        mlm.resize_token_embeddings(n)


def build_model(name, hierarchy, arch, texts=None):
    """A fresh LHMix from a pretrained checkpoint (any HF id or local path), or from 'tiny':
    a small randomly initialised BERT with a word-level vocabulary made from `texts`."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer
    if name == 'tiny':
        mlm, tokenizer = tiny_bert(list(texts) + hierarchy.names)
    else:
        try:
            tokenizer = AutoTokenizer.from_pretrained(name)
            mlm = AutoModelForMaskedLM.from_pretrained(name)
        except OSError as e:
            raise ValueError(f'could not load model {name!r}: {e}\n(without internet, pass a local '
                             'folder with --model, or --model tiny)') from None
        mlm.float()  # fp32 master weights even from an fp16 checkpoint; autocast does the rest
    special = {'cls': tokenizer.cls_token_id, 'sep': tokenizer.sep_token_id,
               'pad': tokenizer.pad_token_id, 'mask': tokenizer.mask_token_id}
    model = LHMix(mlm, hierarchy, arch, len(tokenizer), special)
    model.init_new_tokens(tokenizer)
    return model, tokenizer


def tiny_bert(texts, max_words=8000):
    """A 2-layer, 128-wide BERT with a word-level vocabulary written on the fly (no download)."""
    from transformers import AutoModelForMaskedLM, BertConfig, BertTokenizerFast
    counts = Counter(w for t in texts for w in re.findall(r"\w+|[^\w\s]", t.lower()))
    vocab = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + [w for w, _ in counts.most_common(max_words)]
    folder = tempfile.mkdtemp(prefix='lhmix-tiny-')
    with open(os.path.join(folder, 'vocab.txt'), 'w', encoding='utf-8') as f:
        f.write('\n'.join(vocab) + '\n')
    tokenizer = BertTokenizerFast(os.path.join(folder, 'vocab.txt'), do_lower_case=True)  # v4 and v5
    shutil.rmtree(folder)
    config = BertConfig(vocab_size=len(vocab), hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=256, max_position_embeddings=512)
    return AutoModelForMaskedLM.from_config(config), tokenizer  # as load_checkpoint builds it (same attention)


# -----------------------------------------------------------------------------
# 3. Local hierarchy correlation (Sec. 4.1)


def local_hierarchy_ids(model, label_ids, name_ids):
    """Sec. 4.1: the gold labels as a sequence `[CLS] [D1] <names at depth 1> [D2] ... [SEP]`."""
    ids = [model.special['cls']]
    for d, depth_id in enumerate(model.depth_ids):
        ids.append(depth_id)
        for v in label_ids:
            if model.hierarchy.depth[v] == d + 1:
                ids += name_ids[v]
    return ids + [model.special['sep']]


@torch.no_grad()
def local_hierarchy_table(model, tokenizer, label_sets, batch_size=64):
    """[CLS] embeddings of every distinct local hierarchy, by the model as it is now (call it before
    training: the paper's frozen copy of the initial encoder). The encoder is frozen and deterministic,
    so each hierarchy is encoded once and looked up per step. Returns (table (U, H), index (N,)),
    both on the CPU: a step's rows travel with its batch."""
    keys = [tuple(sorted(s)) for s in label_sets]
    distinct = sorted(set(keys))
    row = {k: i for i, k in enumerate(distinct)}
    name_ids = model.name_ids(tokenizer)
    seqs = [local_hierarchy_ids(model, k, name_ids) for k in distinct]
    device, was_training = next(model.parameters()).device, model.training
    model.eval()
    out = []
    for i in range(0, len(seqs), batch_size):
        chunk = seqs[i:i + batch_size]
        ids, mask = pad(chunk, model.special['pad'], 1)
        out.append(model.encode(ids.to(device), mask.to(device))[:, 0].float())
    model.train(was_training)
    return torch.cat(out).cpu(), torch.tensor([row[k] for k in keys])


def hierarchy_similarity(h_i, h_j):
    """Eq. 3: s = 0.5 (cos(h_i, h_j) + 1), in [0, 1]."""
    return 0.5 * (F.cosine_similarity(h_i.float(), h_j.float(), dim=-1) + 1)


# -----------------------------------------------------------------------------
# 4. Mixing ratio (Sec. 4.2)


def mixup_ratio(s, alpha, beta):
    """Eq. 4: lambda = -(beta - 0.5) s^alpha + beta; similar hierarchies mix more (lambda -> 0.5)."""
    return -(beta - 0.5) * s ** alpha + beta


def pair_and_ratio(mix, batch_size, hier=None, alpha=1.0, beta=0.75, mix_alpha=1.0):
    """Partners j = a random permutation of the batch and one lambda per pair: from Eqs. 3-4
    ('lhmix'; `hier` (B, H) holds the cached local-hierarchy embeddings of the batch) or from
    Beta(a, a) folded to max(lambda, 1 - lambda) (vanilla 'mixup'). A few numbers per batch: made on
    the CPU with the batch, they reach the GPU in its copy and cost the step no kernel launch."""
    perm = torch.randperm(batch_size)
    if mix == 'lhmix':
        return perm, mixup_ratio(hierarchy_similarity(hier, hier[perm]), alpha, beta)
    lam = torch.distributions.Beta(float(mix_alpha), float(mix_alpha)).sample((batch_size,))
    return perm, torch.maximum(lam, 1 - lam)


# -----------------------------------------------------------------------------
# 5. Mixup and loss mixing (Sec. 4.3)


def _per_row(lam, like):
    return lam.reshape(lam.shape + (1,) * (like.dim() - lam.dim()))


def mix_hidden(h_i, h_j, lam):
    """Eq. 5: h~ = lambda h_i + (1 - lambda) h_j = lerp(h_j, h_i, lambda), one lambda per row of the
    batch, computed in fp32."""
    return torch.lerp(h_j.float(), h_i.float(), _per_row(lam.float(), h_i)).to(h_i.dtype)


def mixed_zmlce(scores, targets_i, targets_j, lam, valid=None):
    """Eq. 7: lambda L(p~, y_i) + (1 - lambda) L(p~, y_j), one lambda per pair (the authors' code
    multiplies by a (B,1,1) lambda that broadcasts into a batch mean; the paper's form is per pair)."""
    loss_i, loss_j = zmlce(scores, targets_i, valid), zmlce(scores, targets_j, valid)
    lam = _per_row(lam.float(), loss_i)
    return lam * loss_i + (1 - lam) * loss_j


# -----------------------------------------------------------------------------
# 6. ZMLCE (Eq. 2)


def _signed(scores, targets, valid):
    """x = -s for positives, +s for negatives, -inf outside the row's valid labels."""
    s = scores.to(torch.promote_types(scores.dtype, torch.float32))
    pos = targets.bool()
    x = torch.where(pos, -s, s)
    if valid is not None:
        x = x.masked_fill(~valid, -math.inf)
    return x, pos


def _zmlce_forward(scores, targets, valid):
    """log(1 + sum e^x) over the positives and over the negatives, each shifted by its own max so
    any magnitude stays finite; one exp over the row serves both sums."""
    x, pos = _signed(scores, targets, valid)
    ninf = torch.tensor(-math.inf, dtype=x.dtype, device=x.device)
    m_pos = torch.where(pos, x, ninf).amax(-1, keepdim=True).clamp_min(0)
    m_neg = torch.where(pos, ninf, x).amax(-1, keepdim=True).clamp_min(0)
    e = torch.exp(x - torch.where(pos, m_pos, m_neg))
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    s_pos = torch.where(pos, e, zero).sum(-1, keepdim=True)
    s_neg = torch.where(pos, zero, e).sum(-1, keepdim=True)
    return m_pos + torch.log(torch.exp(-m_pos) + s_pos), m_neg + torch.log(torch.exp(-m_neg) + s_neg)


def _zmlce_backward(scores, targets, valid, lse_pos, lse_neg, grad):
    """Eq. 8's closed form: d/ds_k = e^{s_k - lse_neg} (negatives), -e^{-s_k - lse_pos} (positives)."""
    x, pos = _signed(scores, targets, valid)
    p = torch.exp(x - torch.where(pos, lse_pos, lse_neg))  # 0 outside the valid labels
    return (torch.where(pos, -p, p) * grad.unsqueeze(-1)).to(scores.dtype)


try:  # on CUDA, one Triton kernel each way; the torch code above is the CPU path and the reference
    import triton
    import triton.language as tl
except ImportError:
    triton = None

if triton is not None:
    @triton.jit
    def _zmlce_fwd_kernel(S, T, VALID, LSE, L, HAS_VALID: tl.constexpr, BLOCK: tl.constexpr):
        """One program per row, one read of it: running max and sum of e^x for both label sets, each
        started at the implicit 0 logit (max 0, sum e^0 = 1)."""
        row = tl.program_id(0).to(tl.int64)
        m_pos, m_neg = tl.full([], 0.0, tl.float32), tl.full([], 0.0, tl.float32)
        a_pos, a_neg = tl.full([], 1.0, tl.float32), tl.full([], 1.0, tl.float32)
        for start in range(0, L, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            ok = cols < L
            s = tl.load(S + row * L + cols, mask=ok, other=0.0).to(tl.float32)
            pos = tl.load(T + row * L + cols, mask=ok, other=0) != 0
            if HAS_VALID:
                ok = ok & (tl.load(VALID + row * L + cols, mask=ok, other=0) != 0)
            x_pos = tl.where(ok & pos, -s, float('-inf'))
            x_neg = tl.where(ok & ~pos, s, float('-inf'))
            new_pos, new_neg = tl.maximum(m_pos, tl.max(x_pos, 0)), tl.maximum(m_neg, tl.max(x_neg, 0))
            a_pos = a_pos * tl.exp(m_pos - new_pos) + tl.sum(tl.exp(x_pos - new_pos), 0)
            a_neg = a_neg * tl.exp(m_neg - new_neg) + tl.sum(tl.exp(x_neg - new_neg), 0)
            m_pos, m_neg = new_pos, new_neg
        tl.store(LSE + 2 * row, m_pos + tl.log(a_pos))
        tl.store(LSE + 2 * row + 1, m_neg + tl.log(a_neg))

    @triton.jit
    def _zmlce_bwd_kernel(S, T, VALID, LSE, G, GS, L, HAS_VALID: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        lse_pos, lse_neg, g = tl.load(LSE + 2 * row), tl.load(LSE + 2 * row + 1), tl.load(G + row)
        for start in range(0, L, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            ok = cols < L
            s = tl.load(S + row * L + cols, mask=ok, other=0.0).to(tl.float32)
            pos = tl.load(T + row * L + cols, mask=ok, other=0) != 0
            grad = tl.where(pos, -tl.exp(-s - lse_pos), tl.exp(s - lse_neg)) * g
            if HAS_VALID:
                grad = tl.where(tl.load(VALID + row * L + cols, mask=ok, other=0) != 0, grad, 0.0)
            tl.store(GS + row * L + cols, grad.to(GS.dtype.element_ty), mask=ok)


def _rows(x, shape):
    """x broadcast to `shape`, as a contiguous (rows, L) matrix (bool as uint8, for Triton)."""
    x = x.expand(shape).reshape(-1, shape[-1]).contiguous()
    return x.view(torch.uint8) if x.dtype == torch.bool else x


def _launch(kernel, scores, targets, valid, *out):
    L = scores.shape[-1]
    block = min(triton.next_power_of_2(L), 4096)
    kernel[(scores.shape[0],)](scores, targets, valid if valid is not None else targets, *out, L,
                               HAS_VALID=valid is not None, BLOCK=block, num_warps=4 if block <= 1024 else 8)


class ZMLCE(torch.autograd.Function):
    """Eq. 2 per row: log(1 + sum_{neg} e^{s}) + log(1 + sum_{pos} e^{-s}), over valid labels.
    No concatenation, boolean indexing or host synchronisation (CUDA-graph and torch.compile
    friendly). Saves only its inputs and two numbers per row; the backward is the closed form.
    On CUDA the forward and the backward are each one fused kernel."""

    @staticmethod
    def forward(ctx, scores, targets, valid):
        ctx.fused = scores.is_cuda and triton is not None and scores.dtype != torch.float64
        if not ctx.fused:
            lse_pos, lse_neg = _zmlce_forward(scores, targets, valid)
            ctx.save_for_backward(scores, targets, valid, lse_pos, lse_neg)
            return (lse_pos + lse_neg).squeeze(-1)
        shape = scores.shape
        s, t = _rows(scores, shape), _rows(targets.bool(), shape)
        v = _rows(valid.bool(), shape) if valid is not None else None
        lse = torch.empty(s.shape[0], 2, device=s.device, dtype=torch.float32)
        _launch(_zmlce_fwd_kernel, s, t, v, lse)
        ctx.save_for_backward(s, t, v, lse)
        ctx.shape = shape
        return lse.sum(-1).view(shape[:-1])

    @staticmethod
    def backward(ctx, grad):
        if not ctx.fused:
            return _zmlce_backward(*ctx.saved_tensors, grad), None, None
        s, t, v, lse = ctx.saved_tensors
        gs = torch.empty_like(s)
        _launch(_zmlce_bwd_kernel, s, t, v, lse, grad.float().reshape(-1).contiguous(), gs)
        return gs.view(ctx.shape), None, None


def zmlce(scores, targets, valid=None):
    """Eq. 2: one loss per row of `scores` (..., L); `targets` (0/1) and `valid` (bool) broadcast to it."""
    if valid is not None:
        valid = valid.to(scores.device)
    return ZMLCE.apply(scores, targets, valid)


# -----------------------------------------------------------------------------
# Data: WOS (raw), HiAGM-format folders (NYT, RCV1-V2, any), and a synthetic demo


WOS_URL = ('https://data.mendeley.com/datasets/9rw3vkcfy4/6/files/'
           'c9ea673d-5542-44c0-ab7b-f1311f7d61df/WebOfScience.zip?dl=1')
# NLTK's English stop words, as HPT's WOS preprocessing removes them
STOPWORDS = set("""i me my myself we our ours ourselves you you're you've you'll you'd your yours yourself
yourselves he him his himself she she's her hers herself it it's its itself they them their theirs themselves
what which who whom this that that'll these those am is are was were be been being have has had having do does
did doing a an the and but if or because as until while of at by for with about against between into through
during before after above below to from up down in out on off over under again further then once here there when
where why how all any both each few more most other some such no nor not only own same so than too very s t can
will just don don't should should've now d ll m o re ve y ain aren aren't couldn couldn't didn didn't doesn
doesn't hadn hadn't hasn hasn't haven haven't isn isn't ma mightn mightn't mustn mustn't needn needn't shan
shan't shouldn shouldn't wasn wasn't weren weren't won won't wouldn wouldn't""".split())


def clean_wos(text):
    """HPT's WOS cleaning (HiAGM's clean_str, then stop words and 1-letter words removed, lower-cased)."""
    s = re.sub(r"[^A-Za-z0-9(),!?\.\'\`]", ' ', text.strip().strip('"'))
    for a, b in ((r"\'s", " 's"), (r"\'ve", " 've"), (r"n\'t", " n't"), (r"\'re", " 're"),
                 (r"\'d", " 'd"), (r"\'ll", " 'll"), (r'[,\.\"!\(\)\?]', ' ')):
        s = re.sub(a, b, s)
    s = re.sub(r'\s{2,}', ' ', s).strip().lower()
    return ' '.join(w for w in s.split() if w not in STOPWORDS and len(w) > 1)


def wos_split(n):
    """HPT's split: np.random.seed(7) shuffle, then twice sklearn's train_test_split(test_size=0.2,
    random_state=0), reproduced with numpy (RandomState(0).permutation, test = first ceil(0.2 n))."""
    ids = np.arange(n)
    np.random.RandomState(7).shuffle(ids)

    def split(a):
        n_test, n_train = math.ceil(0.2 * len(a)), math.floor((1 - 0.2) * len(a))
        p = np.random.RandomState(0).permutation(len(a))
        return a[p[n_test:n_test + n_train]], a[p[:n_test]]

    train, test = split(ids)
    train, dev = split(train)
    return train, dev, test


def _xlsx_rows(data):
    """Rows of the first sheet of an .xlsx file (bytes), with the standard library only."""
    ns = '{http://schemas.openxmlformats.org/spreadsheetml/2006/main}'
    with zipfile.ZipFile(__import__('io').BytesIO(data)) as z:
        shared = []
        if 'xl/sharedStrings.xml' in z.namelist():
            for si in ElementTree.fromstring(z.read('xl/sharedStrings.xml')).iter(ns + 'si'):
                shared.append(''.join(t.text or '' for t in si.iter(ns + 't')))
        sheet = sorted(n for n in z.namelist() if n.startswith('xl/worksheets/sheet'))[0]
        for _, row in ElementTree.iterparse(z.open(sheet)):
            if row.tag != ns + 'row':
                continue
            cells = {}
            for c in row.iter(ns + 'c'):
                col = re.match(r'[A-Z]+', c.get('r')).group()
                col = sum((ord(ch) - 64) * 26 ** k for k, ch in enumerate(reversed(col))) - 1
                kind, v = c.get('t'), c.find(ns + 'v')
                if kind == 's':
                    cells[col] = shared[int(v.text)]
                elif kind == 'inlineStr':
                    cells[col] = ''.join(t.text or '' for t in c.iter(ns + 't'))
                else:
                    cells[col] = '' if v is None else re.sub(r'\.0$', '', v.text or '')
            row.clear()
            yield [cells.get(i, '') for i in range(max(cells) + 1 if cells else 0)]


def _wos_rows(folder):
    """(source, [(line, fields)]) of WOS-46985's Meta-data table from Data.txt, Data.xlsx or the zip."""
    txt, xlsx, archive = (os.path.join(folder, f) for f in ('Data.txt', 'Data.xlsx', 'WebOfScience.zip'))
    if os.path.exists(txt):
        with open(txt, encoding='utf-8') as f:
            return txt, [(n, line.rstrip('\n').split('\t')) for n, line in enumerate(f, 1) if line.strip()]
    if os.path.exists(xlsx):
        with open(xlsx, 'rb') as f:
            return xlsx, list(enumerate(_xlsx_rows(f.read()), 1))
    if not os.path.exists(archive):
        _download(WOS_URL, archive)
    with zipfile.ZipFile(archive) as z:
        name = next((n for n in z.namelist() if n.endswith('Meta-data/Data.xlsx')), None)
        if name is None:
            raise ValueError(f'{archive}: no Meta-data/Data.xlsx inside')
        return f'{archive}:{name}', list(enumerate(_xlsx_rows(z.read(name)), 1))


def _download(url, path):
    import urllib.request
    from tqdm import tqdm
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            os.makedirs(os.path.dirname(path) or '.', exist_ok=True)  # only once the network answered
            with open(path + '.part', 'wb') as f, tqdm(total=int(r.headers.get('Content-Length') or 0), unit='B',
                                                       unit_scale=True, desc=os.path.basename(path)) as bar:
                while chunk := r.read(1 << 20):
                    f.write(chunk)
                    bar.update(len(chunk))
    except OSError as e:
        if os.path.exists(path + '.part'):
            os.remove(path + '.part')
        raise FileNotFoundError(
            f'WOS not found in {os.path.dirname(path)!r} and could not be downloaded ({e}). Put Data.txt or '
            f'Data.xlsx (from Meta-data/ of WebOfScience.zip, Mendeley Data 9rw3vkcfy4 v6) or the zip itself '
            f'there, or pass --data-dir') from None
    os.replace(path + '.part', path)


def load_wos(folder):
    """WOS-46985 preprocessed as HPT: Abstract cleaned, Domain (depth 1) -> area (depth 2), one area
    name per (Y1, Y2) code (its most frequent spelling); HPT's split. Returns (hierarchy, splits)."""
    source, numbered = _wos_rows(folder)
    if not numbered:
        raise ValueError(f'{source}: empty')
    n, header = numbered[0][0], [c.strip() for c in numbered[0][1]]
    if header[:7] != ['Y1', 'Y2', 'Y', 'Domain', 'area', 'keywords', 'Abstract']:
        raise ValueError(f'{source}:{n}: expected the header Y1 Y2 Y Domain area keywords Abstract, got {header}')
    for n, r in numbered[1:]:
        if len(r) != 7:
            raise ValueError(f'{source}:{n}: expected 7 tab-separated fields, found {len(r)}')
    rows = [r for _, r in numbered[1:]]
    domain_of = {y1: c.most_common(1)[0][0] for y1, c in _count(rows, 0, 3).items()}
    area_of = {code: c.most_common(1)[0][0] for code, c in _count(rows, (0, 1), 4).items()}
    areas = Counter(a for a in area_of.values())  # an area name used under two codes gets its domain
    key = {code: a if areas[a] == 1 else f'{a} ({domain_of[code[0]]})' for code, a in area_of.items()}
    parents = {d: None for d in sorted(set(domain_of.values()))}
    names = dict(zip(parents, parents))
    for code in sorted(key, key=lambda c: (c[0].zfill(9), c[1].zfill(9))):  # numeric order of the codes
        parents[key[code]], names[key[code]] = domain_of[code[0]], area_of[code]
    hierarchy = Hierarchy(parents, names)
    docs = [(clean_wos(r[6]), [hierarchy.index[domain_of[r[0]]], hierarchy.index[key[(r[0], r[1])]]])
            for r in rows]
    return hierarchy, {s: [docs[i] for i in idx] for s, idx in zip(('train', 'dev', 'test'), wos_split(len(docs)))}


def _count(rows, key_cols, value_col):
    out = {}
    for r in rows:
        k = r[key_cols] if isinstance(key_cols, int) else tuple(r[c] for c in key_cols)
        out.setdefault(k, Counter())[r[value_col].strip()] += 1
    return out


def load_hiagm(folder):
    """A folder in the HiAGM format: *_train.json, *_dev.json (or *_val.json), *_test.json (one JSON
    object a line: text in `token` or `doc_token`, label names in `label` or `doc_label`), one
    *.taxonomy, and optionally label_names.tsv (code<TAB>readable name). Labels are closed upward."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f'data folder {folder!r} does not exist')
    files = sorted(os.listdir(folder))

    def one(suffixes, what):
        found = [f for f in files if f.endswith(suffixes)]
        if len(found) != 1:
            raise FileNotFoundError(f'{folder!r}: expected one {what} file, found {found or "none"}')
        return os.path.join(folder, found[0])

    names = {}
    names_file = os.path.join(folder, 'label_names.tsv')
    if os.path.exists(names_file):
        with open(names_file, encoding='utf-8') as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    code, _, name = line.rstrip('\n').partition('\t')
                    if not name.strip():
                        raise ValueError(f'{names_file}:{n}: expected code<TAB>name')
                    names[code.strip()] = name.strip()
    taxonomy = one(('.taxonomy',), '*.taxonomy')
    hierarchy = Hierarchy.from_taxonomy(taxonomy, names)
    splits = {}
    for split, suffixes in (('train', ('_train.json',)), ('dev', ('_dev.json', '_val.json')), ('test', ('_test.json',))):
        path, docs = one(suffixes, '*' + ' or *'.join(suffixes)), []
        with open(path, encoding='utf-8') as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f'{path}:{n}: malformed JSON ({e.msg})') from None
                d = d if isinstance(d, dict) else {}
                text, labels = d.get('token', d.get('doc_token')), d.get('label', d.get('doc_label'))
                if text is None or not isinstance(labels, list):
                    raise ValueError(f'{path}:{n}: expected an object with `token` (or `doc_token`) and a list '
                                     '`label` (or `doc_label`)')
                unknown = [v for v in labels if v not in hierarchy.index]
                if unknown:
                    raise ValueError(f'{path}:{n}: label {unknown[0]!r} is not in the taxonomy {taxonomy}')
                text = ' '.join(text) if isinstance(text, list) else str(text)
                docs.append((text, hierarchy.closure(hierarchy.index[v] for v in labels)))
        splits[split] = docs
    return hierarchy, splits


def load_demo(seed=0, sizes=(1200, 300, 300)):
    """A small synthetic HTC set: a 2-3 level topic tree; each document draws words from its topics'
    word lists and a shared background, and one in five lies on two paths."""
    tree = {'science': {'physics': ['quantum', 'optics'], 'biology': ['genetics', 'ecology'], 'chemistry': []},
            'sports': {'football': [], 'tennis': [], 'cycling': []},
            'arts': {'music': ['jazz', 'opera'], 'painting': [], 'cinema': []},
            'business': {'finance': ['banking', 'markets'], 'retail': []}}
    parents = {}
    for top, mids in tree.items():
        parents[top] = None
        for mid, leaves in mids.items():
            parents[mid] = top
            parents.update({leaf: mid for leaf in leaves})
    hierarchy = Hierarchy(parents)
    rng = np.random.default_rng(seed)
    words = {v: [v] + [f'{v}{c}' for c in 'abcdefg'] for v in parents}
    background = [f'common{i}' for i in range(60)]
    leaves = [v for v in parents if not any(p == v for p in parents.values())]

    def path(leaf):
        return hierarchy.closure([hierarchy.index[leaf]])

    def doc():
        chosen = [leaves[rng.integers(len(leaves))]]
        if rng.random() < 0.2:
            other = [v for v in leaves if path(v)[0] != path(chosen[0])[0]]
            chosen.append(other[rng.integers(len(other))])
        labels = sorted({i for leaf in chosen for i in path(leaf)})
        topical = [w for i in labels for w in words[hierarchy.labels[i]]]
        n = int(rng.integers(20, 50))
        text = [topical[rng.integers(len(topical))] if rng.random() < 0.35 else background[rng.integers(60)]
                for _ in range(n)]
        return ' '.join(text), labels

    return hierarchy, {s: [doc() for _ in range(n)] for s, n in zip(('train', 'dev', 'test'), sizes)}


def load_data(name, data_dir=None):
    """'wos', 'nyt', 'rcv1', 'demo', or a path to a HiAGM-format folder."""
    if name == 'demo':
        return load_demo()
    if name == 'wos':
        return load_wos(data_dir or os.path.join('data', 'wos'))
    if name in ('nyt', 'rcv1'):
        return load_hiagm(data_dir or os.path.join('data', name))
    return load_hiagm(data_dir or name)


# -----------------------------------------------------------------------------
# Tokenisation (once) and batching


def tokenize(tokenizer, texts, max_text_len, chunk=4096):
    """Word-piece ids of each text (no special tokens), cut to max_text_len; returns (ids, n_truncated)."""
    out, truncated = [], 0
    for i in range(0, len(texts), chunk):
        for ids in tokenizer(texts[i:i + chunk], add_special_tokens=False, verbose=False)['input_ids']:
            truncated += len(ids) > max_text_len
            out.append(np.asarray(ids[:max_text_len], dtype=np.int64))
    return out, truncated


def pad(seqs, pad_id, multiple):
    """Right-pad id lists to a common length rounded up to `multiple` (few distinct shapes on GPU)."""
    T = -(-max(len(s) for s in seqs) // multiple) * multiple
    ids = np.full((len(seqs), T), pad_id, dtype=np.int64)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = s
    mask = np.arange(T) < np.array([len(s) for s in seqs])[:, None]
    return torch.from_numpy(ids), torch.from_numpy(mask.astype(np.int64))


def make_batch(model, texts, labels, multiple, rng=None, mlm_rate=0.0):
    """Inputs `prefix text [SEP]`, bool targets (B, V), and, with mlm_rate > 0, BERT-style masking of
    text word-pieces (80% [MASK], 10% another word-piece of the batch, 10% kept), chosen here on the CPU
    so the step never syncs."""
    prefix, sep = model.prefix, model.special['sep']
    seqs = [np.concatenate([prefix, t, [sep]]) for t in texts]
    ids, mask = pad(seqs, model.special['pad'], multiple)
    targets = torch.zeros(len(texts), len(model.hierarchy), dtype=torch.bool)
    for b, ls in enumerate(labels):
        targets[b, ls] = True
    batch = {'input_ids': ids, 'attention_mask': mask, 'targets': targets}
    if mlm_rate > 0:
        T = ids.shape[1]
        pos = torch.from_numpy(np.concatenate(
            [b * T + len(prefix) + np.flatnonzero(rng.random(len(t)) < mlm_rate) for b, t in enumerate(texts)]))
        flat = ids.view(-1)
        gold = flat[pos].clone()
        r = torch.from_numpy(rng.random(len(pos)))
        flat[pos[r < 0.8]] = model.special['mask']
        rand = pos[(r >= 0.8) & (r < 0.9)]  # a random word-piece of the batch's text, never a special token
        words = np.concatenate(texts)
        flat[rand] = torch.from_numpy(words[rng.integers(0, len(words), len(rand))])
        if len(pos):  # decided here, on the CPU: a batch with nothing masked has no MLM term
            batch['mlm_pos'], batch['mlm_labels'] = pos, gold
    return batch


def to_device(batch, device):
    if device.type == 'cuda':
        return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
    return {k: v.to(device) for k, v in batch.items()}


def train_order(lengths, batch_size, rng, chunk=64):
    """Length-bucketed batches: shuffle, sort inside chunks of `chunk` batches, shuffle the batches."""
    perm = rng.permutation(len(lengths))
    batches = []
    for i in range(0, len(perm), batch_size * chunk):
        part = perm[i:i + batch_size * chunk]
        part = part[np.argsort([lengths[j] for j in part], kind='stable')]
        batches += [part[k:k + batch_size] for k in range(0, len(part), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def pad_multiple(device):
    return 32 if device.type == 'cuda' else 8


def autocast(device):
    """bf16 autocast on GPUs that have it, fp16 otherwise (V100); fp32 on CPU."""
    if device.type != 'cuda':
        return torch.autocast('cpu', enabled=False)
    return torch.autocast('cuda', dtype=torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)


@torch.no_grad()
def predict(model, token_ids, batch_size=128, progress=False):
    """(N, V) bool predictions; documents are batched by length and returned in input order."""
    from tqdm import tqdm
    device = next(model.parameters()).device
    multiple = pad_multiple(device)
    model.eval()
    order = np.argsort([len(t) for t in token_ids], kind='stable')
    out = torch.zeros(len(token_ids), len(model.hierarchy), dtype=torch.bool)
    parts = []
    for i in tqdm(range(0, len(order), batch_size), desc='predict', disable=not progress, leave=False):
        idx = order[i:i + batch_size]
        b = to_device(make_batch(model, [token_ids[j] for j in idx], [[]] * len(idx), multiple), device)
        with autocast(device):
            parts.append((idx, model.predict(b['input_ids'], b['attention_mask'])))
    for idx, p in parts:  # copy back at the end: no host sync between batches
        out[torch.from_numpy(idx)] = p.cpu()
    return out.numpy()


# -----------------------------------------------------------------------------
# F1 (HiAGM convention) and checkpoints


def f1_scores(predictions, gold, num_labels, labels=None):
    """Micro-F1 over all label decisions and macro-F1 over ALL labels of the hierarchy (a label
    neither predicted nor present scores 0), as HiAGM and every baseline compute them. Inputs are
    (N, V) 0/1 arrays or lists of label-id collections; `labels` restricts both to a subset."""
    P, G = (_as_matrix(x, num_labels) for x in (predictions, gold))
    if labels is not None:
        P, G = P[:, labels], G[:, labels]
    tp = (P & G).sum(0).astype(float)
    n_pred, n_gold = P.sum(0).astype(float), G.sum(0).astype(float)

    def f1(tp, n_pred, n_gold):
        p = np.divide(tp, n_pred, out=np.zeros_like(tp), where=n_pred > 0)
        r = np.divide(tp, n_gold, out=np.zeros_like(tp), where=n_gold > 0)
        return np.divide(2 * p * r, p + r, out=np.zeros_like(tp), where=p + r > 0)

    per_label = f1(tp, n_pred, n_gold)
    micro = f1(np.array([tp.sum()]), np.array([n_pred.sum()]), np.array([n_gold.sum()]))[0]
    return {'micro_f1': float(micro), 'macro_f1': float(per_label.mean()) if len(per_label) else 0.0,
            'per_label_f1': per_label.tolist()}


def report(pred, gold, hierarchy, train_labels):
    """Overall, per-depth and label-frequency-quartile F1 (the paper's Fig. 6 analysis; quartiles of
    the labels by their count in `train_labels`, rarest first) of (N, V) bool predictions."""
    V = len(hierarchy)
    out = {k: v for k, v in f1_scores(pred, gold, V).items() if k != 'per_label_f1'}
    out['per_depth'] = {}
    for d, labels in enumerate(hierarchy.by_depth, 1):
        f = f1_scores(pred, gold, V, labels)
        out['per_depth'][d] = {'labels': len(labels), 'micro_f1': f['micro_f1'], 'macro_f1': f['macro_f1']}
    counts = np.bincount([v for ls in train_labels for v in ls], minlength=V)
    order = np.argsort(counts, kind='stable')  # rarest first
    out['by_frequency'] = []
    for q, labels in enumerate(np.array_split(order, 4), 1):
        f = f1_scores(pred, gold, V, labels)
        out['by_frequency'].append({'quartile': q, 'labels': len(labels), 'train_docs_min': int(counts[labels].min()),
                                    'train_docs_max': int(counts[labels].max()), 'macro_f1': f['macro_f1'],
                                    'micro_f1': f['micro_f1']})
    return out


def _as_matrix(x, num_labels):
    if isinstance(x, np.ndarray) and x.ndim == 2:
        return x.astype(bool)
    m = np.zeros((len(x), num_labels), dtype=bool)
    for i, ls in enumerate(x):
        m[i, list(ls)] = True
    return m


def save_checkpoint(folder, model, tokenizer, info, train_state=None):
    """Writes `folder` atomically: model.safetensors (weights), the HF config and tokenizer files, and
    lhmix.json (hierarchy, token ids, and `info`) -- all that is needed to rebuild the model. With
    `train_state` (optimizer state and tensors for --resume), also train_state.pt, read back with
    torch.load(weights_only=True)."""
    from safetensors.torch import save_model
    tmp = folder.rstrip('/') + '.tmp'
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    save_model(model, os.path.join(tmp, 'model.safetensors'))
    model.mlm.config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    meta = {'arch': model.arch, 'base_vocab': model.base_vocab, 'special': model.special,
            'hierarchy': model.hierarchy.to_dict(), **info}
    with open(os.path.join(tmp, 'lhmix.json'), 'w') as f:
        json.dump(meta, f, indent=1)
    if train_state is not None:
        torch.save(train_state, os.path.join(tmp, 'train_state.pt'))
    old = folder.rstrip('/') + '.old'
    if os.path.exists(folder):
        os.replace(folder, old)
    os.replace(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(folder, device='cpu', hierarchy=None):
    """(model, tokenizer, meta) from a folder written by save_checkpoint; with `hierarchy`, checks
    that the checkpoint's labels are those of the data it will be used on."""
    from safetensors.torch import load_model
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer
    path = os.path.join(folder, 'lhmix.json')
    if not os.path.exists(path):
        raise FileNotFoundError(f'{folder!r} is not an LH-Mix checkpoint (no lhmix.json)')
    with open(path) as f:
        meta = json.load(f)
    mlm = AutoModelForMaskedLM.from_config(AutoConfig.from_pretrained(folder))
    if hierarchy is not None and meta['hierarchy']['labels'] != hierarchy.labels:
        raise ValueError(f'{folder}: its labels differ from those of the data')
    model = LHMix(mlm, Hierarchy.from_dict(meta['hierarchy']), meta['arch'], meta['base_vocab'], meta['special'])
    load_model(model, os.path.join(folder, 'model.safetensors'), device=str(device))
    return model.to(device), AutoTokenizer.from_pretrained(folder), meta
