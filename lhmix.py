"""LH-Mix (Kong, Zhang & Wang, KDD 2025) in one module that imports nothing of this project, to
be copied alone. Sec. 3, then Sec. 4 (Eqs. 1-7), then what is not LH-Mix: Table 3's flat BERT,
feeding the model, ZMLCE fused in Triton (Eqs. 2, 8). speed.py, beside it, makes GPU steps fast.

The API (__all__), in order: Hierarchy (the label tree, Sec. 3.1); template (the prompt, Sec. 3.2);
FAMILIES (the masked LMs it takes); Classifier, LHMix (the prompt-tuned masked LM: model(**batch)
-> (loss, lambda)), build_model; zmlce, plain_zmlce, FusedZMLCE (Eq. 2); local_hierarchy_ids,
local_hierarchy_table, use_local_hierarchies (Sec. 4.1); hierarchy_similarity, mixup_ratio,
mix_hidden (Eqs. 3-5); vanilla_mixup_ratio (Table 3's + Mixup); training_loss (Eqs. 2-7);
FlatBERT, ARCHS (Table 3's flat BERT; the models by `arch`); load_pretrained, tiny_bert (the
masked LM a run starts from); tokenize, pad_rows, make_batch, mask_tokens, autocast (to feed the
model); score_documents (every label's score, (N, V): > 0 is predicted).
"""
import math
import os
import re
import sys
import tempfile
import warnings
from collections import Counter

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:  # Without Triton, ZMLCE runs as plain torch operations everywhere.
    triton = None

__all__ = ['Hierarchy', 'template', 'FAMILIES', 'Classifier', 'LHMix', 'build_model', 'zmlce',
           'plain_zmlce', 'FusedZMLCE', 'local_hierarchy_ids', 'local_hierarchy_table',
           'use_local_hierarchies', 'hierarchy_similarity', 'mixup_ratio', 'mix_hidden',
           'vanilla_mixup_ratio', 'training_loss', 'FlatBERT', 'ARCHS', 'load_pretrained',
           'tiny_bert', 'tokenize', 'pad_rows', 'make_batch', 'mask_tokens', 'autocast',
           'score_documents']

# Sec. 3: the label tree, the hierarchical prompt, the verbalizer (Eq. 1) and ZMLCE (Eq. 2)

class Hierarchy:
    """A label tree from {label: parent} (None or 'Root': depth 1), ids in the order of `parents`;
    names (the verbalizer's start): `names`, else after the last '/', _ as spaces. `lines`: the
    place each label was read, for errors."""

    def __init__(self, parents, names=None, lines=None):
        self.labels, n = list(parents), len(parents)
        self.index = {v: i for i, v in enumerate(parents)}
        where = {v: (lines or {}).get(v, f'label {v!r}') for v in parents}
        for v, p in parents.items():
            if p not in (None, 'Root') and p not in self.index:
                raise ValueError(f'{where[v]}: parent {p!r} of {v!r} refers to nothing')
        self.parent = [-1 if p in (None, 'Root') else self.index[p] for p in parents.values()]
        self.depth = []
        for v, j in zip(self.labels, self.parent):
            d = 1
            while j >= 0 and d <= n:  # A chain longer than the number of labels is a cycle.
                d, j = d + 1, self.parent[j]
            if d > n:
                raise ValueError(f'{where[v]}: cycle through label {v!r}')
            self.depth.append(d)
        self.num_depths = max(self.depth)
        self.by_depth = [[i for i, d in enumerate(self.depth) if d == k]
                         for k in range(1, self.num_depths + 1)]
        self.names = [(names or {}).get(v, v.rsplit('/', 1)[-1]).replace('_', ' ') for v in parents]

    def __len__(self):
        return len(self.labels)

    def path(self, v):
        """Label v's ancestors and v itself, the root's child first."""
        return self.path(self.parent[v]) + [v] if v >= 0 else []

    def closure(self, label_ids):
        """The sorted label set with its labels' ancestors, gold too on Sec. 3.1's paths."""
        closed = set()
        for v in label_ids:
            if not isinstance(v, (int, np.integer)):
                raise TypeError(f'label {v!r}: give label ids, not names (hierarchy.index[name])')
            if not 0 <= v < len(self):
                raise ValueError(f'label id {v}: give ids 0 to {len(self) - 1}')
            closed.update(self.path(v))
        return sorted(closed)


