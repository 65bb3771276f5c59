"""A train.py run on disk: files written whole, the run's folder, which one train.py at a time
holds, its files and checkpoints; and what the scripts share: their parser, --device and the
one error exit."""
import argparse
import fcntl
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from contextlib import suppress
from os.path import dirname, exists, isdir, islink, join
from pathlib import Path

from safetensors import SafetensorError, safe_open

# torch, and lhmix with it, are imported where they are used: the tools read a run's files by the
# names, rules and error exit here, without torch.


# Files written whole: a kill at any instant leaves the old file or the new one

def temporary(path):
    """Return the temporary file of write_whole for `path`: .NAME.tmp beside it."""
    return join(dirname(path), f'.{os.path.basename(path)}.tmp')


def write_whole(path, text):
    """Writes `text` (str or bytes) to `path` whole or not at all, making its folder: a synced
    temporary renamed over it, removed on any failure (disk full, Ctrl-C). OSErrors name `path`."""
    folder, tmp = dirname(os.path.abspath(path)), temporary(path)
    try:
        os.makedirs(folder, exist_ok=True)
        with open(tmp, 'wb') as f:  # A plain open(), so that the file has the umask's modes.
            f.write(text if isinstance(text, bytes) else text.encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(folder, os.O_RDONLY)  # The folder is synced so that the rename is on disk.
        os.fsync(fd)
        os.close(fd)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):  # fsync's error names no file.
            e.filename = e.filename or path
        raise


def one_line(e):
    """An exception as one line: its type and its message, whitespace collapsed."""
    return ' '.join(f'{type(e).__name__}: {e}'.split())


# A run's figures and its checkpoints: best/ holds the best dev macro-F1's, last/ the one to
# resume from. A checkpoint's files are written in the order of CHECKPOINT, its weights last.
METRICS, TEST_METRICS, WEIGHTS = 'metrics.jsonl', 'test_metrics.json', 'model.safetensors'
CHECKPOINT = ('tokenizer.json', 'tokenizer_config.json', 'config.json', WEIGHTS)
RUN = (METRICS, TEST_METRICS, *(f'{c}/{f}' for c in ('best', 'last') for f in CHECKPOINT))
TMP = tuple(map(temporary, RUN))
# An --overwrite writes its first epoch into NEW, which replaces the earlier run once it is whole.
NEW = '.new'
OURS = ('best', 'last') + RUN + TMP  # What train.py writes in a run folder, and in its NEW.


def unwritable(up):
    """Return why the folder `up` (made with its parents where missing) cannot be written in, or
    None."""
    while not exists(up):
        # The first folder of a relative name is the working one.
        up = dirname(up) or '.'
    if not isdir(up):
        return f'{up} is a file, not a folder'
    return None if os.access(up, os.W_OK | os.X_OK) else f'{up} is not writable'


# Checkpoints: a folder of CHECKPOINT, each file replaced whole. model.safetensors, written last,
# holds the weights, other tensors and JSON metadata, so that loading one runs no pickle.

def _aliases(model):
    """Return the names of tied copies (BERT's decoder weight is its word embeddings), which
    safetensors cannot store; config.json ties them again."""
    return (dict(model.named_parameters(remove_duplicate=False)).keys()
            - dict(model.named_parameters()))


def save_checkpoint(folder, model, tokenizer, meta, extra=None):
    """Writes the tokenizer and config.json (once), then model.safetensors: the weights, the
    `extra` tensors as extra.<name>, and metadata 'lhmix' (what rebuilds the LHMix, and `meta`)."""
    from safetensors.torch import save
    if not exists(join(folder, 'config.json')):
        # A temporary folder takes what transformers writes, since version 4 writes more files.
        with tempfile.TemporaryDirectory() as tmp:
            tokenizer.save_pretrained(tmp)
            model.mlm.config.save_pretrained(tmp)
            for f in CHECKPOINT[:-1]:
                write_whole(join(folder, f), Path(tmp, f).read_bytes())
    h, aliases = model.hierarchy, _aliases(model)
    meta = {**{k: getattr(model, k) for k in ('arch', 'base_vocab', 'special', 'max_length')},
            'hierarchy': {'labels': h.labels, 'names': h.names,
                          'parents': [h.labels[p] if p >= 0 else None for p in h.parent]}, **meta}
    tensors = {**model.state_dict(), **{f'extra.{k}': v for k, v in (extra or {}).items()}}
    # safetensors copies a GPU tensor to the CPU itself (transformers' save_pretrained relies on
    # it too) and reads a parameter's data, not its gradient.
    tensors = {k: v.contiguous() for k, v in tensors.items() if k not in aliases}
    # transformers writes 'format': 'pt' as well.
    write_whole(join(folder, WEIGHTS), save(tensors, {'lhmix': json.dumps(meta), 'format': 'pt'}))


