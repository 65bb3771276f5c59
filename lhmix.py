"""LH-Mix: Local Hierarchy Correlation Guided Mixup over Hierarchical Prompt Tuning (Kong, Zhang &
Wang, KDD 2025), top-down in the paper's order: Sec. 3 (Eqs. 1, 2, 8), Sec. 4 (Eqs. 3-7); then feeding
the model, checkpoints, and an appendix: ZMLCE's fused Triton kernels for CUDA. It imports nothing of
this project's, so it can be copied alone."""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


# -----------------------------------------------------------------------------
# Sec. 3: hierarchy, prompt template, model and verbalizer (Eq. 1), ZMLCE (Eq. 2) and its gradient (Eq. 8)

class Hierarchy:
    """A label tree; labels get ids in the order given, depth 1 is the top level. `parents` maps each
    label to its parent (None or 'Root' at the top), `names` to its name for the verbalizer (default:
    the part after the last '/'), `lines` to the source line that defined it (for error messages)."""

    def __init__(self, parents, names=None, lines=None):
        lines, n = lines or {}, len(parents)
        self.labels = list(parents)
        self.index = {v: i for i, v in enumerate(self.labels)}
        self.parent, self.depth = [], []
        for v in self.labels:
            p = parents[v]
            if p not in (None, 'Root') and p not in self.index:
                raise ValueError(f"{lines.get(v, 'label ' + repr(v))}: parent {p!r} of {v!r} refers to nothing")
            self.parent.append(-1 if p in (None, 'Root') else self.index[p])
        for i, v in enumerate(self.labels):
            d, j = 1, self.parent[i]
            while j >= 0 and d <= n:  # a chain of more than n labels goes round a cycle
                d, j = d + 1, self.parent[j]
            if d > n:
                raise ValueError(f"{lines.get(v, 'label ' + repr(v))}: cycle through label {v!r}")
            self.depth.append(d)
        self.num_depths = max(self.depth)
        self.by_depth = [[i for i, d in enumerate(self.depth) if d == k + 1] for k in range(self.num_depths)]
        self.names = [(names or {}).get(v, v.rsplit('/', 1)[-1]).replace('_', ' ') for v in self.labels]

    def __len__(self):
        return len(self.labels)

    def path(self, v):
        """The ancestors of label v and v itself, root first."""
        return self.path(self.parent[v]) + [v] if v >= 0 else []

    def closure(self, label_ids):
        """The label set closed upward: every ancestor of a gold label is gold too."""
        return sorted({a for v in label_ids for a in self.path(v)})


def template(num_depths, cls_id, sep_id, depth_ids, slot_id):
    """Sec. 3.2: `[CLS] [D1] [P] ... [DD] [P] [SEP]`, then text and [SEP]; [P] after [Dd] is at 2d."""
    return [cls_id] + [t for d in range(num_depths) for t in (depth_ids[d], slot_id)] + [sep_id]


