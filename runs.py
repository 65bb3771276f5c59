"""A train.py run on disk: its folder, held by one train.py at a time, files and checkpoints; and
the scripts' one error exit."""
import contextlib
import fcntl
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save

from data import one_line, temporary, write_whole
from lhmix import Hierarchy, LHMix

# A run's figures and checkpoints: best/ (best dev macro-F1), last/ (to resume)
METRICS, TEST_METRICS, WEIGHTS = 'metrics.jsonl', 'test_metrics.json', 'model.safetensors'
CHECKPOINT = ('tokenizer.json', 'tokenizer_config.json', 'config.json', WEIGHTS)  # written so
RUN = (METRICS, TEST_METRICS, *(f'{c}/{f}' for c in ('best', 'last') for f in CHECKPOINT))
TMP = tuple(temporary(f) for f in RUN)
OURS = ('best', 'last') + RUN + TMP  # all train.py writes in a run folder


def unwritable(folder):
    """Why `folder` (made with its parents where missing) cannot be written in, or None."""
    up = folder
    while not os.path.exists(up):
        up = os.path.dirname(up) or '.'  # a relative name's first folder is the working one
    if not os.path.isdir(up):
        return f'{up} is a file, not a folder'
    return None if os.access(up, os.W_OK | os.X_OK) else f'{up} is not writable'


# Checkpoints: a folder of CHECKPOINT, each file replaced whole; model.safetensors, written last,
# holds the weights, other tensors and JSON metadata (no pickle)

def _aliases(model):
    """Names of tied copies (BERT's decoder weight is its word embeddings): safetensors stores no
    aliases; config.json ties them again."""
    return ({n for n, _ in model.named_parameters(remove_duplicate=False)}
            - {n for n, _ in model.named_parameters()})


def save_checkpoint(folder, model, tokenizer, meta, extra=None):
    """The tokenizer and config.json (once), then model.safetensors: the weights, `extra` tensors
    as extra.<name>, metadata 'lhmix' (what rebuilds the LHMix, and `meta`)."""
    if not os.path.exists(os.path.join(folder, 'config.json')):
        with tempfile.TemporaryDirectory() as tmp:  # transformers 4 writes more than is needed
            tokenizer.save_pretrained(tmp)
            model.mlm.config.save_pretrained(tmp)
            for f in CHECKPOINT[:-1]:
                write_whole(os.path.join(folder, f), Path(tmp, f).read_bytes())
    h, aliases = model.hierarchy, _aliases(model)
    meta = {'arch': model.arch, 'base_vocab': model.base_vocab, 'special': model.special,
            'max_length': model.max_length,
            'hierarchy': {'labels': h.labels, 'names': h.names,
                          'parents': [h.labels[p] if p >= 0 else None for p in h.parent]}, **meta}
    tensors = {**{k: v for k, v in model.state_dict().items() if k not in aliases},
               **{f'extra.{k}': v for k, v in (extra or {}).items()}}
    write_whole(os.path.join(folder, WEIGHTS), save(
        {k: v.detach().cpu().contiguous() for k, v in tensors.items()},
        {'lhmix': json.dumps(meta), 'format': 'pt'}))  # 'pt': as transformers writes


def checkpoint_meta(folder):
    """model.safetensors' metadata, its tensors unread (KeyError if it has none)."""
    open(os.path.join(folder, WEIGHTS), 'rb').close()  # safetensors: 'No such file' if unreadable
    with safe_open(os.path.join(folder, WEIGHTS), 'pt') as f:
        return json.loads((f.metadata() or {})['lhmix'])


def check_labels(saved, hierarchy, folder):
    """Refuses data whose labels are not the checkpoint's, in its order (its label ids)."""
    if saved.labels != hierarchy.labels:
        raise ValueError(f'{folder}: its labels differ from those of the data' + (
            ' in their order (a taxonomy with its lines reordered?)'
            if sorted(saved.labels) == sorted(hierarchy.labels) else ''))