def checkpoint_meta(folder):
    """Return the metadata of model.safetensors, its tensors unread (KeyError if it has none)."""
    path = join(folder, WEIGHTS)
    # Opened first, because safetensors says 'No such file' of a file it may not read.
    open(path, 'rb').close()
    with safe_open(path, 'pt') as f:
        return json.loads((f.metadata() or {})['lhmix'])


def load_checkpoint(folder, device='cpu', hierarchy=None):
    """Return (model, tokenizer, the metadata with 'extra': the other tensors). With `hierarchy`,
    the labels must be the data's. No code from the folder runs (config.json's auto_map is
    ignored)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer

    from lhmix import ARCHS, Hierarchy
    if os.path.isfile(folder):
        raise ValueError(f"{folder}: a file, not a checkpoint folder (such as a run's best/)")
    if isdir(join(folder, 'best')):
        raise ValueError(f'{folder}: a run, not a checkpoint: pass {join(folder, "best")}')
    if missing := [f for f in CHECKPOINT if not exists(join(folder, f))]:
        raise ValueError(f'{folder}: not an LH-Mix checkpoint (no {", ".join(missing)})')
    weights = join(folder, WEIGHTS)
    try:
        meta, tensors = checkpoint_meta(folder), load_file(weights)
    except (OSError, ValueError, KeyError, SafetensorError) as e:
        raise ValueError(f'{weights}: unreadable, truncated or corrupt ({one_line(e)})') from None
    meta['extra'] = {k[6:]: tensors.pop(k).to(device) for k in list(tensors)
                     if k.startswith('extra.')}
    try:
        h = meta['hierarchy']
        # from_config picks SDPA where the family has it, else eager (DeBERTa), as load_pretrained's
        # from_pretrained did for the run.
        mlm = AutoModelForMaskedLM.from_config(AutoConfig.from_pretrained(
            folder, trust_remote_code=False), trust_remote_code=False)
        model = ARCHS[meta['arch']](
            mlm, Hierarchy(*(dict(zip(h['labels'], h[k])) for k in ('parents', 'names'))),
            meta['base_vocab'], meta['special'], meta['max_length'])
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise ValueError(f'{folder}: config.json, tokenizer or metadata unreadable '
                         f'({one_line(e)})') from None
    # Loaded strictly, but for the tied copies, which load with the weight they are tied to.
    want = {k: v.shape for k, v in model.state_dict().items() if k not in _aliases(model)}
    bad = sorted(k for k in want.keys() | tensors.keys()
                 if want.get(k) != getattr(tensors.get(k), 'shape', None))
    if bad:
        raise ValueError(f'{weights}: weights missing, unexpected or not shaped as config.json '
                         f'says: {bad[0]} and {len(bad) - 1} more')
    model.load_state_dict(tensors, strict=False)
    if hierarchy and model.hierarchy.labels != hierarchy.labels:
        raise ValueError(f'{folder}: its labels differ from those of the data' + (
            ' in their order (a taxonomy with its lines reordered?)'
            if sorted(model.hierarchy.labels) == sorted(hierarchy.labels) else ''))
    return model.to(device), tokenizer, meta


# The run folder: train.py holds it locked while it runs, and writes and deletes only OURS there:
# an earlier run's files once --overwrite's first epoch is whole in NEW, its own if it fails
# before its first save.

def digest(hierarchy, splits):
    """Return what --resume checks against the run's, and its record keeps: SHA-256 digests of
    the labels and their tree, of the label names, and of each split's documents, whole."""
    return {k: hashlib.sha256(json.dumps(x).encode()).hexdigest() for k, x in {
        'labels': [hierarchy.labels, hierarchy.parent], 'names': hierarchy.names, **splits}.items()}


def provenance(device, digests):
    """Where a run comes from, for its record: the commit of this file's repository, if any, and
    whether its tracked files had changes; the versions; the GPU; the data's digests."""
    import torch
    import transformers

    def git(*command):  # None where there is no git, or no repository
        with suppress(OSError, subprocess.CalledProcessError):
            return subprocess.run(['git', *command], cwd=dirname(os.path.abspath(
                __file__)), capture_output=True, text=True, check=True).stdout.strip()
    commit = git('rev-parse', 'HEAD')
    changes = commit and git('status', '--porcelain', '--untracked-files=no')
    return {'commit': commit, 'dirty': None if changes is None else changes != '',
            'python': platform.python_version(), 'torch': torch.__version__,
            'transformers': transformers.__version__, 'cuda': torch.version.cuda,
            'gpu': torch.cuda.get_device_name(device) if device.type == 'cuda' else None,
            'data': digests}


