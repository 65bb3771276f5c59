"""LH-Mix (Kong, Zhang & Wang, KDD 2025): Sec. 3 (Eqs. 1, 2), Sec. 4 (Eqs. 3-7), feeding the
model, and an appendix: ZMLCE fused in Triton. Imports nothing of this project: copy it alone."""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


# -----------------------------------------------------------------------------
# Sec. 3: hierarchy, prompt template, model and verbalizer (Eq. 1), ZMLCE (Eq. 2)

class Hierarchy:
    """A label tree, ids in the order given, depth 1 at the top. Maps from labels: `parents`
    (None or 'Root' at the top), `names` (default: after the last '/'), `lines` (for errors)."""

    def __init__(self, parents, names=None, lines=None):
        lines, n = lines or {}, len(parents)
        self.labels = list(parents)
        self.index = {v: i for i, v in enumerate(self.labels)}
        self.parent, self.depth = [], []
        where = [lines.get(v, f'label {v!r}') for v in self.labels]
        for i, v in enumerate(self.labels):
            p = parents[v]
            if p not in (None, 'Root') and p not in self.index:
                raise ValueError(f'{where[i]}: parent {p!r} of {v!r} refers to nothing')
            self.parent.append(-1 if p in (None, 'Root') else self.index[p])
        for i, v in enumerate(self.labels):
            d, j = 1, self.parent[i]
            while j >= 0 and d <= n:  # a chain of more than n labels goes round a cycle
                d, j = d + 1, self.parent[j]
            if d > n:
                raise ValueError(f'{where[i]}: cycle through label {v!r}')
            self.depth.append(d)
        self.num_depths = max(self.depth)
        self.by_depth = [[i for i, d in enumerate(self.depth) if d == k]
                         for k in range(1, self.num_depths + 1)]
        names = names or {}
        self.names = [names.get(v, v.rsplit('/', 1)[-1]).replace('_', ' ') for v in self.labels]

    def __len__(self):
        return len(self.labels)

    def path(self, v):  # v's ancestors and v, root first
        return self.path(self.parent[v]) + [v] if v >= 0 else []

    def closure(self, label_ids):  # every ancestor of a gold label is gold too
        return sorted({a for v in label_ids for a in self.path(v)})


def template(num_depths, cls_id, sep_id, depth_ids, slot_id):
    """Sec. 3.2: `[CLS] [D1] [P] ... [DD] [P] [SEP]`, then text, [SEP]; depth d's [P] at 2d."""
    return [cls_id] + [t for d in range(num_depths) for t in (depth_ids[d], slot_id)] + [sep_id]


