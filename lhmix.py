"""LH-Mix (Kong, Zhang & Wang, KDD 2025) in one module that imports nothing of this project, so
that it can be copied alone into another one.

It follows the paper: Sec. 3 (the label tree, the hierarchical prompt, the verbalizer of Eq. 1 and
ZMLCE, Eq. 2), then Sec. 4 (local hierarchies and their similarity, the mixing ratio, Mixup with
loss mixing: Eqs. 3-7). What is not LH-Mix comes last: Table 3's flat BERT baseline; feeding the
model (tokens, batches, Mixup partners, prediction); and ZMLCE fused into one Triton kernel
(Eqs. 2 and 8). What makes a GPU step fast (packed rows, CUDA graphs) is in speed.py, beside it.

The API, in that order (each name's docstring says more):

    Hierarchy(parents, names)     the label tree (Sec. 3.1); label ids are the order of `parents`
    template(num_depths, ...)     the hierarchical prompt, [CLS] [D1] [P] ... [SEP] (Sec. 3.2)
    LHMix(mlm, hierarchy, ...)    the prompt-tuned masked LM; model(**batch) -> (loss, lambda)
    build_model(mlm, tokenizer, hierarchy, arch)   a fresh ARCHS[arch], labels from their names
    zmlce(scores, targets, valid)                  Eq. 2, a multi-label loss
    local_hierarchy_ids, local_hierarchy_table, use_local_hierarchies   Sec. 4.1
    hierarchy_similarity, mixup_ratio, mix_hidden  Eqs. 3, 4 and 5
    vanilla_mixup_ratio(rng, a, n)                 Table 3's + Mixup: folded Beta(a, a) ratios
    training_loss(model, **batch)                  Eqs. 2-7, what model(**batch) computes
    FlatBERT, ARCHS               Table 3's flat BERT (HGCLR's); the models by `arch`
    tokenize, make_batch, mask_tokens, train_batches, to_device, autocast   feeding the model
    score_documents(model, token_ids)              every label's score (N, V); > 0: predicted
"""
import math
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # Without Triton, ZMLCE runs as plain torch operations everywhere.
    triton = None

__all__ = ['Hierarchy', 'template', 'LHMix', 'build_model', 'zmlce', 'local_hierarchy_ids',
           'local_hierarchy_table', 'use_local_hierarchies', 'hierarchy_similarity',
           'mixup_ratio', 'mix_hidden', 'vanilla_mixup_ratio', 'training_loss', 'FlatBERT',
           'ARCHS', 'tokenize', 'make_batch', 'mask_tokens', 'train_batches', 'to_device',
           'autocast', 'score_documents']


# Sec. 3: the label tree, the hierarchical prompt, the verbalizer (Eq. 1) and ZMLCE (Eq. 2)

class Hierarchy:
    """A label tree from {label: parent}, where a parent of None or 'Root' puts a label at depth
    1. Label ids follow the order of `parents`. A label's name, which the verbalizer starts from,
    is `names[label]` or else the label after its last '/', underscores as spaces. `lines` maps a
    label to where it was read, so that an error can name the user's file and line."""

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
            while j >= 0 and d <= n:  # A chain longer than the number of labels is a cycle.
                d, j = d + 1, self.parent[j]
            if d > n:
                raise ValueError(f'{where[i]}: cycle through label {v!r}')
            self.depth.append(d)
        self.num_depths = max(self.depth)
        self.by_depth = [[i for i, d in enumerate(self.depth) if d == k]
                         for k in range(1, self.num_depths + 1)]
        self.names = [(names or {}).get(v, v.rsplit('/', 1)[-1]).replace('_', ' ')
                      for v in self.labels]

    def __len__(self):
        return len(self.labels)

    def path(self, v):
        """Label v's ancestors and v itself, the root's child first."""
        return self.path(self.parent[v]) + [v] if v >= 0 else []

    def closure(self, label_ids):
        """The sorted label set with every ancestor of its labels added: a gold label's ancestors
        are gold too, as the paths of Sec. 3.1 make them."""
        label_ids = list(label_ids)
        for v in label_ids:
            if not isinstance(v, (int, np.integer)):
                raise TypeError(f'label {v!r}: give label ids, not names (hierarchy.index[name])')
            if not 0 <= v < len(self):
                raise ValueError(f'label id {v}: give ids 0 to {len(self) - 1}, the tree\'s labels')
        return sorted({a for v in label_ids for a in self.path(v)})