def rmdirs(*folders):
    """Removes those of these folders that are empty."""
    for folder in folders:
        with suppress(OSError):  # The OS removes only an empty folder.
            os.rmdir(folder)


def delete_run(folder, names=RUN + TMP):
    """Deletes these files of a run in `folder`, then best/ and last/ if empty (not `folder`)."""
    for name in names:
        Path(folder, name).unlink(missing_ok=True)
    rmdirs(join(folder, 'best'), join(folder, 'last'))


def settle(folder):
    """Finishes what an --overwrite left in folder/NEW. A whole epoch (its last/ weights are
    there) replaces the earlier run: the earlier test figures go, then best/, metrics.jsonl and
    last/ are each deleted and NEW's moved into their place (what NEW lacks is kept). NEW's last/
    moves last, so that after a kill at any instant, settle() finishes the replacement. A part of
    an epoch is deleted, and the earlier run stays."""
    new = join(folder, NEW)
    if exists(join(new, 'last', WEIGHTS)):
        delete_run(folder, (TEST_METRICS,) + TMP)
        for name in ('best', METRICS, 'last'):
            if exists(join(new, name)):  # No link: _check refuses one in NEW.
                delete_run(folder, [n for n in RUN if n.startswith(name)])
                os.replace(join(new, name), join(folder, name))
    if isdir(new):
        delete_run(new)
        os.rmdir(new)


def since_best(history):
    """Return the epochs since the best dev macro-F1 (the first of equal ones) of a run's
    metrics.jsonl lines: best/ holds that epoch, and early stopping counts them."""
    f1 = [h['dev_macro_f1'] for h in history]
    return len(f1) - 1 - f1.index(max(f1)) if f1 else 0


class RunFolder:
    """--out, checked for a new run, --resume or --overwrite and locked before anything is
    computed: another train.py is refused until this process ends in any way (the OS unlocks)."""

    def __init__(self, out, resume=False, overwrite=False):
        self.name, self.path = out, os.path.realpath(out)
        self.saved, self.replacing = True, False  # So far, a failure deletes nothing.
        if islink(out) and not exists(out):
            raise ValueError(f'--out {out}: a symbolic link to nothing ({self.path})')
        # An unwritable folder is refused now, not at the first save, an epoch later.
        if why := unwritable(out) or unwritable(f'{out}/best') or unwritable(f'{out}/last'):
            raise ValueError(f'--out {out}: {why}')
        # The folders made here, deepest first (a missing folder's subfolders are missing too).
        self.made = [p for p in (self.path, *Path(self.path).parents) if not exists(p)]
        os.makedirs(self.path, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDONLY)
        try:  # Refused before the clean-up below, which would remove the holder's folders.
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            self._refuse('another train.py is using it; let it end')
        try:
            self.replacing = self._check(resume, overwrite)
        except BaseException:
            self.__exit__(True)
            raise
        self.saved = resume  # Until this run saves an epoch, a failure deletes what it wrote.

    def _check(self, resume, overwrite):
        """Refuses --out as it is, or says whether an earlier run is to be replaced."""
        # A link would have the run write or delete outside --out, in the user's own files.
        if link := next((n for n in (NEW,) + OURS if islink(join(self.path, n))), None):
            self._refuse(f'{join(self.name, link)} is a symbolic link (to '
                         f'{os.readlink(join(self.path, link))}), which train.py does not follow: '
                         'put what it names in its place')
        self._refuse_others(NEW)  # settle() deletes only train.py's files, and stops at another.
        settle(self.path)  # An --overwrite killed while it saved its first epoch.
        top = set(os.listdir(self.path))
        if resume and 'last' not in top:
            raise ValueError(f'--resume: {self.name} holds no run to continue')
        if resume:
            delete_run(self.path, TMP)  # What killed saves left.
        if resume or not top:
            return False
        why = None
        try:
            checkpoint_meta(join(self.path, 'last'))['history']
        except Exception as e:  # Missing, unreadable, not a run's: the message says which.
            why = one_line(e)
        if not (why or overwrite):  # why, a one_line(), is never empty.
            self._refuse('holds an earlier run: continue it (--resume), replace it (--overwrite)')
        self._refuse_others()
        # A run's figures without best/ and last/ are no state that train.py leaves: records kept
        # apart from their checkpoints, which not even --overwrite replaces.
        if {METRICS, TEST_METRICS} & top and not {'best', 'last'} & top:
            raise ValueError(f"--out {self.name}: holds a run's records without its checkpoints "
                             '(as results/records keeps them); choose another --out')
        damaged = f'holds a run that saved no epoch or is damaged ({why})'
        if not overwrite:
            self._refuse(f'{damaged}; replace it with --overwrite')
        if why:
            print(f'--overwrite: {self.name} {damaged}; replacing it', file=sys.stderr)
        return True

    def _refuse_others(self, sub=''):
        """Refuses --out if --out/sub holds a name train.py does not write, or a link: the first,
        found without a full walk."""
        folder = join(self.path, sub)
        if other := next((n for r, dirs, files in os.walk(folder) for n in (
                os.path.relpath(join(r, x), folder) for x in sorted(dirs + files))
                if n not in OURS or islink(join(folder, n))), None):
            self._refuse(f'{join(self.name, sub, other)} is not a file train.py writes; move it '
                         'away')

    def _refuse(self, why):
        """Refuses --out for `why`, which ends in the fix; choosing another --out is one too."""
        raise ValueError(f'--out {self.name}: {why}, or choose another --out') from None

    def __enter__(self):
        return self

    def __exit__(self, failed, *_):
        """On failure, deletes what this run wrote if it saved no epoch (an --overwrite's part of
        one, in NEW); removes the folders it made if they are empty (on success they hold the
        run); then unlocks."""
        if failed and self.replacing:
            settle(self.path)
        elif failed and not self.saved:
            delete_run(self.path)
        rmdirs(*self.made)
        os.close(self.fd)

    def load_last(self):
        """Return last/'s (model, tokenizer, meta) on the CPU, with Adam's state in meta['adam'],
        as its state_dict() holds it."""
        *loaded, meta = load_checkpoint(join(self.path, 'last'))
        meta['adam'] = {}
        for key in [k for k in meta['extra'] if k.startswith('adam.')]:
            _, i, name = key.split('.')
            meta['adam'].setdefault(int(i), {})[name] = meta['extra'].pop(key)
        return *loaded, meta

    def save(self, model, tokenizer, meta, history, extra, adam):
        """Writes best/ (if the last epoch is the best: since_best), metrics.jsonl, then last/
        (with Adam's state); both checkpoints keep the tensors `extra`. A kill between them re-runs
        the epoch at --resume. An --overwrite's first epoch is written into NEW, and replaces the
        earlier run once whole there; if it cannot be written (a disk too small for both, say),
        the earlier run stays."""
        root = join(self.path, NEW) if self.replacing else self.path
        try:
            if not since_best(history):
                save_checkpoint(join(root, 'best'), model, tokenizer, {
                    **meta, 'epoch': len(history) - 1, 'dev': history[-1]}, extra)
            write_whole(join(root, METRICS), ''.join(json.dumps(h) + '\n' for h in history))
            save_checkpoint(join(root, 'last'), model, tokenizer, {**meta, 'history': history}, {
                **extra, **{f'adam.{i}.{k}': v for i, kept in adam.state_dict()['state'].items()
                            for k, v in kept.items()}})
        except OSError as e:
            if self.replacing:
                e.strerror += f'; the earlier run in {self.name} is kept'
            raise
        settle(self.path)  # An --overwrite's first epoch, whole in NEW, replaces the earlier run.
        self.saved, self.replacing = True, False


