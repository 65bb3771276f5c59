"""LH-Mix (Kong, Zhang & Wang, KDD 2025): Sec. 3 (Eqs. 1, 2), Sec. 4 (Eqs. 3-7), then, not in the
paper, feeding the model and ZMLCE fused in Triton. Imports nothing of this project: copy it."""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

TRANSFORMERS_5 = int(transformers.__version__.split('.')[0]) >= 5
if TRANSFORMERS_5:  # packed rows' attention, document_attention
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface


# Sec. 3: hierarchy, prompt template, model and verbalizer (Eq. 1), ZMLCE (Eq. 2)

class Hierarchy:
    """A label tree from {label: parent, None or 'Root' at the top (depth 1)}, ids in that order;
    names (default: after the last '/'), lines (for errors)."""

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
            while j >= 0 and d <= n:  # a chain of over n labels is a cycle
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
    base_vocab + [labels | depths | slot]). arch 'prompt': Eq. 1; 'bert': Table 3's flat
    BERT, HGCLR's: dropout and a linear layer on [CLS]."""

    def __init__(self, mlm, hierarchy, arch, base_vocab, special, max_length=512):
        super().__init__()
        self.mlm, self.hierarchy, self.arch, self.base_vocab = mlm, hierarchy, arch, base_vocab
        self.special, self.max_length = special, max_length  # cls/sep/pad/mask ids
        V, D, config = len(hierarchy), hierarchy.num_depths, mlm.config
        self.depth_ids, self.slot_id = [base_vocab + V + d for d in range(D)], base_vocab + V + D
        if mlm.get_input_embeddings().num_embeddings != self.slot_id + 1:
            # not mean-initialised: build_model overwrites them
            mlm.resize_token_embeddings(self.slot_id + 1, mean_resizing=False)
        if not hasattr(mlm, 'cls'):
            raise ValueError(f'{type(mlm).__name__}: not a BERT-style masked LM (cls.predictions)')
        if TRANSFORMERS_5:  # SDPA, per document in a packed row
            mlm.set_attn_implementation('lhmix')
        self.transform = mlm.cls.predictions.transform  # dense -> act -> LayerNorm
        if arch == 'prompt':
            self.label_bias = nn.Parameter(torch.zeros(V))
            self.prefix = template(D, special['cls'], special['sep'], self.depth_ids, self.slot_id)
            valid = torch.arange(1, D + 1)[:, None] == torch.tensor(hierarchy.depth)
        else:
            self.dropout = nn.Dropout(config.hidden_dropout_prob)  # 0.1 for BERT
            self.prefix, self.classifier = [special['cls']], nn.Linear(config.hidden_size, V)
            valid = torch.ones(1, V, dtype=torch.bool)
        self.register_buffer('valid', valid, persistent=False)  # (slots, V): each slot's labels
        slots = [i for i, t in enumerate(self.prefix) if t == self.slot_id] or [0]  # or [CLS]
        self.register_buffer('slot_offsets', torch.tensor(slots), persistent=False)
        if not 0 < self.text_budget(max_length) or max_length > config.max_position_embeddings:
            raise ValueError(f'max_length {max_length} leaves {self.text_budget(max_length)} text '
                             f'tokens (at most {config.max_position_embeddings} positions)')
        self.register_buffer('local_hierarchies', None, persistent=False)  # LH-Mix's, below
        self.alpha = self.beta = None

    def use_local_hierarchies(self, table, alpha, beta):
        """LH-Mix: ratios by Eqs. 3-4 from `table` (local_hierarchy_table's)."""
        self.local_hierarchies, self.alpha, self.beta = table, alpha, beta

    def name_ids(self, tokenizer):
        return [tokenizer(name, add_special_tokens=False)['input_ids']
                or [tokenizer.unk_token_id] for name in self.hierarchy.names]

    def label_embeddings(self):
        b = self.base_vocab
        return self.mlm.get_input_embeddings().weight[b:b + len(self.hierarchy)]

    def text_budget(self, max_length):  # text word-pieces beside prefix and closing [SEP]
        return max_length - len(self.prefix) - 1

    def encode(self, input_ids, attention_mask=None, position_ids=None, offsets=None):
        """Last hidden states; in a packed row (`offsets`) each document attends to itself."""
        if offsets is None:
            return self.mlm.base_model(input_ids, attention_mask).last_hidden_state
        return self.mlm.base_model(  # token types given: the default is cut from 512 positions
            input_ids, token_type_ids=torch.zeros_like(input_ids), position_ids=position_ids,
            cu_seq_lens_q=offsets, max_length_q=max(self.max_length, PACKED)).last_hidden_state

    def slots(self, hidden, starts):
        """(B, slots, H): each depth's [P] (or bert's [CLS]) of the documents at `starts`."""
        return hidden.flatten(0, 1)[starts[:, None] + self.slot_offsets]

    def score(self, slot_hidden):
        """Eq. 1: (B, slots, V) label scores p^d; only `self.valid` entries are meaningful."""
        if self.arch == 'bert':
            return self.classifier(self.dropout(slot_hidden))
        return self.transform(slot_hidden) @ self.label_embeddings().t() + self.label_bias  # Eq. 1

    def loss(self, scores, targets):
        """(B, slots): Eq. 2 per depth; for bert, HGCLR's binary cross-entropy, mean over labels."""
        if self.arch == 'bert':
            return F.binary_cross_entropy_with_logits(
                scores.float(), targets.float(), reduction='none').mean(-1)
        return zmlce(scores, targets, self.valid)

    def mlm_loss(self, hidden, positions, labels):
        """HPT's auxiliary MLM loss, the head run only at the masked positions."""
        x = hidden.flatten(0, 1).index_select(0, positions)
        return F.cross_entropy(self.mlm.get_output_embeddings()(self.transform(x)).float(), labels)

    def forward(self, **batch):  # training_loss, Eqs. 2-7
        return training_loss(self, **batch)

    @torch.no_grad()
    def label_scores(self, input_ids, attention_mask, starts):
        """(B, V) scores; Sec. 3: a label is predicted at score > 0 (sigmoid > 0.5)."""
        hidden = self.encode(input_ids, attention_mask)
        scores = self.score(self.slots(hidden, starts))
        return scores.masked_fill(~self.valid, -math.inf).amax(1).float()  # each at its depth