class LHMix(nn.Module):
    """A masked LM whose vocabulary gains label tokens, D depth tokens and the slot [P] (ids base_vocab +
    [labels | depths | slot]). arch='prompt' (Eq. 1): label v of depth d scores the MLM head's transform
    of h^d_[P] dotted with v's tied embedding, plus a bias, over V^d; arch='bert': [CLS] -> linear (ablation)."""

    def __init__(self, mlm, hierarchy, arch, base_vocab, special, max_length=512):
        super().__init__()
        if arch not in ('prompt', 'bert'):
            raise ValueError(f'unknown arch {arch!r} (prompt or bert)')
        self.mlm, self.hierarchy, self.arch, self.base_vocab = mlm, hierarchy, arch, base_vocab
        self.special, self.max_length = special, max_length  # cls/sep/pad/mask ids; tokens per input
        V, D = len(hierarchy), hierarchy.num_depths
        self.depth_ids, self.slot_id = [base_vocab + V + d for d in range(D)], base_vocab + V + D
        if mlm.get_input_embeddings().num_embeddings != self.slot_id + 1:
            try:  # transformers >= 4.46 would otherwise mean-initialise rows that build_model overwrites
                mlm.resize_token_embeddings(self.slot_id + 1, mean_resizing=False)
            except TypeError:
                mlm.resize_token_embeddings(self.slot_id + 1)
        if hasattr(mlm, 'cls'):  # BERT family: dense -> act -> LayerNorm
            self.transform = mlm.cls.predictions.transform
        elif hasattr(mlm, 'lm_head'):  # RoBERTa family
            self.transform = lambda x, head=mlm.lm_head: head.layer_norm(F.gelu(head.dense(x)))
        else:
            raise ValueError(f'{type(mlm).__name__}: only BERT- and RoBERTa-style MLM heads are supported')
        if arch == 'prompt':
            self.label_bias = nn.Parameter(torch.zeros(V))
            self.prefix = template(D, special['cls'], special['sep'], self.depth_ids, self.slot_id)
            valid = torch.arange(1, D + 1)[:, None] == torch.tensor(hierarchy.depth)
        else:
            self.prefix, self.classifier = [special['cls']], nn.Linear(mlm.config.hidden_size, V)
            # dropout on [CLS] before the linear layer, as HF's BertForSequenceClassification and
            # HGCLR's BERT baseline (0.1 for BERT)
            c = mlm.config
            p = getattr(c, 'classifier_dropout', None)
            self.dropout = nn.Dropout(getattr(c, 'hidden_dropout_prob', 0.1) if p is None else p)
            valid = torch.ones(1, V, dtype=torch.bool)
        self.register_buffer('valid', valid, persistent=False)  # (rows, V): labels each row scores

    def name_ids(self, tokenizer):
        return [tokenizer(name, add_special_tokens=False)['input_ids'] or [tokenizer.unk_token_id]  # never empty
                for name in self.hierarchy.names]

    def label_embeddings(self):
        return self.mlm.get_input_embeddings().weight[self.base_vocab:self.base_vocab + len(self.hierarchy)]

    def text_budget(self, max_length):  # word-pieces of text beside the prefix and the closing [SEP]
        return max_length - len(self.prefix) - 1

    def encode(self, input_ids, attention_mask):
        return self.mlm.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def slots(self, hidden):
        """(B, rows, H): the [P] slot of each depth (positions 2, 4, ..., 2D), or [CLS] for bert."""
        return hidden[:, 2:2 * len(self.depth_ids) + 1:2] if self.arch == 'prompt' else hidden[:, :1]

    def score(self, slot_hidden):
        """Eq. 1: (B, rows, V) label scores p^d; only `self.valid` entries are meaningful."""
        if self.arch == 'bert':
            return self.classifier(self.dropout(slot_hidden))
        return self.transform(slot_hidden) @ self.label_embeddings().t() + self.label_bias

    def per_label(self, scores):
        """(B, rows, V) -> (B, V): each label's score in the row of its own depth."""
        return scores.masked_fill(~self.valid, -math.inf).amax(1)

    def mlm_loss(self, hidden, positions, labels):
        """HPT's auxiliary MLM loss, with the head run only at the masked positions."""
        x = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)
        return F.cross_entropy(self.mlm.get_output_embeddings()(self.transform(x)).float(), labels)

    def forward(self, *args, **kwargs):  # the training loss, Eqs. 2, 5-7
        return training_loss(self, *args, **kwargs)

    @torch.no_grad()
    def label_scores(self, input_ids, attention_mask):
        """(B, V) scores; Sec. 3: a label is predicted when its score at its depth is > 0."""
        return self.per_label(self.score(self.slots(self.encode(input_ids, attention_mask)))).float()


def build_model(mlm, tokenizer, hierarchy, arch, max_length=512):
    """A fresh LHMix around a pretrained masked LM: label tokens start as the mean word-piece embedding
    of their name (Eq. 1), depth tokens random (the paper), the slot as [MASK] (the authors' code)."""
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


def _signed(scores, targets, valid):
    """x = -s for positives, +s for negatives, -inf outside the row's valid labels; fp32 at least."""
    s = scores.to(torch.promote_types(scores.dtype, torch.float32))
    pos = targets.bool()
    x = torch.where(pos, -s, s)
    return (x if valid is None else x.masked_fill(~valid, -math.inf)), pos