# What the scripts share: their parser, --device, and the one error exit

def device(name):
    """Return the torch.device of cpu, cuda or cuda:N: an argparse type, so that a device that is
    not there is refused before anything is computed."""
    import torch
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    # Torch would refuse a GPU past the last only once the data is read.
    if not re.fullmatch(r'cpu|cuda(:\d+)?', name) or (name != 'cpu' and int(name[5:] or 0) >= n):
        raise argparse.ArgumentTypeError(f'{name}: only cpu' + (
            f', cuda or cuda:N with N < {n}' if n else ' (no CUDA GPU here)'))
    return torch.device(name)


def parser(doc):
    """Return a script's ArgumentParser, whose -h shows its docstring `doc` as written."""
    return argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_device(parser):
    """Adds --device to a script's flags."""
    import torch
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu',
                        type=device, help='cpu, cuda or cuda:N (default: cuda if there is one)')


def exit_on_error(main, *args):
    """Runs main(*args). A mistake, the OS's refusal, no GPU memory or Ctrl-C end it in one line
    (exit 1), a closed pipe (`... | head -1`) quietly."""
    try:
        main(*args)
        sys.stdout.flush()  # Here, so that a closed pipe is caught below.
    except BrokenPipeError:  # The reader has all it wanted.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit('interrupted')
    except OSError as e:  # The OS's own words.
        sys.exit(f'error: {e.filename}: {e.strerror}' if e.filename else f'error: {e}')
    except (ValueError, FloatingPointError) as e:
        sys.exit('error: ' + ' '.join(str(e).split()))
    except RuntimeError as e:  # torch's OutOfMemoryError, where torch is loaded (not the tools)
        if isinstance(e, getattr(sys.modules.get('torch'), 'OutOfMemoryError', ())):
            sys.exit('error: out of GPU memory; try a smaller --batch')
        raise