def build_model(mlm, tokenizer, hierarchy, arch, max_length=512):
    """A fresh LHMix: label tokens start as their name's mean word-piece embedding, depth tokens
    random (Sec. 5.2), [P] as [MASK] (the authors' code), bert's classifier as HGCLR's."""
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
        if arch == 'bert':
            model.classifier.weight.normal_(0.0, mlm.config.initializer_range)
            model.classifier.bias.zero_()
    return model


def zmlce(scores, targets, valid=None):
    """Eq. 2 of each score vector (..., L) over its `valid` labels; `targets` and `valid`
    broadcast to `scores`. On CUDA, the fused kernel below."""
    if scores.is_cuda and triton is not None and scores.dtype != torch.float64:
        return FusedZMLCE.apply(scores, targets, valid)
    return plain_zmlce(scores, targets, valid)


def plain_zmlce(scores, targets, valid=None):
    """Each sum of Eq. 2, negatives' e^s and positives' e^-s, as a log-sum-exp with a zero for
    its 1, masked entries at -inf: finite at any size."""
    s = scores.to(torch.promote_types(scores.dtype, torch.float32))
    pos = targets.bool()
    x = torch.where(pos, -s, s)
    if valid is not None:
        x = x.masked_fill(~valid, -math.inf)
    zero = x.new_zeros(x.shape[:-1] + (1,))

    def log1p_sum_exp(mask):  # log(1 + sum e^x) where mask is False
        return torch.logsumexp(torch.cat([x.masked_fill(mask, -math.inf), zero], -1), -1)
    return log1p_sum_exp(pos) + log1p_sum_exp(~pos)  # Eq. 2; autograd gives Eq. 8


# Sec. 4: local hierarchies (Eq. 3), mixing ratio (Eq. 4), Mixup and loss mixing (Eqs. 5-7)

def local_hierarchy_ids(model, label_ids, name_ids):
    """Sec. 4.1: gold labels as `[CLS] [D1] <names at depth 1> [D2] ... [SEP]`."""
    ids = [model.special['cls']]
    for d, depth_id in enumerate(model.depth_ids, 1):
        ids += [depth_id]
        ids += [t for v in label_ids if model.hierarchy.depth[v] == d for t in name_ids[v]]
    return ids + [model.special['sep']]


@torch.no_grad()
def local_hierarchy_table(model, tokenizer, label_sets, batch_size=64):
    """(table (U, H) on the model's device, each set's index in it (N,) on the CPU): the [CLS] of
    each distinct local hierarchy, encoded once before training (the frozen encoder, Sec. 4.1)."""
    keys = [tuple(sorted(s)) for s in label_sets]
    distinct = sorted(set(keys))
    name_ids = model.name_ids(tokenizer)
    seqs = [local_hierarchy_ids(model, k, name_ids) for k in distinct]
    device, was_training = next(model.parameters()).device, model.training
    model.eval()
    out = []
    for i in range(0, len(seqs), batch_size):
        b = layout(seqs[i:i + batch_size], model.special['pad'], 1)
        ids, mask = b['input_ids'].to(device), b['attention_mask'].to(device)
        out.append(model.encode(ids, mask)[:, 0].float())
    model.train(was_training)
    index = {k: i for i, k in enumerate(distinct)}
    return torch.cat(out), torch.tensor([index[k] for k in keys])


