"""A train.py run on disk: its folder, held by one train.py at a time, the files in it, its
checkpoints; and the one way the scripts end on an error."""
import fcntl
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from data import one_line, temporary, write_whole
from lhmix import Hierarchy, LHMix

# A run folder: the figures, then the checkpoints best/ (best dev macro-F1) and last/ (to resume)
METRICS, TEST_METRICS, WEIGHTS = 'metrics.jsonl', 'test_metrics.json', 'model.safetensors'
CHECKPOINT = ('tokenizer.json', 'tokenizer_config.json', 'config.json', WEIGHTS)  # written so
RUN = (METRICS, TEST_METRICS, *(f'{c}/{f}' for c in ('best', 'last') for f in CHECKPOINT))
TMP = tuple(temporary(f) for f in RUN)  # while write_whole writes them
OURS = RUN + TMP + ('best', 'last')  # all that train.py writes in a run folder


def unwritable(folder):
    """Why `folder` (made with its parents where missing) cannot be written in, or None."""
    up = folder
    while not os.path.exists(up):
        up = os.path.dirname(up)
    if not os.path.isdir(up):
        return f'{up} is a file, not a folder'
    return None if os.access(up, os.W_OK | os.X_OK) else f'{up} is not writable'


# -----------------------------------------------------------------------------
# Checkpoints: a folder of CHECKPOINT, each file replaced whole; model.safetensors, written last,
# holds the weights, tensors of the run and JSON metadata (no pickle)

def _aliases(model):
    """Names of tied copies (BERT's decoder weight is its word embeddings): safetensors stores no
    aliases, and the model built from config.json ties them again."""
    return ({n for n, _ in model.named_parameters(remove_duplicate=False)}
            - {n for n, _ in model.named_parameters()})


def save_checkpoint(folder, model, tokenizer, meta, extra=None):
    """The tokenizer and config.json (once), then model.safetensors: the weights, `extra` ({name:
    tensor}) as extra.<name>, metadata 'lhmix' (JSON: what rebuilds the LHMix, and `meta`). A kill
    at any instant leaves the old checkpoint or the new one."""
    from safetensors.torch import save
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
    """The metadata of folder's model.safetensors, its tensors unread (KeyError if it has none)."""
    from safetensors import safe_open
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
    """(model, tokenizer, meta): meta is the saved metadata, meta['extra'] the extras. With
    `hierarchy`, the labels must be the data's. Runs no code from the folder (trust_remote_code
    is off: transformers' classes are used whatever config.json's auto_map asks for)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer
    if not os.path.isdir(folder):
        raise ValueError(f'{folder}: no such checkpoint folder')
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
    want = {k: tuple(v.shape) for k, v in model.state_dict().items() if k not in _aliases(model)}
    have = {k: tuple(v.shape) for k, v in tensors.items()}
    bad = sorted(k for k in want.keys() | have.keys() if want.get(k) != have.get(k))
    if bad:
        k = bad[0]
        raise ValueError(f'{weights}: {k} ' + (
            'missing' if k not in have else 'unexpected' if k not in want else
            f'is {have[k]} here, {want[k]} by config.json') + f' (and {len(bad) - 1} more)' * (len(bad) > 1))
    model.load_state_dict(tensors, strict=False)
    if hierarchy is not None:
        check_labels(model.hierarchy, hierarchy, folder)
    return model.to(device), tokenizer, meta


# -----------------------------------------------------------------------------
# The run folder: train.py holds it locked while it runs, writes only OURS there, and deletes only
# those names: an earlier run's files when --overwrite saves its first epoch, or its own first
# epoch's when it fails before the epoch is saved whole

def delete_run(folder):
    """Deletes the files of a run in `folder` by their exact names, then best/ and last/ if empty
    (the folder itself stays)."""
    for name in RUN + TMP:
        if os.path.lexists(os.path.join(folder, name)):
            os.remove(os.path.join(folder, name))
    for sub in ('best', 'last'):
        if os.path.isdir(os.path.join(folder, sub)) and not os.listdir(os.path.join(folder, sub)):
            os.rmdir(os.path.join(folder, sub))


def why_not_a_run(folder):
    """Why `folder`/last is no train.py run's checkpoint, or None."""
    try:
        return None if 'history' in checkpoint_meta(os.path.join(folder, 'last')) else 'no history'
    except Exception as e:  # missing, unreadable, not ours: the message says which
        return one_line(e)