def template(num_depths, cls_id, sep_id, depth_ids, slot_id):
    """The hierarchical prompt of Sec. 3.2, `[CLS] [D1] [P] ... [DD] [P] [SEP]`, which the text
    and a closing [SEP] follow; depth d's slot [P] is at position 2d."""
    return [cls_id] + [t for d in range(num_depths) for t in (depth_ids[d], slot_id)] + [sep_id]


class Classifier(nn.Module):
    """What LHMix and Table 3's FlatBERT share: a BERT-style masked LM's encoder reads `prefix`,
    the text and [SEP], and its states at the prefix's slots score the labels, depth d's slot
    those where row d of `valid` is set. A subclass makes the prefix and its head (make_head),
    scores (score) and loss (loss); `arch` names it in checkpoints, `mlm_term` says whether it
    trains with HPT's MLM term too, `depth_ids` are what separate the depths of a local
    hierarchy (Sec. 4.1)."""

    def __init__(self, mlm, hierarchy, base_vocab, special, max_length=512):
        super().__init__()
        self.mlm, self.hierarchy, self.base_vocab = mlm, hierarchy, base_vocab
        self.special, self.max_length = special, max_length  # special: cls, sep, pad, mask ids
        self.prefix, valid = self.make_head()
        self.register_buffer('valid', valid, persistent=False)
        slots = [i for i, t in enumerate(self.prefix) if t == self.slot_id]
        self.register_buffer('slot_offsets', torch.tensor(slots), persistent=False)
        positions = mlm.config.max_position_embeddings
        if not 0 < self.text_budget(max_length) or max_length > positions:
            raise ValueError(f'max_length {max_length} leaves {self.text_budget(max_length)} text '
                             f'tokens (at most {positions} positions): give a max_length from '
                             f'{len(self.prefix) + 2} to {positions}')
        # LH-Mix's table of encoded local hierarchies (Sec. 4.1), set by use_local_hierarchies().
        self.register_buffer('local_hierarchies', None, persistent=False)
        self.alpha = self.beta = None

    def name_ids(self, tokenizer):
        """Each label name's word-pieces; a name that has none is [UNK]."""
        return [tokenizer(name, add_special_tokens=False)['input_ids']
                or [tokenizer.unk_token_id] for name in self.hierarchy.names]

    def text_budget(self, max_length):
        """How many text word-pieces fit beside the prefix and the closing [SEP]."""
        return max_length - len(self.prefix) - 1

    def encode(self, input_ids, attention_mask=None, **packed):
        """The last hidden states. `packed`: a packed row's encoder inputs (speed.py)."""
        return self.mlm.base_model(input_ids, attention_mask, **packed).last_hidden_state

    def slots(self, hidden, starts):
        """The slots' hidden states (B, slots, H), Eq. 1's h^d. `hidden` (rows, T, H) is read as
        one flat sequence of rows * T positions, and `starts` holds each document's first flat
        position: b * T when a row holds one document, its offset when a packed row holds them
        all. The slots follow at `slot_offsets` from there."""
        return hidden.flatten(0, 1)[starts[:, None] + self.slot_offsets]  # Eqs. 1 and 5: h^d

    def forward(self, **batch):
        """training_loss(self, **batch): Eqs. 2-7."""
        return training_loss(self, **batch)

    @torch.no_grad()
    def label_scores(self, input_ids, attention_mask, starts):
        """Each document's label scores (B, V), each label scored at its own depth's slot. A
        label is predicted when its score is above 0 (Sec. 3)."""
        hidden = self.encode(input_ids, attention_mask)
        scores = self.score(self.slots(hidden, starts))
        return scores.masked_fill(~self.valid, -math.inf).amax(1).float()  # Eq. 1: p^d over V^d