def template(num_depths, cls_id, sep_id, depth_ids, slot_id):
    """Sec. 3.2's prompt, `[CLS] [D1] [P] ... [DD] [P] [SEP]` (depth d's slot [P] at 2d)."""
    return [cls_id] + [t for d in range(num_depths) for t in (depth_ids[d], slot_id)] + [sep_id]


# The masked LMs (AutoModelForMaskedLM) that Classifier takes, by config.model_type: the MLM head's
# modules before its decoder (Eq. 1's f^d: names in the model, or a module for a function that
# the head calls), the config's dropout (the flat BERT's), whether positions count from the
# padding id + 1 (RoBERTa's), and why packed rows (speed.py) do not fit it, if they do not. Each
# gives what BERT gives: base_model(input_ids, attention_mask, position_ids=...)'s
# last_hidden_state, a decoder (get_output_embeddings) tied to the input embeddings, and a config
# with initializer_range, hidden_size, max_position_embeddings and pad_token_id.
BERT = (('cls.predictions.transform',), 'hidden_dropout_prob', False, None)
ROBERTA = (('lm_head.dense', nn.GELU(), 'lm_head.layer_norm'), 'hidden_dropout_prob', True, None)
FAMILIES = {'bert': BERT, 'roberta': ROBERTA, 'xlm-roberta': ROBERTA, 'camembert': ROBERTA,
            'deberta-v2': BERT[:3] + ("its attention is its own, not transformers' interface",),
            'modernbert': (('head',), 'classifier_dropout', False,
                           'some of its layers attend within a window, which packing ignores'),
            'distilbert': (('vocab_transform', 'activation', 'vocab_layer_norm'), 'dropout',
                           False, None)}


def _family(config):
    """FAMILIES' row of a masked LM's config; another kind is refused, in one line."""
    if config.model_type not in FAMILIES or not getattr(config, 'legacy', True):
        raise ValueError(f'a {config.model_type!r} model: LH-Mix takes a masked LM of '
                         f'{", ".join(FAMILIES)} (DeBERTa with its legacy head, the default)')
    return FAMILIES[config.model_type]