def load_checkpoint(folder, device='cpu', hierarchy=None):
    """(model, tokenizer, the metadata with 'extra': the other tensors). With `hierarchy`, the
    labels must be the data's. Runs no code from the folder (config.json's auto_map is ignored)."""
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer
    if os.path.isfile(folder):
        raise ValueError(f'{folder}: a file, not a checkpoint: a checkpoint is a folder holding '
                         f'{", ".join(CHECKPOINT)}, such as a run\'s best/')
    if os.path.isdir(os.path.join(folder, 'best')):
        raise ValueError(f'{folder}: a run, not a checkpoint: pass {os.path.join(folder, "best")}')
    missing = [f for f in CHECKPOINT if not os.path.exists(os.path.join(folder, f))]
    if missing:
        raise ValueError(f'{folder}: not an LH-Mix checkpoint (no {", ".join(missing)})')
    weights = os.path.join(folder, WEIGHTS)
    try:
        meta, tensors = checkpoint_meta(folder), load_file(weights)
    except (OSError, ValueError, KeyError, SafetensorError) as e:
        raise ValueError(f'{weights}: unreadable, truncated or corrupt ({one_line(e)})') from None
    meta['extra'] = {k[6:]: tensors.pop(k).to(device) for k in list(tensors)
                     if k.startswith('extra.')}
    try:
        h = meta['hierarchy']
        mlm = AutoModelForMaskedLM.from_config(AutoConfig.from_pretrained(  # SDPA: as trained
            folder, trust_remote_code=False), trust_remote_code=False, attn_implementation='sdpa')
        model = LHMix(mlm, Hierarchy(dict(zip(h['labels'], h['parents'])),
                                     dict(zip(h['labels'], h['names']))),
                      meta['arch'], meta['base_vocab'], meta['special'], meta['max_length'])
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise ValueError(f'{folder}: config.json, tokenizer or metadata unreadable '
                         f'({one_line(e)})') from None
    # strict, but for the tied copies, which load with the one they are tied to
    want = {k: v.shape for k, v in model.state_dict().items() if k not in _aliases(model)}
    bad = sorted(k for k in want.keys() | tensors.keys()
                 if want.get(k) != getattr(tensors.get(k), 'shape', None))
    if bad:
        raise ValueError(f'{weights}: weights missing, unexpected or not shaped as config.json '
                         f'says: {bad[0]} and {len(bad) - 1} more')
    model.load_state_dict(tensors, strict=False)
    if hierarchy is not None:
        check_labels(model.hierarchy, hierarchy, folder)
    return model.to(device), tokenizer, meta


# The run folder: train.py holds it locked while it runs, writes only OURS there and deletes only
# those: an earlier run's when --overwrite saves its first epoch, its own if it fails before

def digest(hierarchy, splits):
    """What --resume checks against the run's: the labels and every split's documents."""
    x = json.dumps([hierarchy.labels, hierarchy.parent, splits]).encode()
    return hashlib.sha256(x).hexdigest()


def delete_run(folder, names=RUN + TMP):
    """Deletes these files of a run in `folder`, then best/ and last/ if empty (not `folder`)."""
    for name in names:
        if os.path.lexists(os.path.join(folder, name)):
            os.remove(os.path.join(folder, name))
    for sub in ('best', 'last'):
        with contextlib.suppress(OSError):  # the OS removes only an empty folder
            os.rmdir(os.path.join(folder, sub))