class LHMix(Classifier):
    """A BERT-style masked LM prompted with the label tree (Sec. 3.2). Its vocabulary gains a
    token per label (their embeddings are the verbalizer), a token [Dd] per depth and the slot
    token [P], with ids base_vocab + [labels | depths | slot]."""
    arch, mlm_term = 'prompt', True

    def make_head(self):
        """Return the prompt and `valid`, and grow the vocabulary by the new tokens. Row d of
        `valid` marks the labels that depth d's slot [P] scores: those of depth d (Eq. 1)."""
        h, D, mlm = self.hierarchy, self.hierarchy.num_depths, self.mlm
        self.depth_ids = [self.base_vocab + len(h) + d for d in range(D)]
        self.slot_id = self.base_vocab + len(h) + D
        if not hasattr(mlm, 'cls'):
            raise ValueError(f'{type(mlm).__name__}: not a BERT-style masked LM (cls.predictions)')
        if mlm.get_input_embeddings().num_embeddings != self.slot_id + 1:
            # The new rows are left for initialize() to set, not averaged.
            mlm.resize_token_embeddings(self.slot_id + 1, mean_resizing=False)
        # The MLM head's transform (dense, activation, LayerNorm) is the classifier of Eq. 1's
        # f^d, and the label tokens' embeddings are its verbalizer.
        self.transform = mlm.cls.predictions.transform  # Eq. 1: f^d's classifier
        self.label_bias = nn.Parameter(torch.zeros(len(h)))
        prefix = template(D, self.special['cls'], self.special['sep'], self.depth_ids, self.slot_id)
        valid = torch.arange(1, D + 1)[:, None] == torch.tensor(h.depth)  # Eq. 1: V^d
        return prefix, valid

    @torch.no_grad()
    def initialize(self, tokenizer):
        """Starts the new tokens: each label token as the mean embedding of its name's
        word-pieces, the depth tokens random (Sec. 5.2), [P] as [MASK] (the authors' code)."""
        emb = self.mlm.get_input_embeddings().weight
        for v, ids in enumerate(self.name_ids(tokenizer)):
            emb[self.base_vocab + v] = emb[ids].mean(0)
        for d in self.depth_ids:
            emb[d].normal_(0.0, self.mlm.config.initializer_range)
        emb[self.slot_id] = emb[self.special['mask']]

    def label_embeddings(self):
        """The verbalizer: the label tokens' rows of the input embeddings (V, H)."""
        b = self.base_vocab
        return self.mlm.get_input_embeddings().weight[b:b + len(self.hierarchy)]

    def score(self, slot_hidden):
        """Eq. 1's scores p^d (B, slots, V); only the `valid` labels of each slot mean anything."""
        verbalizer = self.label_embeddings().t()  # Eqs. 1 and 6
        return self.transform(slot_hidden) @ verbalizer + self.label_bias  # Eqs. 1 and 6

    def loss(self, scores, targets):
        """The loss of each document and slot (B, slots): Eq. 2 over each depth's labels."""
        return zmlce(scores, targets, self.valid)  # Eq. 2, over V^d

    def mlm_loss(self, hidden, positions, labels):
        """HPT's auxiliary MLM loss. The head runs at the masked positions only: its projection
        onto the whole vocabulary at every position would cost more than an encoder layer."""
        x = hidden.flatten(0, 1).index_select(0, positions)
        return F.cross_entropy(self.mlm.get_output_embeddings()(self.transform(x)).float(), labels)