def hierarchy_similarity(h_i, h_j):
    """Clamped to [0, 1]: s^alpha of a rounded s < 0 is NaN."""
    s = 0.5 * (F.cosine_similarity(h_i.float(), h_j.float(), dim=-1) + 1)  # Eq. 3
    return s.clamp(0.0, 1.0)


def mixup_ratio(s, alpha, beta):
    """Similar hierarchies mix more (lambda -> 0.5); alpha > 0, beta in (0.5, 1] (0.5, the
    authors' default: always 0.5)."""
    return -(beta - 0.5) * s ** alpha + beta  # Eq. 4


def pair_ratios(hier, partner, alpha, beta):
    """Each document's lambda from its local hierarchy `hier` (B, H) and its `partner`'s."""
    return mixup_ratio(hierarchy_similarity(hier, hier[partner]), alpha, beta)  # Eqs. 3-4


def mix_hidden(h_i, h_j, lam):
    """h~ = lambda h_i + (1 - lambda) h_j for h (B, slots, H), lambda (B,)."""
    lam = lam.float()[:, None, None]
    return torch.lerp(h_j.float(), h_i.float(), lam).to(h_i.dtype)  # Eq. 5, in fp32


def training_loss(model, input_ids, starts, targets, attention_mask=None, position_ids=None,
                  offsets=None, partner=None, lam=None, hierarchy_ids=None, mlm_pos=None,
                  mlm_labels=None):
    """(loss, lambda or None): summed over depths (the authors' code: over all labels), mean
    over documents, each mixed with its `partner` by `lam` (vanilla Mixup) or LH-Mix's ratio
    (`hierarchy_ids`); plus HPT's MLM term if any text is masked."""
    hidden = model.encode(input_ids, attention_mask, position_ids, offsets)
    h = model.slots(hidden, starts)
    if hierarchy_ids is not None:
        lam = pair_ratios(model.local_hierarchies[hierarchy_ids], partner, model.alpha,
                          model.beta)                                # Eqs. 3-4
    if partner is not None:
        h = mix_hidden(h, h[partner], lam)                           # Eq. 5
    p, t = model.score(h), targets[:, None, :]                       # Eq. 1 / Eq. 6: p~ = f(h~)
    if partner is None:
        loss = model.loss(p, t)                                      # Eq. 2
    else:  # each pair's own lambda, not a batch mean
        w = lam.float()[:, None]
        loss = w * model.loss(p, t) + (1 - w) * model.loss(p, t[partner])  # Eq. 7
    loss = loss.sum(-1).mean()
    if mlm_pos is not None:
        loss = loss + model.mlm_loss(hidden, mlm_pos, mlm_labels)
    return loss, lam


# Not in the paper: tokens, batches, scores, CUDA graphs

def tokenize(tokenizer, texts, max_text_len):
    """(word-pieces of each text cut to max_text_len, the number cut)."""
    texts = list(texts)  # a tokenizer refuses []
    ids = tokenizer(texts, add_special_tokens=False, verbose=False)['input_ids'] if texts else []
    return ([np.asarray(t[:max_text_len], dtype=np.int64) for t in ids],
            sum(len(t) > max_text_len for t in ids))


PACKED = 128  # a packed row's length is a multiple of it: few shapes, 1% padding on WOS