class RunFolder:
    """--out, checked for a new run, --resume or --overwrite and locked before anything is
    computed: another train.py is refused until this process ends in any way (the OS unlocks)."""

    def __init__(self, out, resume=False, overwrite=False):
        self.name, self.path = out, os.path.realpath(out)
        self.saved, self.replacing = True, False  # so far, a failure deletes nothing
        if os.path.islink(out) and not os.path.exists(out):
            raise ValueError(f'--out {out}: a symbolic link to nothing ({self.path})')
        # An unwritable folder is refused now, not at the first save, an epoch later.
        why = [w for w in map(unwritable, [out] + [os.path.join(out, c) for c in ('best', 'last')])
               if w]
        if why:
            raise ValueError(f'--out {out}: {why[0]}')
        self.made, up = [], self.path  # the folders made here, deepest first
        while not os.path.exists(up):
            self.made, up = self.made + [up], os.path.dirname(up)
        os.makedirs(self.path, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise ValueError(f'--out {out}: another train.py is using this folder; let it end, '
                             'or choose another --out') from None
        try:
            self.replacing = self._check(resume, overwrite)
        except BaseException:
            self.__exit__(True)
            raise
        self.saved = resume  # until then, a failure deletes what this run wrote

    def _check(self, resume, overwrite):
        """Refuses --out as it is, or says whether an earlier run is to be replaced."""
        # A link would have the run write or delete outside --out, in the user's own files.
        link = next((n for n in OURS if os.path.islink(os.path.join(self.path, n))), None)
        if link:
            raise ValueError(
                f'--out {self.name}: {os.path.join(self.name, link)} is a symbolic link (to '
                f'{os.readlink(os.path.join(self.path, link))}); train.py neither writes nor '
                'deletes through links in a run folder: put what it names in its place, or '
                'choose another --out')
        top = sorted(os.listdir(self.path))
        other = next((os.path.join(self.name, n) for n in (  # the first, without a full walk
            os.path.relpath(os.path.join(r, n), self.path) for r, dirs, files in os.walk(self.path)
            for n in sorted(dirs + files)) if n not in OURS), None)
        if resume and 'last' not in top:
            raise ValueError(f'--resume: {self.name} holds no run to continue')
        if resume:
            delete_run(self.path, TMP)  # what killed saves left
        if resume or not top:
            return False
        why = None
        try:
            checkpoint_meta(os.path.join(self.path, 'last'))['history']
        except Exception as e:  # missing, unreadable, not a run's: the message says which
            why = one_line(e)
        if why is None and not overwrite:
            raise ValueError(f'--out {self.name}: holds an earlier run; continue it with --resume, '
                             'replace it with --overwrite, or choose another --out')
        if other:
            raise ValueError(f'--overwrite: {other} is not a file train.py writes; nothing is '
                             'deleted while it is there' if overwrite else f'--out {self.name}: '
                             f'holds no train.py run (it holds {", ".join(top[:3])}...); choose '
                             'another --out')
        if not overwrite:
            raise ValueError(f'--out {self.name}: holds a train.py run that saved no epoch or is '
                             f'damaged ({why}); replace it with --overwrite, or choose another '
                             '--out')
        if why is not None:
            print(f'--overwrite: {self.name} holds a run that saved no epoch or is damaged '
                  f'({why}); replacing it', file=sys.stderr)
        return True

    def delete_unsaved(self):
        """What this run wrote (if it saved no epoch) and the folders it made, if empty."""
        if not self.saved and not self.replacing:
            delete_run(self.path)
        for folder in self.made:
            with contextlib.suppress(OSError):
                os.rmdir(folder)

    def __enter__(self):
        return self

    def __exit__(self, failed, *_):  # unlocks; on failure first deletes what it may
        if failed:
            self.delete_unsaved()
        os.close(self.fd)

    def load_last(self, device='cpu'):
        """last/'s (model, tokenizer, meta); meta['adam']: Adam's state, as its state_dict's."""
        model, tokenizer, meta = load_checkpoint(os.path.join(self.path, 'last'), device)
        meta['adam'] = {}
        for key in [k for k in meta['extra'] if k.startswith('adam.')]:
            _, i, name = key.split('.')
            meta['adam'].setdefault(int(i), {})[name] = meta['extra'].pop(key)
        return model, tokenizer, meta

    def save(self, model, tokenizer, meta, history, extra, adam, improved):
        """best/ (if `improved`), metrics.jsonl, then last/ (with `extra` and the optimizer's
        state): a kill between them re-runs the epoch at --resume. --overwrite deletes first."""
        if self.replacing:
            delete_run(self.path)
            self.replacing = False
        if improved:  # the initial label embeddings too, for tools/similar.py
            save_checkpoint(os.path.join(self.path, 'best'), model, tokenizer,
                            {**meta, 'epoch': len(history) - 1, 'dev': history[-1]},
                            {'labels_at_init': extra['labels_at_init']})
        write_whole(os.path.join(self.path, METRICS),
                    ''.join(json.dumps(h) + '\n' for h in history))
        save_checkpoint(os.path.join(self.path, 'last'), model, tokenizer,
                        {**meta, 'history': history}, {**extra, **{
                            f'adam.{i}.{k}': v for i, state in adam.state_dict()['state'].items()
                            for k, v in state.items()}})
        self.saved = True


# The scripts' one error exit

def exit_on_error(main, *args):
    """main(*args); a mistake, the OS's refusal, no GPU memory or Ctrl-C end it in one line (exit
    1), a closed pipe (`... | head -1`) quietly."""
    try:
        main(*args)
        sys.stdout.flush()  # here, so that a closed pipe is caught below
    except BrokenPipeError:  # the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit('interrupted')
    except torch.OutOfMemoryError:
        sys.exit('error: out of GPU memory; try a smaller --batch')
    except OSError as e:  # the OS's words
        sys.exit(f'error: {e.filename}: {e.strerror}' if e.filename else f'error: {e}')
    except (ValueError, FloatingPointError) as e:
        sys.exit('error: ' + str(e).replace('\n', ' '))