class Classifier(nn.Module):
    """LHMix's and FlatBERT's frame: the encoder, a masked LM of FAMILIES, reads `prefix text
    [SEP]`; slot d's state scores row d of `valid`. A subclass gives make_head, score, loss,
    `arch` (its checkpoints' name), `mlm_term` (trained with HPT's MLM term) and `depth_ids`
    (local hierarchies' depth tokens). Both mix by LH-Mix (Table 3's BERT + LH-Mix), so the
    local hierarchies' table is here."""

    def __init__(self, mlm, hierarchy, base_vocab, special, max_length=512):
        super().__init__()
        self.family = _family(mlm.config)
        # The first position's id: a packed row's positions (speed.py) start there.
        self.first_position = mlm.config.pad_token_id + 1 if self.family[2] else 0
        self.mlm, self.hierarchy, self.base_vocab = mlm, hierarchy, base_vocab
        self.special = special  # the cls, sep, pad and mask ids
        self.prefix, slot_id, valid = self.make_head()
        self.register_buffer('valid', valid, persistent=False)
        slots = [i for i, t in enumerate(self.prefix) if t == slot_id]
        self.register_buffer('slot_offsets', torch.tensor(slots), persistent=False)
        self.max_length, n = max_length, mlm.config.max_position_embeddings - self.first_position
        if not len(self.prefix) + 2 <= max_length <= n:
            raise ValueError(f'max_length {max_length} leaves {self.text_budget(max_length)} text '
                             f'tokens (at most {n} positions): give {len(self.prefix) + 2} to {n}')
        # The encoded local hierarchies (Sec. 4.1) and Eq. 4's, set by use_local_hierarchies().
        self.register_buffer('local_hierarchies', None, persistent=False)
        self.alpha = self.beta = None

    def name_ids(self, tokenizer):
        """Each label name's word-pieces as in a text, after a space (a byte-level BPE's 'Ġname',
        not its 'name' of a text's start); a name that has none is [UNK]."""
        return [tokenizer(' ' + name, add_special_tokens=False)['input_ids']
                or [tokenizer.unk_token_id] for name in self.hierarchy.names]

    def text_budget(self, max_length):
        """How many text word-pieces fit beside the prefix and the closing [SEP]."""
        return max_length - len(self.prefix) - 1

    def encode(self, input_ids, attention_mask=None, **packed):
        """The last hidden states. `packed`: a packed row's encoder inputs (speed.py)."""
        return self.mlm.base_model(input_ids, attention_mask, **packed).last_hidden_state

    def slots(self, hidden, starts):
        """Eq. 1's h^d (B, slots, H): `hidden` (rows, T, H) as one flat sequence, each document's
        slots at `slot_offsets` from its first position, `starts` (b * T, or in one packed row)."""
        return hidden.flatten(0, 1)[starts[:, None] + self.slot_offsets]  # Eqs. 1 and 5: h^d

    def forward(self, **batch):
        """training_loss(self, **batch): Eqs. 2-7."""
        return training_loss(self, **batch)

    @torch.no_grad()
    def label_scores(self, input_ids, attention_mask, starts):
        """Each label's score (B, V), at its own depth's slot; > 0: predicted (Sec. 3)."""
        scores = self.score(self.slots(self.encode(input_ids, attention_mask), starts))
        return scores.masked_fill(~self.valid, -math.inf).amax(1).float()  # Eq. 1: p^d over V^d


class LHMix(Classifier):
    """A masked LM prompted with the tree (Sec. 3.2): new tokens base_vocab + [labels (the
    verbalizer) | [Dd] per depth | the slot [P]]."""
    arch, mlm_term = 'prompt', True

    def make_head(self):
        """Return the prompt, its slot token [P] and `valid` (row d: depth d's labels, Eq. 1's
        V^d); add the tokens."""
        tree, D, mlm = self.hierarchy, self.hierarchy.num_depths, self.mlm
        first = self.base_vocab + len(tree)  # The first [Dd]'s id: the label tokens' are below.
        self.depth_ids, self.slot_id = list(range(first, first + D)), first + D
        # The new rows are left for initialize() to set, not averaged (a checkpoint has them).
        mlm.resize_token_embeddings(self.slot_id + 1, mean_resizing=False)
        self.transform = nn.Sequential(*(  # Eq. 1's f^d: the MLM head's transform (FAMILIES)
            mlm.get_submodule(m) if isinstance(m, str) else m for m in self.family[0]))
        self.label_bias = nn.Parameter(torch.zeros(len(tree)))
        prefix = template(  # @prompt
            D, self.special['cls'], self.special['sep'], self.depth_ids, self.slot_id)
        valid = torch.arange(1, D + 1)[:, None] == torch.tensor(tree.depth)  # Eq. 1: V^d
        return prefix, self.slot_id, valid

    @torch.no_grad()
    def initialize(self, tokenizer):
        """Label tokens: their names' mean; [Dd] random (Sec. 5.2); [P] as [MASK] (authors')."""
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
        verbalizer = self.label_embeddings().t()  # Eq. 1's verbalizer (Eq. 6's too)
        return self.transform(slot_hidden) @ verbalizer + self.label_bias  # Eqs. 1 and 6

    def loss(self, scores, targets):
        """The loss of each document and slot (B, slots): Eq. 2 over each depth's labels."""
        return zmlce(scores, targets, self.valid)  # Eq. 2, over V^d

    def mlm_loss(self, hidden, positions, labels):
        """HPT's MLM loss, the head at masked positions only (at all: an encoder layer's cost)."""
        x = hidden.flatten(0, 1).index_select(0, positions)
        return F.cross_entropy(self.mlm.get_output_embeddings()(self.transform(x)).float(), labels)