def build_model(mlm, tokenizer, hierarchy, arch, max_length=512):
    """A fresh LHMix (arch 'prompt') or FlatBERT ('bert'), started by its `initialize`. Warns, in
    one line, of the labels whose names give no word-piece but [UNK], and why."""
    special = {'cls': tokenizer.cls_token_id, 'sep': tokenizer.sep_token_id,
               'pad': tokenizer.pad_token_id, 'mask': tokenizer.mask_token_id}
    model = ARCHS[arch](mlm, hierarchy, len(tokenizer), special, max_length)
    pieces = [tokenizer(name, add_special_tokens=False)['input_ids'] for name in hierarchy.names]
    unk = tokenizer.unk_token_id
    empty = [v for v, p in zip(hierarchy.labels, pieces) if not p]
    unknown = [v for v, p in zip(hierarchy.labels, pieces) if p and set(p) == {unk}]
    if empty or unknown:  # Each cause with its fix, for train.py's user and the API's.
        warnings.warn('; '.join(filter(None, [
            empty and f'labels {empty}: their names hold no word (rename them: train.py reads '
            'label_names.tsv in the data folder, the API Hierarchy(parents, names))',
            unknown and f"labels {unknown}: the tokenizer's vocabulary has none of their names' "
            'words, only [UNK] (take a model whose vocabulary has them, train.py --model, or '
            'rename them)'])) + ': so they start alike, and are alike in local hierarchies')
    model.initialize(tokenizer)
    return model


def zmlce(scores, targets, valid=None):
    """Eq. 2 of each score vector (..., L) over its `valid` labels; `targets` and `valid`
    broadcast to `scores`. On a GPU, the fused Triton kernel at the end of this module."""
    if scores.is_cuda and triton is not None and scores.dtype != torch.float64:
        return FusedZMLCE.apply(scores, targets, valid)
    return plain_zmlce(scores, targets, valid)


def plain_zmlce(scores, targets, valid=None):
    """Eq. 2 in torch operations. Each of its sums is a log-sum-exp with a zero for its 1, and the
    labels outside `valid` enter as -inf, so that the loss stays finite at any score."""
    s = scores.to(torch.promote_types(scores.dtype, torch.float32))
    pos = targets.bool()  # Eq. 2: V_pos; V_neg is the rest
    x = torch.where(pos, -s, s)  # Eq. 2
    if valid is not None:
        x = x.masked_fill(~valid, -math.inf)
    zero = x.new_zeros(x.shape[:-1] + (1,))
    negatives = torch.logsumexp(torch.cat([x.masked_fill(pos, -math.inf), zero], -1), -1)
    positives = torch.logsumexp(torch.cat([x.masked_fill(~pos, -math.inf), zero], -1), -1)
    return negatives + positives  # Eq. 2 (autograd gives its gradient)


# Sec. 4: local hierarchies (Sec. 4.1, Eq. 3), the mixing ratio (Eq. 4), Mixup (Eqs. 5-7)

def local_hierarchy_ids(model, label_ids, name_ids):
    """Sec. 4.1: a gold label set as the sequence `[CLS] [D1] <names at depth 1> [D2] ... [SEP]`,
    the names of one depth in the order of their label ids. The flat BERT has no depth tokens:
    there the depths' names follow one another."""
    ids = [model.special['cls']]
    for d in range(1, model.hierarchy.num_depths + 1):
        ids += model.depth_ids[d - 1:d]  # [Dd]
        ids += [t for v in label_ids if model.hierarchy.depth[v] == d for t in name_ids[v]]
    return ids + [model.special['sep']]


@torch.no_grad()
def local_hierarchy_table(model, tokenizer, label_sets, batch_size=64):
    """Return (table, ids): the [CLS] state (U, H), on the model's device, of each distinct local
    hierarchy, and each label set's row in it (N,), on the CPU. Call it before training: the
    encoder that computes similarities stays as it was (Sec. 4.1). Each set is closed upward
    first (Hierarchy.closure), as a local hierarchy holds whole paths."""
    keys = [tuple(model.hierarchy.closure(s)) for s in label_sets]
    distinct = sorted(set(keys))
    name_ids = model.name_ids(tokenizer)
    seqs = [local_hierarchy_ids(model, k, name_ids) for k in distinct]
    device, was_training = next(model.parameters()).device, model.training
    model.eval()
    out = []
    for i in range(0, len(seqs), batch_size):
        b = pad_rows(seqs[i:i + batch_size], model.special['pad'], 1)
        ids, mask = b['input_ids'].to(device), b['attention_mask'].to(device)
        out.append(model.encode(ids, mask)[:, 0].float())  # Eq. 3's h_[CLS]
    model.train(was_training)
    index = {k: i for i, k in enumerate(distinct)}
    return torch.cat(out), torch.tensor([index[k] for k in keys])


