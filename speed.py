"""What makes training fast, beside lhmix.py, which runs without it: batches of similar lengths
where there is no Mixup; Mixup's random batches packed into one row whose documents attend to
themselves only; whole steps replayed from CUDA graphs, where use_cuda_graphs() says they run.

    train_batches(lengths, batch_size, rng, mixing)   an epoch's batches and Mixup partners
    epoch_batches(model, tokens, labels, ...)   an epoch's batches, whole, on the device
    use_packed_rows(model)        the encoder attends per document in a packed row
    pack_row(batch, pad_id)       a padded batch of lhmix.make_batch's, all in one row
    pad_for_graphs(batch, rate)   the MLM term's positions padded to a count per batch shape
    to_device(batch, device)      a batch moved to a GPU without a host sync
    make_optimizer(model, lr, capturable)   Adam, fused on a GPU, ready for CUDA graphs
    use_cuda_graphs(device, model), CUDAGraphs(fn)   steps replayed from CUDA graphs, where they run
"""
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F
import transformers

import lhmix

TRANSFORMERS_5 = int(transformers.__version__.split('.')[0]) >= 5
# A packed row's length is a multiple of PACKED, so that CUDA graphs see few shapes; on WOS's
# lengths this pads about 1% of a row.
PACKED = 128


def document_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                       cu_seq_lens_q=None, **kwargs):
    """transformers' SDPA attention, except in a packed row (cu_seq_lens_q holds each document's
    start and the row's end). There SDPA runs per document on a nested jagged tensor, which does
    no work across documents: flash-attention's variable-length kernel on a GPU. A document is at
    most as long as the encoder's positions, which bounds it without a host sync."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    if cu_seq_lens_q is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    longest = min(query.shape[2], module.config.max_position_embeddings)
    q, k, v = (torch.nested.nested_tensor_from_jagged(  # (1, heads, T, d) -> (docs, heads, n, d)
        x[0].transpose(0, 1), cu_seq_lens_q, min_seqlen=1, max_seqlen=longest
    ).transpose(1, 2) for x in (query, key, value))
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling)
    return out.transpose(1, 2).values()[None], None  # (1, T, heads, d), as transformers' own


def use_packed_rows(model):
    """Makes the model's encoder attend per document in a packed row (document_attention), and
    as before in any other batch. Needs transformers 5, whose attention interface allows it."""
    if not TRANSFORMERS_5:
        raise ValueError(f'packed rows need transformers 5 (this is {transformers.__version__})')
    # Imported here: importing masking_utils sets an environment variable (torch's).
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    transformers.AttentionInterface.register('packed', document_attention)
    AttentionMaskInterface.register('packed', ALL_MASK_ATTENTION_FUNCTIONS['sdpa'])
    model.mlm.set_attn_implementation('packed')


def train_batches(lengths, batch_size, rng, mixing):
    """An epoch's batches: (document ids, partner positions or None). While mixing, slices of a
    shuffle, and the partners are the authors' randperm(B), so pi(i) == i leaves a document
    unmixed. Otherwise batches of similar lengths, from chunks of 64 batches, which pad less."""
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


def epoch_batches(model, tokens, labels, batch_size, rng, device, mlm_rate, mixing, graphed,
                  hierarchy_ids=None, mix_alpha=None):
    """Yield an epoch's batches (train_batches'), each whole and on `device`: lhmix.make_batch's,
    while mixing with their partners and LH-Mix's `hierarchy_ids` (all documents'), else vanilla
    Mixup's ratios (`mix_alpha`). For CUDA graphs, Mixup's random batches are packed into one row
    (eager steps pad them: nested tensors cost an eager step more), and each batch's masked
    positions padded (pad_for_graphs)."""
    for idx, partner in train_batches([len(t) for t in tokens], batch_size, rng, mixing):
        batch = lhmix.make_batch(
            model, [tokens[i] for i in idx], [labels[i] for i in idx], rng, mlm_rate, partner,
            None if hierarchy_ids is None else hierarchy_ids[idx], mix_alpha)
        if graphed:
            if mixing:
                batch = pack_row(batch, model.special['pad'], model.first_position)
            batch = pad_for_graphs(batch, mlm_rate)
        yield to_device(batch, device)


def pack_row(batch, pad_id, first=0):
    """lhmix.make_batch's padded `batch`, all in one row, a multiple of PACKED long: input_ids,
    position_ids (each document's from `first`, the model's first_position), token_type_ids (the
    encoder's default ones stop at its positions), cu_seq_lens_q (each document's start, then the
    padding's start, a document of its own, then the row's end), `starts` (each document's first
    position) and its masked positions there."""
    mask = batch['attention_mask'].bool()
    n, ends = int(mask.sum()), F.pad(mask.sum(1).cumsum(0), (1, 0))
    T = (n // PACKED + 1) * PACKED  # At least one padding token ends the row.
    row = {k: v for k, v in batch.items() if k != 'attention_mask'}
    if 'mlm_pos' in batch:  # A position of the padded batch, in the row
        row['mlm_pos'] = (mask.flatten().cumsum(0) - 1)[batch['mlm_pos']]
    ids = F.pad(batch['input_ids'][mask], (0, T - n), value=pad_id)[None]
    pos = F.pad(mask.cumsum(1)[mask] - 1 + first, (0, T - n))[None]
    return dict(row, input_ids=ids, position_ids=pos, token_type_ids=torch.zeros_like(ids),
                cu_seq_lens_q=F.pad(ends, (0, 1), value=T), starts=ends[:-1])


def pad_for_graphs(batch, rate):
    """Pads the batch's masked positions and their ids, if any, for CUDA graphs, which need a
    fixed count per batch shape: to the mean + 8 sd of the count of its positions masked at
    `rate`, in 64s, the padding labelled -100, which cross-entropy ignores."""
    if 'mlm_pos' in batch:
        cells, n = batch['input_ids'].numel(), len(batch['mlm_pos'])
        cap = int(-(-(rate * cells + 8 * math.sqrt(cells * rate * (1 - rate)) + 1) // 64) * 64)
        cap *= -(-n // cap)
        batch['mlm_pos'] = F.pad(batch['mlm_pos'], (0, cap - n))
        batch['mlm_labels'] = F.pad(batch['mlm_labels'], (0, cap - n), value=-100)
    return batch


def to_device(batch, device):
    """The batch on `device`; to a GPU through pinned memory, which copies without a host sync."""
    cuda = device.type == 'cuda'
    return {k: (v.pin_memory() if cuda else v).to(device, non_blocking=cuda)
            for k, v in batch.items()}


def make_optimizer(model, lr, capturable, state=None):
    """Return (Adam, its loss scaler), continuing from Adam's `state` when one is given. On a GPU
    Adam is fused; `capturable` keeps its step count on the GPU, as a CUDA graph needs."""
    cuda = next(model.parameters()).is_cuda
    opt = torch.optim.Adam(model.parameters(), lr=lr, fused=cuda, capturable=capturable)
    opt.load_state_dict({'state': state or {}, 'param_groups': opt.state_dict()['param_groups']})
    # fp16 (a GPU without bf16) needs its loss scaled; the scale starts afresh at --resume.
    scaler = torch.amp.GradScaler(enabled=cuda and not torch.cuda.is_bf16_supported())
    # Every gradient is allocated here, once, and zeroed in place by every step: a CUDA graph
    # then writes the same memory at every replay, and every step, graphed or eager, updates a
    # weight that its batch leaves unused as one with gradient 0, even one no batch used yet.
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    return opt, scaler


def use_cuda_graphs(device, model, eager=False):
    """Whether train.py's steps run from CUDA graphs on `device`: where they can, unless `eager`;
    then the model attends per document in packed rows (use_packed_rows). On a GPU where they
    cannot, it says why: fp16 (no bf16) needs a loss scaler, which syncs, and so does
    transformers 4's encoder; a family that packed rows do not fit (lhmix.FAMILIES) pads them."""
    if device.type != 'cuda' or eager:
        return False
    why_not = ('no bf16 on this GPU' if not torch.cuda.is_bf16_supported() else
               'transformers 4 syncs inside the encoder' if not TRANSFORMERS_5 else
               model.family[3] and f'{model.mlm.config.model_type}: {model.family[3]}')
    if why_not:
        print(f'CUDA graphs off: {why_not}', file=sys.stderr)
    else:
        use_packed_rows(model)
    return not why_not


class CUDAGraphs:
    """Calls fn(batch) through CUDA graphs, one captured per set of batch shapes, so that a step
    costs the GPU's kernel time and no Python. A shape's first batch runs fn eagerly, on a side
    stream as a capture asks, and then fn is captured, which records it without running it;
    later batches of that shape replay the graph. A replay overwrites the last one's outputs."""

    def __init__(self, fn):
        self.fn, self.graphs, self.pool = fn, {}, torch.cuda.graph_pool_handle()

    def __call__(self, batch):
        key = tuple((k, tuple(v.shape), v.dtype) for k, v in batch.items())
        if key in self.graphs:
            graph, inputs, outputs = self.graphs[key]
            for k, v in batch.items():
                inputs[k].copy_(v, non_blocking=True)
            graph.replay()
            return outputs
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = self.fn(batch)
        torch.cuda.current_stream().wait_stream(side)
        inputs, graph = {k: v.clone() for k, v in batch.items()}, torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.graphs[key] = graph, inputs, self.fn(inputs)
        return out