def build_model(mlm, tokenizer, hierarchy, arch, max_length=512):
    """A fresh LHMix (arch 'prompt') or FlatBERT ('bert'), started by its `initialize`. Warns, in
    one line, of the labels whose names give no word-piece but [UNK], and why."""
    special = {k: getattr(tokenizer, f'{k}_token_id') for k in ('cls', 'sep', 'pad', 'mask')}
    model = ARCHS[arch](mlm, hierarchy, len(tokenizer), special, max_length)
    unk = {v: "the vocabulary lacks its name's words" if n.strip() else 'its name holds no word'
           for v, n, p in zip(hierarchy.labels, hierarchy.names, model.name_ids(tokenizer))
           if set(p) <= {tokenizer.unk_token_id}}  # Each with its cause.
    if unk:
        warnings.warn(
            f'labels whose names give only [UNK] start alike and are alike in local hierarchies: '
            f'{unk}; rename them (label_names.tsv in the data folder; Hierarchy(parents, names)) '
            'or take a model with their words (--model)')
    model.initialize(tokenizer)
    return model


def zmlce(scores, targets, valid=None):
    """Eq. 2 of each score vector (..., L) over `valid` labels; on a GPU, the Triton kernel."""
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
    # F.pad appends each sum's 0: the log of its 1.
    negatives = torch.logsumexp(F.pad(x.masked_fill(pos, -math.inf), (0, 1)), -1)
    positives = torch.logsumexp(F.pad(x.masked_fill(~pos, -math.inf), (0, 1)), -1)
    return negatives + positives  # Eq. 2 (autograd gives its gradient)


# Sec. 4: local hierarchies (Sec. 4.1, Eq. 3), the mixing ratio (Eq. 4), Mixup (Eqs. 5-7)

def local_hierarchy_ids(model, label_ids, name_ids):
    """Sec. 4.1: a gold label set as `[CLS] [D1] <names at depth 1> [D2] ... [SEP]`, a depth's
    names in label-id order (the flat BERT, without depth tokens: the names alone)."""
    ids = [model.special['cls']]
    for d in range(1, model.hierarchy.num_depths + 1):
        ids += model.depth_ids[d - 1:d]  # [Dd]
        ids += [t for v in label_ids if model.hierarchy.depth[v] == d for t in name_ids[v]]
    return ids + [model.special['sep']]


@torch.no_grad()
def local_hierarchy_table(model, tokenizer, label_sets, batch_size=64):
    """Return each distinct local hierarchy's [CLS] state (U, H) and each label set's row (N,) in
    it. Call it before training: Sec. 4.1's encoder stays as it was. Sets are closed upward."""
    keys = [tuple(model.hierarchy.closure(s)) for s in label_sets]  # @local-hierarchy
    rows = {k: i for i, k in enumerate(sorted(set(keys)))}  # Each distinct set's row, in order.
    name_ids = model.name_ids(tokenizer)
    seqs = [local_hierarchy_ids(model, k, name_ids) for k in rows]  # @local-hierarchy
    device, was_training = model.mlm.device, model.training
    model.eval()
    out = []
    for i in range(0, len(seqs), batch_size):
        b = pad_rows(seqs[i:i + batch_size], model.special['pad'], 1)
        ids, mask = b['input_ids'].to(device), b['attention_mask'].to(device)
        out.append(model.encode(ids, mask)[:, 0].float())  # Eq. 3's h_[CLS]
    model.train(was_training)
    return torch.cat(out), torch.tensor([rows[k] for k in keys])