class LHMix(nn.Module):
    """A masked LM whose vocabulary gains label tokens, D depth tokens and the slot [P] (ids
    base_vocab + [labels | depths | slot]). arch 'prompt': Eq. 1; 'bert': linear on [CLS]."""

    def __init__(self, mlm, hierarchy, arch, base_vocab, special, max_length=512):
        super().__init__()
        if arch not in ('prompt', 'bert'):
            raise ValueError(f'unknown arch {arch!r} (prompt or bert)')
        self.mlm, self.hierarchy, self.arch, self.base_vocab = mlm, hierarchy, arch, base_vocab
        self.special, self.max_length = special, max_length  # cls/sep/pad/mask ids; input length
        V, D, config = len(hierarchy), hierarchy.num_depths, mlm.config
        self.depth_ids, self.slot_id = [base_vocab + V + d for d in range(D)], base_vocab + V + D
        if mlm.get_input_embeddings().num_embeddings != self.slot_id + 1:
            try:  # transformers >= 4.46 would otherwise mean-initialise rows build_model overwrites
                mlm.resize_token_embeddings(self.slot_id + 1, mean_resizing=False)
            except TypeError:
                mlm.resize_token_embeddings(self.slot_id + 1)
        if not hasattr(mlm, 'cls'):
            raise ValueError(f'{type(mlm).__name__}: not a BERT-style masked LM (cls.predictions)')
        self.transform = mlm.cls.predictions.transform  # dense -> act -> LayerNorm
        if arch == 'prompt':
            self.label_bias = nn.Parameter(torch.zeros(V))
            self.prefix = template(D, special['cls'], special['sep'], self.depth_ids, self.slot_id)
            valid = torch.arange(1, D + 1)[:, None] == torch.tensor(hierarchy.depth)
        else:
            # dropout on [CLS] (0.1 for BERT), as HF's BertForSequenceClassification and HGCLR's
            # BERT baseline
            p = getattr(config, 'classifier_dropout', None)
            self.dropout = nn.Dropout(config.hidden_dropout_prob if p is None else p)
            self.prefix, self.classifier = [special['cls']], nn.Linear(config.hidden_size, V)
            valid = torch.ones(1, V, dtype=torch.bool)
        self.register_buffer('valid', valid, persistent=False)  # (rows, V): labels each row scores

    def name_ids(self, tokenizer):
        return [tokenizer(name, add_special_tokens=False)['input_ids']
                or [tokenizer.unk_token_id] for name in self.hierarchy.names]  # never empty

    def label_embeddings(self):
        b = self.base_vocab
        return self.mlm.get_input_embeddings().weight[b:b + len(self.hierarchy)]

    def text_budget(self, max_length):  # text word-pieces beside the prefix and closing [SEP]
        return max_length - len(self.prefix) - 1

    def encode(self, input_ids, attention_mask):
        return self.mlm.base_model(input_ids, attention_mask).last_hidden_state

    def slots(self, hidden):
        """(B, rows, H): the [P] of each depth (positions 2, 4, ..., 2D), or [CLS] for bert."""
        if self.arch == 'bert':
            return hidden[:, :1]
        return hidden[:, 2:2 * len(self.depth_ids) + 1:2]

    def score(self, slot_hidden):
        """Eq. 1: (B, rows, V) label scores p^d; only `self.valid` entries are meaningful."""
        if self.arch == 'bert':
            return self.classifier(self.dropout(slot_hidden))
        return self.transform(slot_hidden) @ self.label_embeddings().t() + self.label_bias

    def per_label(self, scores):  # (B, rows, V) -> (B, V): each label's in its depth's row
        return scores.masked_fill(~self.valid, -math.inf).amax(1)

    def mlm_loss(self, hidden, positions, labels):
        """HPT's auxiliary MLM loss, the head run only at the masked positions."""
        x = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)
        return F.cross_entropy(self.mlm.get_output_embeddings()(self.transform(x)).float(), labels)

    def forward(self, *args, **kwargs):  # the training loss, Eqs. 2, 5-7
        return training_loss(self, *args, **kwargs)

    @torch.no_grad()
    def label_scores(self, input_ids, attention_mask):
        """(B, V) scores; Sec. 3: a label is predicted when its score is > 0."""
        hidden = self.encode(input_ids, attention_mask)
        return self.per_label(self.score(self.slots(hidden))).float()


def build_model(mlm, tokenizer, hierarchy, arch, max_length=512):
    """A fresh LHMix: label tokens start as the mean embedding of their name's word-pieces (Eq. 1),
    depth tokens random (the paper), [P] as [MASK] (the authors' code)."""
    special = {'cls': tokenizer.cls_token_id, 'sep': tokenizer.sep_token_id,
               'pad': tokenizer.pad_token_id, 'mask': tokenizer.mask_token_id}
    model = LHMix(mlm, hierarchy, arch, len(tokenizer), special, max_length)
    emb = mlm.get_input_embeddings().weight
    with torch.no_grad():
        for v, ids in enumerate(model.name_ids(tokenizer)):
            emb[model.base_vocab + v] = emb[ids].mean(0)
        for d in model.depth_ids:
            emb[d].normal_(0.0, mlm.config.initializer_range)
        emb[model.slot_id] = emb[special['mask']]
    return model


def zmlce(scores, targets, valid=None):
    """Eq. 2, a loss per row of `scores` (..., L) over its valid labels; `targets` (0/1) and
    `valid` (bool) broadcast to it. On CUDA, the appendix's fused kernel."""
    if scores.is_cuda and triton is not None and scores.dtype != torch.float64:
        return FusedZMLCE.apply(scores, targets, valid)
    return plain_zmlce(scores, targets, valid)


def plain_zmlce(scores, targets, valid=None):
    """Each sum of Eq. 2 as a log-sum-exp with a zero column for its 1, masked entries at -inf:
    finite at any size; autograd gives Eq. 8."""
    s = scores.to(torch.promote_types(scores.dtype, torch.float32))
    pos = targets.bool()
    x = torch.where(pos, -s, s)
    if valid is not None:
        x = x.masked_fill(~valid, -math.inf)
    zero = x.new_zeros(x.shape[:-1] + (1,))

    def log1p_sum_exp(mask):  # log(1 + sum e^x) where mask is False
        return torch.logsumexp(torch.cat([x.masked_fill(mask, -math.inf), zero], -1), -1)
    return log1p_sum_exp(pos) + log1p_sum_exp(~pos)  # Eq. 2: negatives' e^s + positives' e^-s