class ZMLCE(torch.autograd.Function):
    """Eq. 2 per row, log(1 + sum_{neg} e^{s}) + log(1 + sum_{pos} e^{-s}) over the valid labels: two
    log-sum-exps, each shifted by its own max (finite at any size), with no host sync (CUDA graphs)."""

    @staticmethod
    def forward(ctx, scores, targets, valid):
        x, pos = _signed(scores, targets, valid)
        ninf, zero = torch.tensor(-math.inf, dtype=x.dtype, device=x.device), x.new_zeros(())
        m_pos = torch.where(pos, x, ninf).amax(-1, keepdim=True).clamp_min(0)
        m_neg = torch.where(pos, ninf, x).amax(-1, keepdim=True).clamp_min(0)
        e = torch.exp(x - torch.where(pos, m_pos, m_neg))  # one exp serves both sums
        lse_pos = m_pos + torch.log(torch.exp(-m_pos) + torch.where(pos, e, zero).sum(-1, keepdim=True))
        lse_neg = m_neg + torch.log(torch.exp(-m_neg) + torch.where(pos, zero, e).sum(-1, keepdim=True))
        ctx.save_for_backward(scores, targets, valid, lse_pos, lse_neg)
        return (lse_pos + lse_neg).squeeze(-1)

    @staticmethod
    def backward(ctx, grad):
        """Eq. 8: d/ds_k = e^{s_k - lse_neg} for negatives, -e^{-s_k - lse_pos} for positives."""
        scores, targets, valid, lse_pos, lse_neg = ctx.saved_tensors
        x, pos = _signed(scores, targets, valid)
        p = torch.exp(x - torch.where(pos, lse_pos, lse_neg))  # 0 outside the valid labels
        return (torch.where(pos, -p, p) * grad.unsqueeze(-1)).to(scores.dtype), None, None


def zmlce(scores, targets, valid=None):
    """Eq. 2: one loss per row of `scores` (..., L); `targets` (0/1) and `valid` (bool) broadcast to it."""
    if valid is not None:
        valid = valid.to(scores.device)
    if scores.is_cuda and triton is not None and scores.dtype != torch.float64:
        return FusedZMLCE.apply(scores, targets, valid)  # the appendix
    return ZMLCE.apply(scores, targets, valid)


# -----------------------------------------------------------------------------
# Sec. 4: local hierarchies (4.1, Eq. 3), the mixing ratio (4.2, Eq. 4), Mixup, loss mixing (4.3, Eqs. 5-7)

def local_hierarchy_ids(model, label_ids, name_ids):
    """Sec. 4.1: the gold labels as a sequence `[CLS] [D1] <names at depth 1> [D2] ... [SEP]`."""
    ids = [model.special['cls']]
    for d, depth_id in enumerate(model.depth_ids, 1):
        ids += [depth_id] + [t for v in label_ids if model.hierarchy.depth[v] == d for t in name_ids[v]]
    return ids + [model.special['sep']]


@torch.no_grad()
def local_hierarchy_table(model, tokenizer, label_sets, batch_size=64):
    """(table (U, H), each set's row (N,)) on the model's device, where the step gathers them: the
    [CLS] embeddings of the distinct local hierarchies. Called before training, the model is the
    paper's frozen initial encoder (Sec. 4.1), deterministic, so each is encoded once."""
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
    """Eq. 3: s = 0.5 (cos(h_i, h_j) + 1), clamped to [0, 1]: s^alpha of a rounded s < 0 would be NaN."""
    return (0.5 * (F.cosine_similarity(h_i.float(), h_j.float(), dim=-1) + 1)).clamp(0.0, 1.0)


def mixup_ratio(s, alpha, beta):
    """Eq. 4: lambda = -(beta - 0.5) s^alpha + beta; similar hierarchies mix more (lambda -> 0.5)."""
    if not alpha > 0:
        raise ValueError(f'alpha must be > 0, got {alpha}')
    if not 0.5 < beta <= 1:
        raise ValueError(f'beta must lie in (0.5, 1], got {beta}')
    return -(beta - 0.5) * s ** alpha + beta


def pair_ratios(hier, partner, alpha, beta):
    """Eq. 4 of Eq. 3: one lambda per document for its `partner` (a position in the batch), from `hier`
    (B, H), the documents' local-hierarchy embeddings; on hier's device, no host sync (CUDA graphs)."""
    return mixup_ratio(hierarchy_similarity(hier, hier[partner]), alpha, beta)


def _per_row(lam, like):
    return lam.reshape(lam.shape + (1,) * (like.dim() - lam.dim()))


def mix_hidden(h_i, h_j, lam):
    """Eq. 5: h~ = lambda h_i + (1 - lambda) h_j = lerp(h_j, h_i, lambda), one lambda per row, in fp32."""
    return torch.lerp(h_j.float(), h_i.float(), _per_row(lam.float(), h_i)).to(h_i.dtype)