def use_local_hierarchies(model, table, alpha, beta):
    """Makes `model` mix by LH-Mix: `hierarchy_ids` index `table`, ratios by Eqs. 3-4."""
    model.local_hierarchies = table.to(model.mlm.device)
    model.alpha, model.beta = alpha, beta


def hierarchy_similarity(h_i, h_j):
    """Eq. 3's s of two [CLS] states."""
    s = 0.5 * (F.cosine_similarity(h_i.float(), h_j.float(), dim=-1) + 1)  # Eq. 3
    return s.clamp(0.0, 1.0)  # Eq. 3's s kept in [0, 1]: below 0 (rounding), s^alpha is NaN


def mixup_ratio(s, alpha, beta):
    """Eq. 4: similar local hierarchies mix more (lambda near 0.5), dissimilar ones less (near
    beta). alpha > 0 and beta in (0.5, 1]; beta 0.5, the authors' default, gives 0.5 always."""
    return -(beta - 0.5) * s ** alpha + beta  # Eq. 4


def vanilla_mixup_ratio(rng, a, n):
    """Table 3's + Mixup: n ratios from Beta(a, a) by numpy's `rng`, one per document (Zhang et
    al.: per batch), folded to max(lambda, 1 - lambda) in [0.5, 1] as the authors' code folds."""
    lam = rng.beta(a, a, n)
    return torch.from_numpy(np.maximum(lam, 1 - lam)).float()


def mix_hidden(h_i, h_j, lam):
    """Eq. 5 for slot states (B, slots, H), ratios (B,), in float32 (bf16 would round lambda)."""
    lam = lam.float()[:, None, None]
    return torch.lerp(h_j.float(), h_i.float(), lam).to(h_i.dtype)  # Eq. 5


def _check_mixup(model, n, partner, lam, hierarchy_ids):
    """Refuses, naming the fix, a Mixup that n documents cannot run (a lam on a GPU unchecked)."""
    if (lam is not None) + (hierarchy_ids is not None) != (partner is not None):
        raise ValueError('Mixup takes `partner` and either `lam` (vanilla) or `hierarchy_ids`')
    for name, x in dict(partner=partner, lam=lam, hierarchy_ids=hierarchy_ids).items():
        if x is not None and not (torch.is_tensor(x) and x.shape == (n,)):
            raise ValueError(f'{name} {tuple(x.shape) if torch.is_tensor(x) else repr(x)} for {n} '
                             f'documents: give a tensor of shape ({n},)')
    if lam is not None and not lam.is_cuda and not ((lam >= 0) & (lam <= 1)).all():
        raise ValueError(f'lam {lam.tolist()}: give ratios in [0, 1]')
    if hierarchy_ids is not None and model.local_hierarchies is None:
        raise ValueError(
            'hierarchy_ids: call lhmix.use_local_hierarchies(model, table, alpha, beta) first')


def training_loss(model, input_ids, starts, targets, attention_mask=None, partner=None, lam=None,
                  hierarchy_ids=None, mlm_pos=None, mlm_labels=None, **packed):
    """(loss, lambda or None) of a make_batch batch: document i mixes with `partner[i]` (authors':
    a randperm) by `lam` (B,) or LH-Mix's ratio of `hierarchy_ids`; summed over depths (the paper
    is silent; the authors' code: one ZMLCE), plus HPT's MLM term. `packed`: speed.py's."""
    _check_mixup(model, len(starts), partner, lam, hierarchy_ids)
    hidden = model.encode(input_ids, attention_mask, **packed)
    h, t = model.slots(hidden, starts), targets[:, None]  # Eqs. 1 and 5: h^d
    if partner is None:
        loss = model.loss(model.score(h), t)  # Eq. 2
    else:
        if hierarchy_ids is not None:
            hier = model.local_hierarchies[hierarchy_ids]  # Eq. 3's h_[CLS]
            s = hierarchy_similarity(hier, hier[partner])  # Eq. 3, with the partner's
            lam = mixup_ratio(s, model.alpha, model.beta)  # Eq. 4
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
    """Table 3's flat BERT, HGCLR's: [CLS] text [SEP], dropout and a linear layer on [CLS], BCE, no
    MLM term. Mixup mixes the [CLS] states (the paper does not say which states its rows mix)."""
    arch, mlm_term, depth_ids = 'bert', False, ()

    def make_head(self):
        """Return ([CLS], [CLS] its slot, every label valid there); make HGCLR's classifier."""
        cls = self.special['cls']
        self.dropout = nn.Dropout(getattr(self.mlm.config, self.family[1]))
        self.classifier = nn.Linear(self.mlm.config.hidden_size, len(self.hierarchy))
        return [cls], cls, torch.ones(1, len(self.hierarchy), dtype=torch.bool)

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