# -----------------------------------------------------------------------------
# Sec. 4: local hierarchies (Eq. 3), the mixing ratio (Eq. 4), Mixup and loss mixing (Eqs. 5-7)

def local_hierarchy_ids(model, label_ids, name_ids):
    """Sec. 4.1: the gold labels as a sequence `[CLS] [D1] <names at depth 1> [D2] ... [SEP]`."""
    ids = [model.special['cls']]
    for d, depth_id in enumerate(model.depth_ids, 1):
        ids += [depth_id]
        ids += [t for v in label_ids if model.hierarchy.depth[v] == d for t in name_ids[v]]
    return ids + [model.special['sep']]


@torch.no_grad()
def local_hierarchy_table(model, tokenizer, label_sets, batch_size=64):
    """(table (U, H) float32, each set's row (N,) int64) on the model's device: [CLS] of each
    distinct local hierarchy, encoded once, before training (the frozen encoder, Sec. 4.1)."""
    keys = [tuple(sorted(s)) for s in label_sets]
    distinct = sorted(set(keys))
    name_ids = model.name_ids(tokenizer)
    seqs = [local_hierarchy_ids(model, k, name_ids) for k in distinct]
    device, was_training = next(model.parameters()).device, model.training
    model.eval()
    out = []
    for i in range(0, len(seqs), batch_size):
        ids, mask = pad(seqs[i:i + batch_size], model.special['pad'], 1)
        out.append(model.encode(ids.to(device), mask.to(device))[:, 0].float())
    model.train(was_training)
    row = {k: i for i, k in enumerate(distinct)}
    return torch.cat(out), torch.tensor([row[k] for k in keys], device=device)


def hierarchy_similarity(h_i, h_j):
    """Clamped to [0, 1]: s^alpha of a rounded s < 0 would be NaN."""
    s = 0.5 * (F.cosine_similarity(h_i.float(), h_j.float(), dim=-1) + 1)  # Eq. 3
    return s.clamp(0.0, 1.0)


def mixup_ratio(s, alpha, beta):
    """Similar hierarchies mix more (lambda -> 0.5). Checks alpha, beta as Python numbers."""
    if not alpha > 0:
        raise ValueError(f'alpha must be > 0, got {alpha}')
    if not 0.5 < beta <= 1:
        raise ValueError(f'beta must lie in (0.5, 1], got {beta}')
    return -(beta - 0.5) * s ** alpha + beta  # Eq. 4


def pair_ratios(hier, partner, alpha, beta):
    """Each document's lambda from its local hierarchy `hier` (B, H) and its `partner`'s, on
    hier's device with no host sync (CUDA graphs)."""
    return mixup_ratio(hierarchy_similarity(hier, hier[partner]), alpha, beta)  # Eqs. 3-4


def mix_hidden(h_i, h_j, lam):
    """h~ = lambda h_i + (1 - lambda) h_j, for h (B, rows, H) and a lambda (B,) per document."""
    lam = lam.float()[:, None, None]
    return torch.lerp(h_j.float(), h_i.float(), lam).to(h_i.dtype)  # Eq. 5, in fp32


def mixed_zmlce(scores, targets_i, targets_j, lam, valid=None):
    """One lambda (B,) per pair, not a batch mean; scores (B, rows, V)."""
    loss_i, loss_j = zmlce(scores, targets_i, valid), zmlce(scores, targets_j, valid)
    lam = lam.float()[:, None]
    return lam * loss_i + (1 - lam) * loss_j  # Eq. 7


def training_loss(model, input_ids, attention_mask, targets, partner=None, lam=None,
                  mlm_pos=None, mlm_labels=None):
    """ZMLCE summed over rows (one per depth; the authors' code makes one per document), mixed
    with `partner` by `lam`, averaged over documents, plus HPT's MLM term if any is masked."""
    hidden = model.encode(input_ids, attention_mask)
    h = model.slots(hidden)
    if partner is not None:
        h = mix_hidden(h, h[partner], lam)                          # Eq. 5
    p = model.score(h)                                              # Eq. 1 / Eq. 6: p~ = f(h~)
    v, t = model.valid, targets[:, None, :]
    if partner is None:
        loss = zmlce(p, t, v)                                       # Eq. 2
    else:
        loss = mixed_zmlce(p, t, t[partner], lam, v)                # Eq. 7
    loss = loss.sum(-1).mean()
    if mlm_pos is not None:
        loss = loss + model.mlm_loss(hidden, mlm_pos, mlm_labels)
    return loss