def use_local_hierarchies(model, table, alpha, beta):
    """Makes `model` mix by LH-Mix: a batch's `hierarchy_ids` index `table`, from
    local_hierarchy_table (moved to the model's device here), and Eqs. 3-4 with alpha and beta
    give each pair's ratio."""
    model.local_hierarchies = table.to(next(model.parameters()).device)
    model.alpha, model.beta = alpha, beta


def hierarchy_similarity(h_i, h_j):
    """Eq. 3's s of two local hierarchies' [CLS] states, clamped to [0, 1], because rounding can
    put s a little below 0, where Eq. 4's s^alpha is NaN."""
    s = 0.5 * (F.cosine_similarity(h_i.float(), h_j.float(), dim=-1) + 1)  # Eq. 3
    return s.clamp(0.0, 1.0)  # Eq. 3's s, kept in [0, 1]


def mixup_ratio(s, alpha, beta):
    """Eq. 4: similar local hierarchies mix more (lambda near 0.5), dissimilar ones less (near
    beta). alpha > 0 and beta in (0.5, 1]; beta 0.5, the authors' default, gives 0.5 always."""
    return -(beta - 0.5) * s ** alpha + beta  # Eq. 4


def vanilla_mixup_ratio(rng, a, n):
    """Table 3's + Mixup: n ratios from Beta(a, a), one per document (Zhang et al.'s Mixup draws
    one per batch), each folded to max(lambda, 1 - lambda) as the authors' code folds its draw, so
    that it lies in [0.5, 1] with Eq. 4's lambda. `rng` is a numpy Generator."""
    lam = rng.beta(a, a, n)
    return torch.from_numpy(np.maximum(lam, 1 - lam)).float()


def pair_ratios(hier, partner, alpha, beta):
    """Each document's lambda, from its local hierarchy's state `hier` (B, H) and its partner's."""
    return mixup_ratio(hierarchy_similarity(hier, hier[partner]), alpha, beta)  # Eqs. 3 and 4


def mix_hidden(h_i, h_j, lam):
    """Eq. 5 for slot states h (B, slots, H) and ratios lambda (B,), in float32 so that a bf16
    state does not round the ratio."""
    lam = lam.float()[:, None, None]
    return torch.lerp(h_j.float(), h_i.float(), lam).to(h_i.dtype)  # Eq. 5


def check_mixup(model, n, partner, lam, hierarchy_ids):
    """Refuses, in one line naming the fix, a Mixup that training_loss cannot run for n
    documents."""
    if (lam is not None) + (hierarchy_ids is not None) != (partner is not None):
        raise ValueError('Mixup takes `partner` and one ratio: give it either `lam` (vanilla '
                         'Mixup) or `hierarchy_ids` (LH-Mix)')
    if lam is not None and not torch.is_tensor(lam):
        raise TypeError(f'lam {lam!r}: give a tensor, one ratio per document')
    for name, x in (('partner', partner), ('lam', lam), ('hierarchy_ids', hierarchy_ids)):
        if x is not None and tuple(x.shape) != (n,):
            raise ValueError(f'{name} of shape {tuple(x.shape)} for {n} documents: give one '
                             'per document, a tensor of shape (B,)')
    # On a GPU the check would wait for the GPU.
    if lam is not None and not lam.is_cuda and not ((lam >= 0) & (lam <= 1)).all():
        raise ValueError(f'lam {lam.tolist()}: give ratios in [0, 1]')
    if hierarchy_ids is not None and model.local_hierarchies is None:
        raise ValueError('hierarchy_ids needs the local hierarchies: call '
                         'lhmix.use_local_hierarchies(model, table, alpha, beta) first')