# Not in the paper: the masked LM that a run starts from

def tiny_bert(texts, max_words=8000):
    """Return a 2-layer, 128-wide BERT with the words of `texts` as vocabulary (no download)."""
    from tokenizers.normalizers import BertNormalizer
    from transformers import AutoModelForMaskedLM, BertConfig, BertTokenizerFast
    # The words are those that the tokenizer sees: its normalizer, BERT's uncased one (both
    # classes' default), lower-cases, strips accents and spaces out CJK characters, so that
    # 'Économie' is the word-piece 'economie', not [UNK].
    normalize = BertNormalizer().normalize_str
    counts = Counter(w for t in texts for w in re.findall(r"\w+|[^\w\s]", normalize(t)))
    vocab = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'] + [
        w for w, _ in counts.most_common(max_words)]
    with tempfile.TemporaryDirectory() as folder:  # transformers 4 reads vocabularies from files.
        path = os.path.join(folder, 'vocab.txt')
        with open(path, 'w', encoding='utf-8') as f:
            f.write('\n'.join(vocab) + '\n')
        tokenizer = BertTokenizerFast(path)
    # 512 positions, BertConfig's default.
    config = BertConfig(vocab_size=len(vocab), hidden_size=128, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=256)
    return AutoModelForMaskedLM.from_config(config), tokenizer  # As runs.load_checkpoint builds it.


# A folder's tokenizer: tokenizer.json; BERT's vocab.txt; RoBERTa's vocab.json; SentencePiece's
# model (DeBERTa-v3's, XLM-R's and CamemBERT's), which the sentencepiece package reads.
TOKENIZERS = {'tokenizer.json', 'vocab.txt', 'vocab.json', 'spm.model', 'sentencepiece.bpe.model'}


def load_pretrained(name):
    """Return (fp32 masked LM, tokenizer) of FAMILIES, a local folder or a hub id. Another kind is
    refused before its weights are read; one without all its encoder's weights too, since random
    ones would train, silently."""
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer, logging
    name, verbosity = os.path.expanduser(name), logging.get_verbosity()  # Hub ids have no '~'.
    if os.path.isdir(name):
        for f in os.scandir(name):  # safetensors would say 'No such file' of an unreadable one.
            if f.is_file():
                open(f.path, 'rb').close()
        files = set(os.listdir(name))  # transformers' own message would be of sentencepiece.
        if not ('config.json' in files and files & TOKENIZERS):
            raise ValueError(f'model {name!r}: the folder needs config.json and a tokenizer, '
                             + ' or '.join(sorted(TOKENIZERS)))
    # Its report of missing weights is replaced by ours below, and its bars are not a run's lines.
    bars = logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        config = AutoConfig.from_pretrained(name, trust_remote_code=False)
        if config.model_type in FAMILIES:  # Another kind is refused below, unread.
            tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=False)
            mlm, info = AutoModelForMaskedLM.from_pretrained(
                name, trust_remote_code=False, output_loading_info=True)
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as e:
        hint = ('' if os.path.isdir(name) else
                ' (not a local folder; offline, pass a local folder or --model tiny)')
        raise ValueError(f"could not load model {name!r}{hint}: {type(e).__name__}: "
                         + ' '.join(str(e).split())) from None
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()
    _family(config)
    # The encoder's weights must all be there; the MLM head's may be missing. (transformers 4 names
    # a missing weight without the encoder's prefix where the file has no prefixed weights.)
    head = {k for k in mlm.state_dict() if not k.startswith(mlm.base_model_prefix + '.')}
    missing = sorted(set(info['missing_keys']) - head)
    if missing:
        raise ValueError(
            f'model {name!r}: {len(missing)} encoder weights missing ({missing[0]}, ...): not a '
            'pretrained masked LM (to continue a run: train.py --resume; to score a checkpoint: '
            'evaluate.py --ckpt)')
    if info['missing_keys']:  # all-MiniLM-L6-v2 is one such model.
        print(f'warning: model {name!r} has no MLM-head weights: the head starts random',
              file=sys.stderr)
    return mlm.float(), tokenizer  # fp32 even from fp16 files: autocast does the rest.