def mixed_zmlce(scores, targets_i, targets_j, lam, valid=None):
    """Eq. 7: lambda L(p~, y_i) + (1 - lambda) L(p~, y_j), one lambda per pair (not a batch mean)."""
    loss_i, loss_j = zmlce(scores, targets_i, valid), zmlce(scores, targets_j, valid)
    lam = _per_row(lam.float(), loss_i)
    return lam * loss_i + (1 - lam) * loss_j


def training_loss(model, input_ids, attention_mask, targets, partner=None, lam=None, mlm_pos=None,
                  mlm_labels=None):
    """One batch's loss: ZMLCE summed over rows (Eq. 2), given `partner`/`lam` of the Mixup with each
    document's partner (Eqs. 5-7), averaged over documents, plus HPT's MLM term where positions are
    masked. Eq. 2's rows: one per depth, over V^d (the authors' code makes one per document)."""
    hidden = model.encode(input_ids, attention_mask)
    h = model.slots(hidden)
    if partner is not None:
        h = mix_hidden(h, h[partner], lam)                          # Eq. 5
    p = model.score(h)                                              # Eq. 1 / Eq. 6: p~ = f(h~)
    v, t = model.valid, targets[:, None, :]
    loss = zmlce(p, t, v) if partner is None else mixed_zmlce(p, t, t[partner], lam, v)  # Eq. 2 or Eq. 7
    loss = loss.sum(-1).mean()
    if mlm_pos is not None:
        loss = loss + model.mlm_loss(hidden, mlm_pos, mlm_labels)
    return loss


# -----------------------------------------------------------------------------
# Feeding the model: tokens once, length-bucketed batches with random Mixup pairs, prediction

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


