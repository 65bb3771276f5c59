"""The label study of the paper's Fig. 6: the labels nearest to one ("Hockey" in the paper) by the
cosine of the verbalizer's label embeddings, at initialisation and after training, from one
checkpoint (train.py keeps the initial embeddings in it); or, over all labels, how many of each
label's nearest labels are its relatives in the tree, which tests Fig. 6's reading ("better
hierarchical label correlation after learning") beyond one label.

    python -m tools.similar --ckpt out/demo-prompt-lhmix-s0/best --label optics
    python -m tools.similar --ckpt out/demo-prompt-lhmix-s0/best --all-labels \\
        --out out/demo-prompt-lhmix-s0/relatives.json
"""
import argparse
import json

import torch

import evaluate
import runs
from tools.summary import K, RELATIVES

START = '{\n "relatives_among_nearest": '  # how that JSON begins


def ranks(emb, v):
    """({label: rank} by cosine to label v, 1 = nearest, ties by label id; the cosines)."""
    cos = torch.nn.functional.cosine_similarity(emb.float(), emb[v:v + 1].float()).tolist()
    order = sorted((u for u in range(len(emb)) if u != v), key=lambda u: -cos[u])
    return {u: i for i, u in enumerate(order, 1)}, cos


def relatives(h, v):
    """Label v's relatives in the tree: its parent, its children and its siblings (the other
    children of its parent; the depth-1 labels are siblings, children of the root)."""
    return {u for u in range(len(h)) if u != v and (
        u == h.parent[v] or h.parent[u] == v or h.parent[u] == h.parent[v])}


def relatives_among_nearest(h, emb, ks=K):
    """{k: the share of each label's k nearest labels (ranks' order) that are its relatives,
    averaged over the labels}; k is at most the number of other labels."""
    shares = dict.fromkeys(ks, 0.0)
    for v in range(len(h)):
        rank, kin = ranks(emb, v)[0], relatives(h, v)
        for k in ks:
            near = [u for u, r in rank.items() if r <= k]
            shares[k] += len(kin.intersection(near)) / len(near)
    return {k: total / len(h) for k, total in shares.items()}


def load(ckpt):
    """The checkpoint's model and its label embeddings at initialisation."""
    model, _, meta = runs.load_checkpoint(ckpt)
    if 'labels_at_init' not in meta['extra']:
        raise ValueError(f'{ckpt}: holds no initial label embeddings (not a train.py run)')
    return model, meta['extra']['labels_at_init']


def similar(args):
    model, init = load(args.ckpt)
    h, top = model.hierarchy, args.top
    hits = [u for u, name in enumerate(h.names)
            if args.label == h.labels[u] or args.label.lower() == name.lower()]
    if len(hits) != 1:
        raise ValueError(f'label {args.label!r} is ambiguous: ' + ', '.join(
            h.labels[u] for u in hits) if hits else
            f"label {args.label!r} is not in the checkpoint's hierarchy")
    v = hits[0]
    at_init, _ = ranks(init, v)
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


def all_labels(args):
    """Fig. 6 over all labels: printed, and written whole to --out as JSON."""
    if args.out:
        evaluate.check_output(args.out, '--out', args.ckpt, START)
    model, at_init = load(args.ckpt)
    h = model.hierarchy
    if len(h) < 2:
        raise ValueError(f'{args.ckpt}: its hierarchy has one label, which has no nearest labels')
    shares = {'init': relatives_among_nearest(h, at_init),
              'trained': relatives_among_nearest(h, model.label_embeddings().detach())}
    chance = sum(len(relatives(h, v)) for v in range(len(h))) / (len(h) - 1) / len(h)
    print(f"relatives (parent, children, siblings) among each label's k nearest labels by cosine "
          f'of the label embeddings,\nthe share averaged over the {len(h)} labels\n'
          f"{'k':>3} {'init':>7} {'trained':>7}")
    for k in K:
        print(f"{k:>3} {shares['init'][k]:7.3f} {shares['trained'][k]:7.3f}")
    print(f'by chance (all other labels): {chance:.3f}')
    if args.out:
        runs.write_whole(args.out, json.dumps({
            'relatives_among_nearest': {k: {s: shares[s][k] for s in shares} for k in K},
            'by_chance': chance, 'labels': len(h)}, indent=1) + '\n')


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--ckpt', required=True, help='a checkpoint train.py wrote, such as RUN/best')
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument('--label', help='a label, by its key or its name')
    what.add_argument('--all-labels', action='store_true', help="the share of each label's "
                      f'{" and ".join(map(str, K))} nearest labels that are its relatives in the '
                      'tree (parent, children, siblings), at initialisation and after training, '
                      'averaged over the labels')
    p.add_argument('--top', type=int, help=f'with --label: how many nearest labels (default '
                   f"{K[-1]}: the paper's outer sphere)")
    p.add_argument('--out', metavar='FILE', help='with --all-labels: write it as JSON to FILE too '
                   f'(tools/claims.py reads RUN/{RELATIVES})')
    args = p.parse_args(argv)
    if args.all_labels and args.top is not None:
        p.error(f'--top is for --label; --all-labels counts the {" and ".join(map(str, K))} '
                'nearest')
    if args.out and not args.all_labels:
        p.error('--out is for --all-labels')
    if args.top is None:
        args.top = K[-1]
    if args.top < 1:
        p.error('--top must be >= 1')
    runs.exit_on_error(all_labels if args.all_labels else similar, args)


if __name__ == '__main__':
    main()