class RunFolder:
    """--out of one train.py, checked for a new run, --resume or --overwrite and locked before
    anything is computed: another train.py is refused until this one ends (the OS drops the lock
    with the process, however it ends). Used as `with RunFolder(...) as folder:`."""

    def __init__(self, out, resume=False, overwrite=False):
        self.name, self.path = out, os.path.realpath(out)
        if os.path.islink(out) and not os.path.exists(out):
            raise ValueError(f'--out {out}: a symbolic link to nothing ({self.path})')
        if unwritable(self.path):
            raise ValueError(f'--out {out}: {unwritable(self.path)}')
        self.made, up = [], self.path  # the folders made here, deepest first
        while not os.path.exists(up):
            self.made.append(up)
            up = os.path.dirname(up)
        os.makedirs(self.path, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise ValueError(f'--out {out}: another train.py is using this folder; let it end, '
                             'or choose another --out') from None
        self.saved, self.replacing, self.mine = resume, False, False
        try:
            self._check(resume, overwrite)
        except BaseException:
            self.release(failed=True)
            raise

    def _check(self, resume, overwrite):
        top = sorted(os.listdir(self.path))
        other = next((os.path.join(self.name, n) for n in (  # the first, found without a full walk
            os.path.relpath(os.path.join(r, n), self.path) for r, dirs, files in os.walk(self.path)
            for n in sorted(dirs + files)) if n not in OURS), None)
        why, run = top and why_not_a_run(self.path), {'best', 'last'} & set(top)
        if resume:
            if 'last' not in top:
                raise ValueError(f'--resume: {self.name} holds no run to continue; start one '
                                 + ('with --overwrite' if run else 'without it'))
            for name in TMP:  # what killed saves left
                if os.path.lexists(os.path.join(self.path, name)):
                    os.remove(os.path.join(self.path, name))
        elif top and not why and not overwrite:
            raise ValueError(f'--out {self.name}: holds an earlier run; continue it with --resume, '
                             'replace it with --overwrite, or choose another --out')
        elif other and overwrite and run:
            raise ValueError(f'--overwrite: {other} is not a file train.py writes; nothing is '
                             'deleted while it is there')
        elif other or top and not run:
            raise ValueError(f'--out {self.name}: holds no train.py run (it holds '
                             f'{", ".join(top[:3])}...); choose another --out')
        elif top and not overwrite:
            raise ValueError(f'--out {self.name}: holds a train.py run that saved no epoch or is '
                             f'damaged ({why}); replace it with --overwrite or choose another --out')
        elif top:
            self.replacing = True  # then mine
            if why:
                print(f'--overwrite: {self.name} holds a run that saved no epoch or is damaged '
                      f'({why}); replacing it', file=sys.stderr)
        self.mine = not top  # whatever comes into the folder is this run's

    def release(self, failed):
        """Unlocks; on failure before a first epoch was saved whole, deletes what this run wrote
        and the folders it made."""
        if failed and self.mine and not self.saved:
            delete_run(self.path)
        for folder in self.made if failed else ():
            if not os.listdir(folder):
                os.rmdir(folder)
        os.close(self.fd)

    def __enter__(self):
        return self

    def __exit__(self, failed, *_):
        self.release(failed is not None)

    def load_last(self, device='cpu'):
        return load_checkpoint(os.path.join(self.path, 'last'), device)

    def save(self, model, tokenizer, meta, history, extra, improved):
        """best/ (with `improved`), metrics.jsonl (`history`), then last/ (with `extra`): a kill
        between them re-runs the epoch at --resume. --overwrite deletes the earlier run first."""
        if self.replacing:
            delete_run(self.path)
            self.replacing, self.mine = False, True
        if improved:  # best/ keeps the initial label embeddings for tools/similar.py
            save_checkpoint(os.path.join(self.path, 'best'), model, tokenizer,
                            {**meta, 'epoch': len(history) - 1, 'dev': history[-1]},
                            {k: v for k, v in extra.items() if k == 'labels_at_init'})
        write_whole(os.path.join(self.path, METRICS),
                    ''.join(json.dumps(h) + '\n' for h in history))
        save_checkpoint(os.path.join(self.path, 'last'), model, tokenizer,
                        {**meta, 'history': history}, extra)
        self.saved = True


# -----------------------------------------------------------------------------
# The scripts' one error exit

def exit_on_error(main, *args):
    """Runs main(*args); a user's mistake, the OS's refusal (naming the file), running out of GPU
    memory or Ctrl-C ends it with one line (exit 1), a closed pipe (`... | head -1`) quietly."""
    try:
        main(*args)
        sys.stdout.flush()  # here, so that a closed pipe is caught below
    except BrokenPipeError:  # the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit('interrupted')
    except torch.OutOfMemoryError:
        sys.exit('error: out of GPU memory (train.py: try a smaller --batch)')
    except OSError as e:  # the OS's words
        sys.exit(f'error: {e.filename}: {e.strerror}' if e.filename else f'error: {e}')
    except (ValueError, FloatingPointError) as e:
        sys.exit('error: ' + str(e).replace('\n', ' '))