# -----------------------------------------------------------------------------
# Feeding the model: tokens, batches, scores

def tokenize(tokenizer, texts, max_text_len, chunk=4096):
    """(word-pieces of each text cut to max_text_len, the number cut)."""
    out, truncated = [], 0
    for i in range(0, len(texts), chunk):
        batch = tokenizer(texts[i:i + chunk], add_special_tokens=False, verbose=False)
        for ids in batch['input_ids']:
            truncated += len(ids) > max_text_len
            out.append(np.asarray(ids[:max_text_len], dtype=np.int64))
    return out, truncated


def pad(seqs, pad_id, multiple):
    """Right-pad id lists to one length, a multiple of `multiple` (few distinct shapes on GPU)."""
    T = -(-max(len(s) for s in seqs) // multiple) * multiple
    ids = np.full((len(seqs), T), pad_id, dtype=np.int64)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = s
    mask = np.arange(T) < np.array([len(s) for s in seqs])[:, None]
    return torch.from_numpy(ids), torch.from_numpy(mask.astype(np.int64))


def make_batch(model, token_ids, labels, multiple, rng=None, mlm_rate=0.0, static=False):
    """Inputs `prefix text [SEP]`, bool targets (B, V), and with mlm_rate BERT's masking of text
    (80% [MASK], 10% another word-piece, 10% kept), on the CPU: the step never syncs."""
    prefix = model.prefix
    seqs = [np.concatenate([prefix, t, [model.special['sep']]]) for t in token_ids]
    ids, mask = pad(seqs, model.special['pad'], multiple)
    targets = torch.zeros(len(token_ids), len(model.hierarchy), dtype=torch.bool)
    for b, ls in enumerate(labels):
        targets[b, ls] = True
    batch = {'input_ids': ids, 'attention_mask': mask, 'targets': targets}
    if mlm_rate > 0:
        T = ids.shape[1]
        pos = torch.from_numpy(np.concatenate([b * T + len(prefix) + np.flatnonzero(
            rng.random(len(t)) < mlm_rate) for b, t in enumerate(token_ids)]))
        flat = ids.view(-1)
        gold = flat[pos].clone()
        r = torch.from_numpy(rng.random(len(pos)))
        flat[pos[r < 0.8]] = model.special['mask']
        rand = pos[(r >= 0.8) & (r < 0.9)]  # a word-piece of the batch's text, not a special one
        words = np.concatenate(token_ids)
        flat[rand] = torch.from_numpy(words[rng.integers(0, len(words), len(rand))])
        if len(pos):  # decided here, on the CPU: a batch with nothing masked has no MLM term
            if static:  # a count per shape for CUDA graphs: the mean + 8 sd rounded up to 64 (or
                # a multiple, p < 1e-15), padded with label -100, which cross_entropy ignores
                n, q = ids.numel(), mlm_rate
                cap = int(-(-(q * n + 8 * math.sqrt(n * q * (1 - q)) + 1) // 64) * 64)
                cap *= -(-len(pos) // cap)
                pos = torch.cat([pos, pos.new_zeros(cap - len(pos))])
                gold = torch.cat([gold, gold.new_full((cap - len(gold),), -100)])
            batch['mlm_pos'], batch['mlm_labels'] = pos, gold
    return batch


def to_device(batch, device):
    if device.type == 'cuda':  # from pinned memory: the copy does not sync
        return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
    return {k: v.to(device) for k, v in batch.items()}


def train_batches(lengths, batch_size, rng, mixing):
    """An epoch's (document ids, partner positions or None). Mixing: slices of a shuffle, partners
    a random permutation of each, as the authors' randperm(B) (pi(i) == i: a clean row). Else,
    less padding: sorted by length in chunks of 64 batches (Mixup would pair similar lengths)."""
    perm = rng.permutation(len(lengths))
    if mixing:
        return [(idx, rng.permutation(len(idx))) for idx in
                (perm[i:i + batch_size] for i in range(0, len(perm), batch_size))]
    lengths, batches = np.asarray(lengths), []
    for i in range(0, len(perm), 64 * batch_size):
        part = perm[i:i + 64 * batch_size]
        part = part[np.argsort(lengths[part], kind='stable')]
        batches += [(part[k:k + batch_size], None) for k in range(0, len(part), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def pad_multiple(device):
    return 32 if device.type == 'cuda' else 8


def autocast(device):
    """bf16 autocast on GPUs that have it, fp16 otherwise; fp32 on CPU. No cast cache: CUDA graphs
    forbid it, and each weight is cast once per step anyway."""
    cuda = device.type == 'cuda'
    dtype = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float16
    return torch.autocast(device.type, dtype, enabled=cuda, cache_enabled=False)


@torch.no_grad()
def score_documents(model, token_ids, batch_size=128):
    """(N, V) float32 label scores (> 0: predicted) in input order, batched by length."""
    device = next(model.parameters()).device
    out = torch.zeros(len(token_ids), len(model.hierarchy), device=device)
    model.eval()
    order = np.argsort([len(t) for t in token_ids], kind='stable')
    for i in range(0, len(order), batch_size):
        idx = order[i:i + batch_size]
        b = to_device(make_batch(model, [token_ids[j] for j in idx], [[]] * len(idx),
                                 pad_multiple(device)), device)
        with autocast(device):
            scores = model.label_scores(b['input_ids'], b['attention_mask'])
        out[torch.from_numpy(idx).to(device)] = scores  # no host sync between batches
    return out.cpu().numpy()


# -----------------------------------------------------------------------------
# Appendix: ZMLCE fused in Triton for CUDA, forward (Eq. 2) and backward (Eq. 8)

if triton is not None:
    @triton.jit
    def _zmlce_kernel(S, T, VALID, LOSS, GRAD, L, BLOCK: tl.constexpr):
        """One row (BLOCK >= L): Eq. 2's log-sum-exps shifted by max(0, x), and Eq. 8's gradient
        d/ds = e^{s - lse_neg} for negatives, -e^{-s - lse_pos} for positives, for backward."""
        row, cols = tl.program_id(0).to(tl.int64), tl.arange(0, BLOCK)
        at, ok = row * L + cols, cols < L
        s = tl.load(S + at, mask=ok, other=0.0).to(tl.float32)
        pos = tl.load(T + at, mask=ok, other=0) != 0
        valid = tl.load(VALID + at, mask=ok, other=0) != 0
        x = tl.where(valid, tl.where(pos, -s, s), float('-inf'))
        x_pos, x_neg = tl.where(pos, x, float('-inf')), tl.where(pos, float('-inf'), x)
        m_pos, m_neg = tl.maximum(tl.max(x_pos, 0), 0.0), tl.maximum(tl.max(x_neg, 0), 0.0)
        lse_pos = m_pos + tl.log(tl.exp(-m_pos) + tl.sum(tl.exp(x_pos - m_pos), 0))
        lse_neg = m_neg + tl.log(tl.exp(-m_neg) + tl.sum(tl.exp(x_neg - m_neg), 0))
        tl.store(LOSS + row, lse_pos + lse_neg)  # Eq. 2
        grad = tl.exp(x - tl.where(pos, lse_pos, lse_neg))  # Eq. 8; 0 outside the valid labels
        tl.store(GRAD + at, tl.where(pos, -grad, grad), mask=ok)


def _rows(x, shape):
    """x broadcast to `shape` as a contiguous (rows, L) matrix, bool as uint8 (Triton's)."""
    x = x.expand(shape).reshape(-1, shape[-1]).contiguous()
    return x.view(torch.uint8) if x.dtype == torch.bool else x


class FusedZMLCE(torch.autograd.Function):
    """zmlce() by the kernel above, one program per row; the gradient is made going forward, in
    the same read of the row, so backward only scales it."""

    @staticmethod
    def forward(ctx, scores, targets, valid):
        shape, L = scores.shape, scores.shape[-1]
        if valid is None:
            valid = torch.ones((), dtype=torch.bool, device=scores.device)
        s, t, v = _rows(scores, shape), _rows(targets.bool(), shape), _rows(valid, shape)
        loss = torch.empty(s.shape[0], device=s.device)
        grad = torch.empty(s.shape, device=s.device)
        block = triton.next_power_of_2(L)
        _zmlce_kernel[(s.shape[0],)](s, t, v, loss, grad, L, BLOCK=block,
                                     num_warps=4 if block <= 1024 else 8)
        ctx.save_for_backward(grad.view(shape))
        ctx.dtype = scores.dtype
        return loss.view(shape[:-1])

    @staticmethod
    def backward(ctx, g):
        grad, = ctx.saved_tensors
        return (grad * g.unsqueeze(-1)).to(ctx.dtype), None, None