def mlm_capacity(batch_size, seq_len, rate):
    """A fixed count of MLM positions per batch shape, for CUDA graphs' static shapes: the mean plus 8
    standard deviations, rounded up to 64 (exceeded with p < 1e-15; make_batch then takes a multiple)."""
    n = batch_size * seq_len
    return int(-(-(rate * n + 8 * math.sqrt(n * rate * (1 - rate)) + 1) // 64) * 64)


def make_batch(model, token_ids, labels, multiple, rng=None, mlm_rate=0.0, static=False):
    """Inputs `prefix text [SEP]`, bool targets (B, V), and with mlm_rate > 0 BERT-style masking of
    text word-pieces (80% [MASK], 10% another of the batch's, 10% kept), chosen on the CPU so the step
    never syncs. static=True pads the masked positions to `mlm_capacity` with label -100 (ignored)."""
    prefix, sep = model.prefix, model.special['sep']
    seqs = [np.concatenate([prefix, t, [sep]]) for t in token_ids]
    ids, mask = pad(seqs, model.special['pad'], multiple)
    targets = torch.zeros(len(token_ids), len(model.hierarchy), dtype=torch.bool)
    for b, ls in enumerate(labels):
        targets[b, ls] = True
    batch = {'input_ids': ids, 'attention_mask': mask, 'targets': targets}
    if mlm_rate > 0:
        T = ids.shape[1]
        pos = torch.from_numpy(np.concatenate(
            [b * T + len(prefix) + np.flatnonzero(rng.random(len(t)) < mlm_rate) for b, t in enumerate(token_ids)]))
        flat = ids.view(-1)
        gold = flat[pos].clone()
        r = torch.from_numpy(rng.random(len(pos)))
        flat[pos[r < 0.8]] = model.special['mask']
        rand = pos[(r >= 0.8) & (r < 0.9)]  # a random word-piece of the batch's text, never a special token
        words = np.concatenate(token_ids)
        flat[rand] = torch.from_numpy(words[rng.integers(0, len(words), len(rand))])
        if len(pos):  # decided here, on the CPU: a batch with nothing masked has no MLM term
            if static:
                cap = mlm_capacity(*ids.shape, mlm_rate)
                cap *= -(-len(pos) // cap)
                pos = torch.cat([pos, pos.new_zeros(cap - len(pos))])
                gold = torch.cat([gold, gold.new_full((cap - len(gold),), -100)])
            batch['mlm_pos'], batch['mlm_labels'] = pos, gold
    return batch


def to_device(batch, device):
    if device.type == 'cuda':
        return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
    return {k: v.to(device) for k, v in batch.items()}


def train_batches(lengths, batch_size, rng, mixing, chunk=64):
    """One epoch's batches as (document ids, partner positions or None). With `mixing`, batches are
    slices of a uniform shuffle and partners a uniformly random permutation of each batch (the
    authors' torch.randperm(B), Zhang et al.'s Mixup): one-way, and pi(i) == i leaves row i clean.
    Without, documents are sorted by length within chunks of `chunk` batches (less padding), and
    the batches shuffled: a partner would then be chosen by length."""
    perm = rng.permutation(len(lengths))
    if mixing:
        return [(idx, rng.permutation(len(idx))) for idx in
                (perm[i:i + batch_size] for i in range(0, len(perm), batch_size))]
    lengths, batches = np.asarray(lengths), []
    for i in range(0, len(perm), batch_size * chunk):
        part = perm[i:i + batch_size * chunk]
        part = part[np.argsort(lengths[part], kind='stable')]
        batches += [(part[k:k + batch_size], None) for k in range(0, len(part), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def pad_multiple(device):
    return 32 if device.type == 'cuda' else 8


def autocast(device):
    """bf16 autocast on GPUs that have it, fp16 otherwise (V100); fp32 on CPU. No cast cache: CUDA
    graphs (train.py) forbid it, and each weight is cast once per step anyway."""
    if device.type != 'cuda':
        return torch.autocast('cpu', enabled=False)
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.autocast('cuda', dtype=dtype, cache_enabled=False)


@torch.no_grad()
def score_documents(model, token_ids, batch_size=128, scorer=None):
    """(N, V) float32 label scores (> 0: predicted), batched by length, in input order. `scorer`
    (train.py's CUDA graphs) replaces model.label_scores and gets full batches: one shape per length."""
    device, parts = next(model.parameters()).device, []
    model.eval()
    order = np.argsort([len(t) for t in token_ids], kind='stable')
    for i in range(0, len(order), batch_size):
        idx = order[i:i + batch_size]
        docs = [token_ids[j] for j in idx]
        if scorer is not None:  # a full batch (empty texts added, their rows dropped): one shape per length
            docs += [docs[0][:0]] * (batch_size - len(docs))
        b = to_device(make_batch(model, docs, [[]] * len(docs), pad_multiple(device)), device)
        with autocast(device):
            scores = (scorer or model.label_scores)(input_ids=b['input_ids'], attention_mask=b['attention_mask'])
        parts.append((idx, scores[:len(idx)].clone()))  # a scorer's next call overwrites its output
    out = torch.zeros(len(token_ids), len(model.hierarchy))
    for idx, s in parts:  # copy back at the end: no host sync between batches
        out[torch.from_numpy(idx)] = s.cpu()
    return out.numpy()


# -----------------------------------------------------------------------------
# Appendix: ZMLCE as one fused Triton kernel each way, for CUDA (ZMLCE above is the reference)

try:
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


def _launch(kernel, s, t, v, *out):
    block = min(triton.next_power_of_2(s.shape[1]), 4096)
    kernel[(s.shape[0],)](s, t, v if v is not None else t, *out, s.shape[1],
                          HAS_VALID=v is not None, BLOCK=block, num_warps=4 if block <= 1024 else 8)


class FusedZMLCE(torch.autograd.Function):
    """ZMLCE (Eq. 2, Eq. 8) by the kernels above, one program per row of its inputs as (rows, L)."""

    @staticmethod
    def forward(ctx, scores, targets, valid):
        ctx.shape = shape = scores.shape
        s, t = _rows(scores, shape), _rows(targets.bool(), shape)
        v = _rows(valid.bool(), shape) if valid is not None else None
        lse = torch.empty(s.shape[0], 2, device=s.device, dtype=torch.float32)
        _launch(_zmlce_fwd_kernel, s, t, v, lse)
        ctx.save_for_backward(s, t, v, lse)
        return lse.sum(-1).view(shape[:-1])

    @staticmethod
    def backward(ctx, grad):
        s, t, v, lse = ctx.saved_tensors
        gs = torch.empty_like(s)
        _launch(_zmlce_bwd_kernel, s, t, v, lse, grad.float().reshape(-1).contiguous(), gs)
        return gs.view(ctx.shape), None, None