def training_loss(model, input_ids, starts, targets, attention_mask=None, partner=None, lam=None,
                  hierarchy_ids=None, mlm_pos=None, mlm_labels=None, **packed):
    """Return (loss, lambda or None) of a batch from make_batch. Each document mixes with the one
    at `partner` by the ratio `lam` (vanilla Mixup), a tensor (B,) of ratios in [0, 1], or by
    LH-Mix's ratio from its local hierarchy, `hierarchy_ids`. The loss is summed over the depths
    (the paper does not say how they combine; the authors' code takes one ZMLCE over all labels)
    and averaged over the documents, plus HPT's MLM term when any text is masked. `packed`: a
    packed row's encoder inputs (speed.py)."""
    check_mixup(model, len(starts), partner, lam, hierarchy_ids)
    hidden = model.encode(input_ids, attention_mask, **packed)
    h, t = model.slots(hidden, starts), targets[:, None, :]  # Eqs. 1 and 5: h^d
    if partner is None:
        loss = model.loss(model.score(h), t)  # Eq. 2
    else:
        if hierarchy_ids is not None:
            lam = pair_ratios(model.local_hierarchies[hierarchy_ids], partner, model.alpha,
                              model.beta)  # Eqs. 3 and 4
        h = mix_hidden(h, h[partner], lam)  # Eq. 5
        p = model.score(h)  # Eq. 6: the mixed states scored
        # Each pair by its own lambda, not by the batch's mean lambda as the authors' code.
        w = lam.float()[:, None]  # Eq. 7's lambda
        loss = w * model.loss(p, t) + (1 - w) * model.loss(p, t[partner])  # Eq. 7
    loss = loss.sum(-1).mean()  # Eqs. 2 and 7, summed over the depths
    if mlm_pos is not None:
        loss = loss + model.mlm_loss(hidden, mlm_pos, mlm_labels)
    return loss, lam


# Not LH-Mix: Table 3's flat BERT, HGCLR's baseline

class FlatBERT(Classifier):
    """Table 3's flat BERT, HGCLR's: the text alone after [CLS], whose state dropout and a linear
    layer map to every label's score, and binary cross-entropy. It adds no token to the
    vocabulary and trains without HPT's MLM term. Mixup mixes the [CLS] states (Eqs. 5-7 with
    this score and loss; the paper does not say which states its rows mix)."""
    arch, mlm_term, depth_ids = 'bert', False, ()

    def make_head(self):
        """Return ([CLS], every label valid at its one slot), and make HGCLR's classifier."""
        self.slot_id = self.special['cls']
        self.dropout = nn.Dropout(self.mlm.config.hidden_dropout_prob)
        self.classifier = nn.Linear(self.mlm.config.hidden_size, len(self.hierarchy))
        return [self.slot_id], torch.ones(1, len(self.hierarchy), dtype=torch.bool)

    @torch.no_grad()
    def initialize(self, tokenizer):
        """The classifier as HGCLR starts it: normal(0, initializer_range), bias 0."""
        self.classifier.weight.normal_(0.0, self.mlm.config.initializer_range)
        self.classifier.bias.zero_()

    def score(self, slot_hidden):
        """Every label's score (B, 1, V) from the [CLS] state."""
        return self.classifier(self.dropout(slot_hidden))

    def loss(self, scores, targets):
        """HGCLR's binary cross-entropy of each document (B, 1), a mean over the labels."""
        return F.binary_cross_entropy_with_logits(
            scores.float(), targets.float(), reduction='none').mean(-1)


ARCHS = {m.arch: m for m in (LHMix, FlatBERT)}  # build_model's `arch`; runs.py's checkpoints


# Not in the paper: tokens, batches and prediction