def layout(seqs, pad_id, multiple, pack=False):
    """Id lists as rows padded to a multiple of `multiple`: input_ids, attention_mask, starts
    (each one's first flat position). `pack`: one row, a multiple of PACKED long, position_ids,
    offsets: each list's start, the padding's (a document too), the end."""
    lengths = np.array([len(s) for s in seqs])
    if pack:
        ends = np.cumsum(lengths)
        T = (ends[-1] // PACKED + 1) * PACKED  # at least one padding token
        ids, pos = np.full((1, T), pad_id, dtype=np.int64), np.zeros((1, T), dtype=np.int64)
        ids[0, :ends[-1]] = np.concatenate(seqs)
        pos[0, :ends[-1]] = np.concatenate([np.arange(k) for k in lengths])
        offsets = np.concatenate([[0], ends, [T]])
        out = {'input_ids': ids, 'position_ids': pos, 'offsets': offsets, 'starts': offsets[:-2]}
    else:
        T = -(-lengths.max() // multiple) * multiple
        mask = np.arange(T) < lengths[:, None]
        ids = np.full(mask.shape, pad_id, dtype=np.int64)
        ids[mask] = np.concatenate(seqs)
        out = {'input_ids': ids, 'attention_mask': mask.astype(np.int64),
               'starts': np.arange(len(seqs)) * T}
    return {k: torch.from_numpy(v) for k, v in out.items()}


def document_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                       cu_seq_lens_q=None, max_length_q=None, **kwargs):
    """transformers' SDPA; in a packed row (cu_seq_lens_q: each document's start, the row's
    end), SDPA per document via a nested jagged tensor: no work across them."""
    if cu_seq_lens_q is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)

    def documents(x):  # (1, heads, T, d) -> (documents, heads, length, d), a view
        return torch.nested.nested_tensor_from_jagged(
            x[0].transpose(0, 1), cu_seq_lens_q, min_seqlen=1, max_seqlen=max_length_q
        ).transpose(1, 2)
    out = F.scaled_dot_product_attention(documents(query), documents(key), documents(value),
                                         dropout_p=dropout, scale=scaling)
    return out.transpose(1, 2).values()[None], None  # (1, T, heads, d), as transformers' own


if TRANSFORMERS_5:
    transformers.AttentionInterface.register('lhmix', document_attention)
    AttentionMaskInterface.register('lhmix', ALL_MASK_ATTENTION_FUNCTIONS['sdpa'])


