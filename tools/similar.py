"""The label case study of the paper's Fig. 6 ("Hockey"): the labels nearest to one by the cosine
of the verbalizer's label embeddings, at initialisation and after training, from one checkpoint
(train.py keeps the initial embeddings in it).

    python tools/similar.py --ckpt out/demo-prompt-lhmix-s0/best --label optics
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import runs  # noqa: E402


def ranks(emb, v):
    """({label: rank} by cosine to label v, 1 = nearest, ties by label id; the cosines)."""
    cos = torch.nn.functional.cosine_similarity(emb.float(), emb[v:v + 1].float()).tolist()
    order = sorted((u for u in range(len(emb)) if u != v), key=lambda u: -cos[u])
    return {u: i for i, u in enumerate(order, 1)}, cos


def similar(args):
    model, _, meta = runs.load_checkpoint(args.ckpt)
    h, top = model.hierarchy, args.top
    hits = [u for u, name in enumerate(h.names)
            if args.label == h.labels[u] or args.label.lower() == name.lower()]
    if len(hits) != 1:
        raise ValueError(f'label {args.label!r} is ambiguous: ' + ', '.join(
            h.labels[u] for u in hits) if hits else
            f"label {args.label!r} is not in the checkpoint's hierarchy")
    if 'labels_at_init' not in meta['extra']:
        raise ValueError(f'{args.ckpt}: holds no initial label embeddings (not a train.py run)')
    v = hits[0]
    at_init, _ = ranks(meta['extra']['labels_at_init'], v)
    trained, cos = ranks(model.label_embeddings().detach(), v)
    print(f'labels nearest to {h.labels[v]} ({h.names[v]}) by cosine of the label embeddings, '
          f"top {top}\n{'trained':>7} {'init':>5} {'change':>6} {'cos':>7}  label")
    for u in sorted(trained, key=trained.get):
        if min(trained[u], at_init[u]) <= top:  # 'new': not in the top at init
            change = 'new' if at_init[u] > top else f'{at_init[u] - trained[u]:+d}'
            print(f'{trained[u]:>7} {at_init[u]:>5} {change:>6} {cos[u]:7.3f}  '
                  f'{h.labels[u]} ({h.names[u]})')
    k, kept = min(top, len(trained)), sum(max(trained[u], at_init[u]) <= top for u in trained)
    print(f'{kept} of the top {k} after training were in the top {k} at initialisation')


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--ckpt', required=True, help='a checkpoint train.py wrote, such as RUN/best')
    p.add_argument('--label', required=True, help='a label, by its key or its name')
    p.add_argument('--top', type=int, default=15, help='how many nearest labels (default 15: the '
                   "paper's outer sphere)")
    args = p.parse_args(argv)
    if args.top < 1:
        p.error('--top must be >= 1')
    runs.exit_on_error(similar, args)


if __name__ == '__main__':
    main()