def tokenize(tokenizer, texts, max_text_len):
    """Return (each text's word-pieces, its first max_text_len kept; how many texts were cut)."""
    texts = list(texts)  # A tokenizer refuses an empty list, so none is passed to it.
    ids = tokenizer(texts, add_special_tokens=False, verbose=False)['input_ids'] if texts else []
    return ([np.asarray(t[:max_text_len], dtype=np.int64) for t in ids],
            sum(len(t) > max_text_len for t in ids))


def pad_rows(seqs, pad_id, multiple):
    """Id lists laid out a row each, padded to a multiple of `multiple`: input_ids,
    attention_mask, and `starts`, each list's first flat position."""
    lengths = np.array([len(s) for s in seqs])
    T = -(-lengths.max() // multiple) * multiple
    mask = np.arange(T) < lengths[:, None]
    ids = np.full(mask.shape, pad_id, dtype=np.int64)
    ids[mask] = np.concatenate(seqs)
    return {'input_ids': torch.from_numpy(ids),
            'attention_mask': torch.from_numpy(mask.astype(np.int64)),
            'starts': torch.arange(len(seqs)) * T}


def make_batch(model, token_ids, labels, rng=None, mlm_rate=0.0, layout=pad_rows):
    """`prefix text [SEP]` for each document, laid out by `layout` (pad_rows, or speed.py's
    packed row) to a multiple of 16 on a GPU (tensor cores), 8 on a CPU, and `targets` (B, V):
    each label set closed upward (Hierarchy.closure), so leaves alone will do. With mlm_rate, the
    text is masked for HPT's MLM term (mask_tokens, drawing from `rng`). Everything is made on
    the CPU: no step syncs."""
    if len(labels) != len(token_ids):
        raise ValueError(f'{len(token_ids)} texts, {len(labels)} label lists: give one per text')
    if mlm_rate > 0 and rng is None:
        raise ValueError('mlm_rate > 0 draws masks: give rng=numpy.random.default_rng(seed)')
    multiple = 16 if next(model.parameters()).is_cuda else 8
    seqs = [np.concatenate([model.prefix, t, [model.special['sep']]]) for t in token_ids]
    batch = layout(seqs, model.special['pad'], multiple)
    batch['targets'] = torch.zeros(len(token_ids), len(model.hierarchy), dtype=torch.bool)
    for b, ls in enumerate(labels):
        batch['targets'][b, model.hierarchy.closure(ls)] = True
    if mlm_rate > 0:
        texts = batch['starts'].numpy() + len(model.prefix)
        pos, gold = mask_tokens(batch['input_ids'], texts, token_ids, rng, mlm_rate,
                                model.special['mask'])
        if len(pos):  # A batch with nothing masked has no MLM term.
            batch['mlm_pos'], batch['mlm_labels'] = pos, gold
    return batch
def mask_tokens(input_ids, text_starts, token_ids, rng, rate, mask_id):
    """BERT's masking, which HPT's MLM term trains on, done in place on `input_ids`: each text
    word-piece (the texts `token_ids` begin at the flat positions `text_starts`) is chosen with
    probability `rate`; of those, 80% become [MASK], 10% another word-piece of the batch's texts,
    10% stay. Returns the chosen flat positions and their original ids."""
    pos = torch.from_numpy(np.concatenate([start + np.flatnonzero(rng.random(len(t)) < rate)
                                           for start, t in zip(text_starts, token_ids)]))
    flat = input_ids.view(-1)
    gold = flat[pos].clone()
    r = torch.from_numpy(rng.random(len(pos)))
    flat[pos[r < 0.8]] = mask_id
    rand = pos[(r >= 0.8) & (r < 0.9)]
    words = np.concatenate(token_ids)
    flat[rand] = torch.from_numpy(words[rng.integers(0, len(words), len(rand))])
    return pos, gold


def to_device(batch, device):
    """The batch on `device`; to a GPU through pinned memory, which copies without a host sync."""
    if device.type == 'cuda':
        return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
    return {k: v.to(device) for k, v in batch.items()}


def train_batches(lengths, batch_size, rng, mixing):
    """An epoch's batches: (document ids, partner positions or None). While mixing, slices of a
    shuffle, and the partners are the authors' randperm(B), so pi(i) == i leaves a document
    unmixed. Otherwise batches of similar lengths, from chunks of 64 batches, pad less."""
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


def autocast(device):
    """bf16 autocast on a GPU that has it, else fp16; none (fp32) on a CPU. The cast cache is off
    because CUDA graphs forbid it, and a step casts each weight once anyway."""
    cuda = device.type == 'cuda'
    dtype = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float16
    return torch.autocast(device.type, dtype, enabled=cuda, cache_enabled=False)


@torch.no_grad()
def score_documents(model, token_ids, batch_size=128):
    """Return every label's score for each document given as word-pieces: a numpy float32 array
    (N, V), in input order, each label scored at its own depth's slot; a label is predicted where
    its score is above 0. The model scores in eval mode (no dropout) and is left in its mode."""
    device, was_training = next(model.parameters()).device, model.training
    out = torch.zeros(len(token_ids), len(model.hierarchy), device=device)
    model.eval()
    order = np.argsort([len(t) for t in token_ids], kind='stable')  # Similar lengths pad less.
    for i in range(0, len(order), batch_size):
        idx = order[i:i + batch_size]
        b = to_device(make_batch(model, [token_ids[j] for j in idx], [[]] * len(idx)), device)
        with autocast(device):
            scores = model.label_scores(b['input_ids'], b['attention_mask'], b['starts'])
        out[torch.from_numpy(idx).to(device)] = scores  # Written on the GPU: no sync a batch.
    model.train(was_training)
    return out.cpu().numpy()


# Not in the paper: ZMLCE fused in Triton, its forward (Eq. 2) and gradient (Eq. 8) in one pass

if triton is not None:
    @triton.jit
    def _zmlce_kernel(S, T, VALID, LOSS, GRAD, L, BLOCK: tl.constexpr):
        """One score vector (BLOCK >= L). Eq. 2's log-sum-exps are shifted by max(0, x) so that
        no exponential overflows; the gradient is e^(s - lse_neg) for a negative label and
        -e^(-s - lse_pos) for a positive one."""
        i, cols = tl.program_id(0).to(tl.int64), tl.arange(0, BLOCK)
        at, ok = i * L + cols, cols < L
        s = tl.load(S + at, mask=ok, other=0.0).to(tl.float32)
        pos = tl.load(T + at, mask=ok, other=0) != 0
        valid = tl.load(VALID + at, mask=ok, other=0) != 0
        x = tl.where(valid, tl.where(pos, -s, s), float('-inf'))  # Eq. 2
        x_pos, x_neg = tl.where(pos, x, float('-inf')), tl.where(pos, float('-inf'), x)
        m_pos, m_neg = tl.maximum(tl.max(x_pos, 0), 0.0), tl.maximum(tl.max(x_neg, 0), 0.0)
        lse_pos = m_pos + tl.log(tl.exp(-m_pos) + tl.sum(tl.exp(x_pos - m_pos), 0))
        lse_neg = m_neg + tl.log(tl.exp(-m_neg) + tl.sum(tl.exp(x_neg - m_neg), 0))
        tl.store(LOSS + i, lse_pos + lse_neg)  # Eq. 2
        grad = tl.exp(x - tl.where(pos, lse_pos, lse_neg))  # Eq. 8; 0 outside the valid labels
        tl.store(GRAD + at, tl.where(pos, -grad, grad), mask=ok)  # Eq. 8: - for a positive label


def _flat(x, shape):
    """x broadcast to `shape` as a contiguous (N, L) matrix; bool as uint8, which Triton loads."""
    x = x.expand(shape).reshape(-1, shape[-1]).contiguous()
    return x.view(torch.uint8) if x.dtype == torch.bool else x


class FusedZMLCE(torch.autograd.Function):
    """zmlce() by the kernel above, one program per score vector. The forward pass computes the
    gradient too, which is cheap beside the loss; the backward pass only scales it."""

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
        return (grad * g.unsqueeze(-1)).to(ctx.dtype), None, None  # Eq. 8: g holds lambda