def make_batch(model, token_ids, labels, multiple, rng=None, mlm_rate=0.0, static=False,
               pack=False):
    """`prefix text [SEP]` laid out, bool targets (B, V), with mlm_rate BERT's masking of text
    (80% [MASK], 10% another word-piece, 10% kept); on the CPU: no step syncs."""
    prefix = model.prefix
    seqs = [np.concatenate([prefix, t, [model.special['sep']]]) for t in token_ids]
    batch = layout(seqs, model.special['pad'], multiple, pack)
    batch['targets'] = torch.zeros(len(token_ids), len(model.hierarchy), dtype=torch.bool)
    for b, ls in enumerate(labels):
        batch['targets'][b, ls] = True
    if mlm_rate > 0:
        ids, starts = batch['input_ids'], batch['starts'].numpy()
        pos = torch.from_numpy(np.concatenate([starts[b] + len(prefix) + np.flatnonzero(
            rng.random(len(t)) < mlm_rate) for b, t in enumerate(token_ids)]))
        flat = ids.view(-1)
        gold = flat[pos].clone()
        r = torch.from_numpy(rng.random(len(pos)))
        flat[pos[r < 0.8]] = model.special['mask']
        rand = pos[(r >= 0.8) & (r < 0.9)]  # a word-piece of the batch's texts
        words = np.concatenate(token_ids)
        flat[rand] = torch.from_numpy(words[rng.integers(0, len(words), len(rand))])
        if len(pos):  # on the CPU: a batch with nothing masked has no MLM term
            if static:  # a count per shape (CUDA graphs), mean + 8 sd up to 64s, -100s filling
                n, q = ids.numel(), mlm_rate
                cap = int(-(-(q * n + 8 * math.sqrt(n * q * (1 - q)) + 1) // 64) * 64)
                cap *= -(-len(pos) // cap)
                pos = F.pad(pos, (0, cap - len(pos)))
                gold = F.pad(gold, (0, cap - len(gold)), value=-100)
            batch['mlm_pos'], batch['mlm_labels'] = pos, gold
    return batch


def to_device(batch, device):
    if device.type == 'cuda':  # from pinned memory: no sync
        return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
    return {k: v.to(device) for k, v in batch.items()}


def train_batches(lengths, batch_size, rng, mixing):
    """An epoch's (document ids, partner positions or None). Mixing: slices of a shuffle, partners
    the authors' randperm(B) (pi(i) == i: unmixed). Else, by length in chunks of 64 batches."""
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
    return 16 if device.type == 'cuda' else 8


def autocast(device):
    """bf16 autocast on GPUs that have it, else fp16; fp32 on CPU. No cast cache: CUDA graphs
    forbid it (a step casts each weight once anyway)."""
    cuda = device.type == 'cuda'
    dtype = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float16
    return torch.autocast(device.type, dtype, enabled=cuda, cache_enabled=False)


def cuda_graphs_unavailable(device):
    """Why CUDA graphs cannot run the steps on `device`, or None when they can."""
    if device.type != 'cuda':
        return 'not a CUDA device'
    if not torch.cuda.is_bf16_supported():
        return 'no bf16 on this GPU (fp16 needs a loss scaler that syncs)'
    if not TRANSFORMERS_5:  # 4.x checks the attention mask on the host
        return 'transformers 4 syncs inside the encoder (5 does not)'
    return None


class CUDAGraphs:
    """fn(**tensors) replayed from a CUDA graph captured, after warmup(**tensors), once per set
    of shapes. A replay overwrites the last one's outputs."""

    def __init__(self, fn, warmup):
        self.fn, self.warmup, self.graphs = fn, warmup, {}
        self.pool = torch.cuda.graph_pool_handle()

    def __call__(self, **inputs):
        key = tuple((k, tuple(v.shape), v.dtype) for k, v in inputs.items())
        if key not in self.graphs:
            static = {k: v.clone() for k, v in inputs.items()}
            side = torch.cuda.Stream()  # capture requires a run on a side stream first
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.warmup(**static)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = self.fn(**static)
            self.graphs[key] = graph, static, out
        graph, static, out = self.graphs[key]
        for k, v in inputs.items():
            static[k].copy_(v, non_blocking=True)
        graph.replay()
        return out


@torch.no_grad()
def score_documents(model, token_ids, batch_size=128):
    """(N, V) float32 label scores (> 0: predicted) in input order."""
    device = next(model.parameters()).device
    out = torch.zeros(len(token_ids), len(model.hierarchy), device=device)
    model.eval()
    order = np.argsort([len(t) for t in token_ids], kind='stable')
    for i in range(0, len(order), batch_size):
        idx = order[i:i + batch_size]
        b = to_device(make_batch(model, [token_ids[j] for j in idx], [[]] * len(idx),
                                 pad_multiple(device)), device)
        with autocast(device):
            scores = model.label_scores(b['input_ids'], b['attention_mask'], b['starts'])
        out[torch.from_numpy(idx).to(device)] = scores  # no host sync between batches
    return out.cpu().numpy()


# Not in the paper: ZMLCE in Triton for CUDA, forward (Eq. 2) and backward (Eq. 8)

if triton is not None:
    @triton.jit
    def _zmlce_kernel(S, T, VALID, LOSS, GRAD, L, BLOCK: tl.constexpr):
        """A score vector (BLOCK >= L): Eq. 2's log-sum-exps shifted by max(0, x), Eq. 8's
        gradient e^{s - lse_neg} for negatives, -e^{-s - lse_pos} for positives."""
        i, cols = tl.program_id(0).to(tl.int64), tl.arange(0, BLOCK)
        at, ok = i * L + cols, cols < L
        s = tl.load(S + at, mask=ok, other=0.0).to(tl.float32)
        pos = tl.load(T + at, mask=ok, other=0) != 0
        valid = tl.load(VALID + at, mask=ok, other=0) != 0
        x = tl.where(valid, tl.where(pos, -s, s), float('-inf'))
        x_pos, x_neg = tl.where(pos, x, float('-inf')), tl.where(pos, float('-inf'), x)
        m_pos, m_neg = tl.maximum(tl.max(x_pos, 0), 0.0), tl.maximum(tl.max(x_neg, 0), 0.0)
        lse_pos = m_pos + tl.log(tl.exp(-m_pos) + tl.sum(tl.exp(x_pos - m_pos), 0))
        lse_neg = m_neg + tl.log(tl.exp(-m_neg) + tl.sum(tl.exp(x_neg - m_neg), 0))
        tl.store(LOSS + i, lse_pos + lse_neg)  # Eq. 2
        grad = tl.exp(x - tl.where(pos, lse_pos, lse_neg))  # Eq. 8; 0 outside the valid labels
        tl.store(GRAD + at, tl.where(pos, -grad, grad), mask=ok)


def _flat(x, shape):
    """x broadcast to `shape` as a contiguous (N, L) matrix, bool as uint8 (Triton's)."""
    x = x.expand(shape).reshape(-1, shape[-1]).contiguous()
    return x.view(torch.uint8) if x.dtype == torch.bool else x


class FusedZMLCE(torch.autograd.Function):
    """zmlce() by the kernel above, a program per score vector; forward makes the gradient,
    backward scales it."""

    @staticmethod
    def forward(ctx, scores, targets, valid):
        shape, L = scores.shape, scores.shape[-1]
        if valid is None:
            valid = torch.ones((), dtype=torch.bool, device=scores.device)
        s, t, v = _flat(scores, shape), _flat(targets.bool(), shape), _flat(valid, shape)
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
