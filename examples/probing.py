"""What the probe scripts share (examples/lejepa_probes.py, examples/esvit_probes.py): one short
pre-training by `python -m vit_pytorch.pretrain` with a probe's options, its learner measured after every epoch.

`run_probe` pre-trains through `pretraining.pretrain` (the command's run, its defaults, seed 0 unless the options
say otherwise), calls `measure(learner, config)` each time the run saves the whole learner (once an epoch), and
writes <out>/<name>.jsonl: one line per epoch, the log's record and the measurements (and the whole probe's CPU
seconds, `probe_cpu_seconds`); a complete file is read back
instead of run again. `edit(learner)` changes what no flag reaches, applied to the learner the command builds before
its optimizer is made (`edited_method`).
"""

import contextlib
import json
import shlex
import time
from pathlib import Path

from unittest import mock

import torch

from vit_pytorch import models as registry
from vit_pytorch import pretrain
from vit_pytorch.training import pretraining
from vit_pytorch.training.checkpoints import save_checkpoint


def edited_method(method, edit):
    """The command's `--method method` entry with `edit(learner)` applied once the learner is built."""
    base = type(pretraining.METHODS[method])

    class Edited(base):
        def build(self, *args, **kwargs):
            learner = super().build(*args, **kwargs)
            edit(learner)
            return learner

    return Edited()


def untrained_learner(argv, train_set):
    """(args, the learner the command builds from `argv` on `train_set`'s images before any step, their mean and
    std per channel): the model from the registry at the command's seed, as the run builds it."""
    args, model_kwargs = pretrain.parse_args(argv)
    pixels = train_set.floats()
    mean, std = pixels.mean(dim=(0, 2, 3)).tolist(), pixels.std(dim=(0, 2, 3)).tolist()
    kwargs = registry.model_config(args.model, model_kwargs, image_size=tuple(pixels.shape[2:]),
                                   channels=pixels.shape[1], num_classes=len(train_set.classes))
    torch.manual_seed(args.seed)
    encoder = registry.build_model(args.model, **kwargs)
    learner = pretraining.build_learner(args, encoder, image_size=tuple(pixels.shape[2:]), mean=mean, std=std)
    return args, learner, mean, std


def run_probe(method, name, options, out, epochs, threads, measure, edit=None):
    """Pre-train one probe with `--method method` plus `options` (a string), measuring after every epoch; its
    records (the log's lines with the measurements)."""
    out = Path(out)
    path = out / f'{name}.jsonl'
    if path.exists() and len(path.read_text().splitlines()) == epochs:
        return [json.loads(line) for line in path.read_text().splitlines()]
    argv = ['--method', method, '--epochs', str(epochs), '--seed', '0', '--threads', str(threads), '--quiet',
            '--no-plots', '--overwrite', '--out', str(out / name), *shlex.split(options)]
    args, model_kwargs = pretrain.parse_args(argv)
    measured = []

    def save(folder, *, model, config, **kwargs):
        save_checkpoint(folder, model=model, config=config, **kwargs)
        if Path(folder).name == 'pretrainer':             # the whole learner, once an epoch
            measured.append(measure(model, config))

    torch.set_num_threads(threads)
    started = time.process_time()
    with contextlib.ExitStack() as run:
        if edit is not None:
            run.enter_context(mock.patch.dict(pretraining.METHODS, {method: edited_method(method, edit)}))
        pretraining.pretrain(args, model_kwargs, parser=pretrain.build_parser(), rank=0, world_size=1,
                             device='cpu', run=run, save=save)
    log = [json.loads(line) for line in (out / name / 'log.jsonl').read_text().splitlines()]
    cpu = time.process_time() - started                   # the pre-training and its measurements, this process
    records = [{**record, **measurement, 'probe_cpu_seconds': cpu} for record, measurement in zip(log, measured)]
    path.write_text(''.join(json.dumps(record) + '\n' for record in records))
    return records