# Not in the paper: tokens, batches and prediction

def tokenize(tokenizer, texts, max_text_len):
    """Return (each text's word-pieces, its first max_text_len kept; how many texts were cut)."""
    texts = list(texts)  # A tokenizer refuses an empty list, so none is passed to it.
    ids = tokenizer(texts, add_special_tokens=False, verbose=False)['input_ids'] if texts else []
    return ([np.asarray(t[:max_text_len], dtype=np.int64) for t in ids],
            sum(len(t) > max_text_len for t in ids))


def pad_rows(seqs, pad_id, multiple):
    """Id lists a row each, padded to a multiple: input_ids, attention_mask, `starts` (flat)."""
    lengths = np.array([len(s) for s in seqs])
    T = -(-lengths.max() // multiple) * multiple
    mask = np.arange(T) < lengths[:, None]
    ids = np.full(mask.shape, pad_id, dtype=np.int64)
    ids[mask] = np.concatenate(seqs)
    return {'input_ids': torch.from_numpy(ids),
            'attention_mask': torch.from_numpy(mask.astype(np.int64)),
            'starts': torch.arange(len(seqs)) * T}


def make_batch(model, token_ids, labels, rng=None, mlm_rate=0.0, partner=None,
               hierarchy_ids=None, mix_alpha=None):
    """`prefix text [SEP]` each, padded to a multiple of 16 on a GPU (tensor cores), else 8;
    `targets` (B, V) closed upward; with mlm_rate, masked (HPT's). With `partner`, a Mixup batch:
    LH-Mix's by `hierarchy_ids`, else vanilla Mixup's, its ratios drawn by `rng` (mix_alpha)."""
    if len(labels) != len(token_ids):
        raise ValueError(f'{len(token_ids)} texts, {len(labels)} label lists: give one per text')
    if (mlm_rate > 0 or mix_alpha) and rng is None:
        raise ValueError('mlm_rate > 0 and mix_alpha draw: give rng=numpy.random.default_rng(seed)')
    seqs = [np.concatenate([model.prefix, t, [model.special['sep']]]) for t in token_ids]  # @prompt
    batch = pad_rows(seqs, model.special['pad'], 16 if model.mlm.device.type == 'cuda' else 8)
    batch['targets'] = torch.zeros(len(token_ids), len(model.hierarchy), dtype=torch.bool)
    for b, ls in enumerate(labels):
        batch['targets'][b, model.hierarchy.closure(ls)] = True
    if mlm_rate > 0:
        texts = batch['starts'].numpy() + len(model.prefix)
        pos, gold = mask_tokens(
            batch['input_ids'], texts, token_ids, rng, mlm_rate, model.special['mask'])
        if len(pos):  # A batch with nothing masked has no MLM term.
            batch['mlm_pos'], batch['mlm_labels'] = pos, gold
    if partner is not None:  # A Mixup batch; training_loss refuses it without one of these two
        batch['partner'] = torch.as_tensor(partner)
        if hierarchy_ids is not None:
            batch['hierarchy_ids'] = torch.as_tensor(hierarchy_ids)
        if mix_alpha:  # Drawn after the masks, as they always were
            batch['lam'] = vanilla_mixup_ratio(rng, mix_alpha, len(token_ids))
    return batch


def mask_tokens(input_ids, text_starts, token_ids, rng, rate, mask_id):
    """BERT's masking for HPT's MLM term, in place: each text word-piece chosen at `rate`, then
    80% [MASK], 10% another of the batch's, 10% kept. Returns the positions and their old ids."""
    pos = torch.from_numpy(np.concatenate(
        [s + np.flatnonzero(rng.random(len(t)) < rate) for s, t in zip(text_starts, token_ids)]))
    flat = input_ids.view(-1)
    gold = flat[pos]  # Indexing by a tensor copies.
    r = torch.from_numpy(rng.random(len(pos)))
    flat[pos[r < 0.8]] = mask_id
    rand = pos[(r >= 0.8) & (r < 0.9)]
    flat[rand] = torch.from_numpy(rng.choice(np.concatenate(token_ids), len(rand)))
    return pos, gold


def autocast(device):
    """bf16 autocast on a GPU (else fp16), none on a CPU; no cast cache (CUDA graphs forbid it)."""
    cuda = device.type == 'cuda'
    dtype = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float16
    return torch.autocast(device.type, dtype, enabled=cuda, cache_enabled=False)


@torch.no_grad()
def score_documents(model, token_ids, batch_size=128):
    """Return each label's score (at its depth's slot) for each document's word-pieces, a numpy
    float32 array (N, V) in input order; > 0: predicted. In eval mode; the model's mode is kept."""
    device, was_training = model.mlm.device, model.training
    out = torch.zeros(len(token_ids), len(model.hierarchy), device=device)
    model.eval()
    order = np.argsort([len(t) for t in token_ids], kind='stable')  # Similar lengths pad less.
    for i in range(0, len(order), batch_size):
        idx = order[i:i + batch_size]
        b = make_batch(model, [token_ids[j] for j in idx], [[]] * len(idx))
        with autocast(device):  # Written on the GPU: no sync a batch.
            out[torch.from_numpy(idx).to(device)] = model.label_scores(
                *(b[k].to(device) for k in ('input_ids', 'attention_mask', 'starts')))
    model.train(was_training)
    return out.cpu().numpy()


# Not in the paper: ZMLCE fused in Triton, its forward (Eq. 2) and gradient (Eq. 8) in one pass

if triton is not None:
    @triton.jit
    def _zmlce_kernel(S, T, VALID, LOSS, GRAD, L, BLOCK: tl.constexpr):
        """One score vector (BLOCK >= L). Eq. 2's log-sum-exps shifted by max(0, x), so that no
        exponential overflows; the gradient e^(s - lse_neg), or -e^(-s - lse_pos) if positive."""
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
            valid = scores.new_ones((), dtype=torch.bool)
        s, t, v = (_flat(x, shape) for x in (scores, targets.bool(), valid))
        loss, grad = torch.empty(len(s), device=s.device), torch.empty(s.shape, device=s.device)
        block = triton.next_power_of_2(L)
        _zmlce_kernel[(len(s),)](
            s, t, v, loss, grad, L, BLOCK=block, num_warps=4 if block <= 1024 else 8)
        ctx.save_for_backward(grad.view(shape))
        ctx.dtype = scores.dtype
        return loss.view(shape[:-1])

    @staticmethod
    def backward(ctx, g):
        grad, = ctx.saved_tensors
        return (grad * g.unsqueeze(-1)).to(ctx.dtype), None, None  # Eq. 8: g holds lambda
