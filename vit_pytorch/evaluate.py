"""Evaluate a trained checkpoint.

    python -m vit_pytorch.evaluate runs/digits-vit/checkpoint
    python -m vit_pytorch.evaluate runs/pets-vit/checkpoint --data ~/pets --split val

The model is rebuilt from the checkpoint's JSON configuration and safetensors weights alone,
and evaluated on the split it was tested on during training (or on `--data`): the data sets are
those of `vit_pytorch.training.data` (digits, a class-per-folder PATH, or a registered NAME:ARG).

The command needs the 'train' extra (safetensors and numpy for checkpoints, scikit-learn for
the digits, Pillow for folders); a missing package is named with the command that installs it
(`MissingExtra`): the package is not on the package index, so the command installs the extra from
this checkout by its absolute path.
"""

import argparse
import json
import sys

import torch

from vit_pytorch.training import registry
from vit_pytorch.training.checkpoints import CheckpointError, load_config, load_model
# the data sets and extras, at the path they had when this module held them
from vit_pytorch.training.data import (DIGITS_SPLITS, FOLDER_SPLITS, IMAGE_SUFFIXES, SOURCES, DataSource,  # noqa: F401
                                       ImageSet, data_source, folder_classes, load_digits, load_folder, load_split,
                                       normalise)
from vit_pytorch.training.extras import DISTRIBUTIONS, MissingExtra, checkout, install_command, require  # noqa: F401
from vit_pytorch.training.loop import autocast, command_flags, did_you_mean, evaluate  # noqa: F401

# the constructor arguments by which a model takes other sizes than it was built for
DYNAMIC_SIZE_ARGUMENTS = ('dynamic_image_size', 'dynamic_img_size')


@torch.no_grad()
def check_size(model, config, data, *, checkpoint, image_size, device):
    """A ValueError in the command's own terms when `model` does not take `data` at `--image-size`: the
    model's advice names its constructor's arguments, which this command cannot set."""
    data_config = config['data']
    was_training = model.training
    try:
        model.eval()(normalise(data.floats(slice(0, 1)).to(device), data_config['mean'], data_config['std']))
    except ValueError as error:
        name, kwargs = config['model'], config.get('model_kwargs', {})
        reason = str(error).split('; ')[0]
        advice = (f"the model in {checkpoint} ({name}, trained at {data_config['image_size']}) does not take "
                  f"--image-size {image_size} ({reason}): leave out --image-size to evaluate it at the size it "
                  f"trained at")
        accepted = registry.parameters(name) or ()
        dynamic = next((argument for argument in DYNAMIC_SIZE_ARGUMENTS if argument in accepted), None)
        if dynamic is not None and not kwargs.get(dynamic):
            advice += (f"; a model that takes other sizes is trained with python -m vit_pytorch.train --model {name} "
                       f"--{dynamic.replace('_', '-')} (and the rest of its options)")
        raise ValueError(advice) from error
    finally:
        model.train(was_training)


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m vit_pytorch.evaluate', description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('checkpoint', help='checkpoint folder (or its model.safetensors)')
    parser.add_argument('--data', help="'digits' or a class-per-folder data set (default: the one it trained on)")
    parser.add_argument('--split', help="split to evaluate (default: the one tested during training)")
    parser.add_argument('--image-size', type=int,
                        help="resize the data to this size, for a model that takes other sizes (na_vit, or one "
                             "trained with --dynamic-image-size) (default: the size it trained at)")
    parser.add_argument('--batch-size', type=int, default=256)
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--amp', action='store_true', help='bf16 autocast')
    parser.add_argument('--json', action='store_true', help='print the result as one JSON line')
    args, rest = parser.parse_known_args(argv)
    mistyped = [token.partition('=')[0] for token in rest if token.startswith('--')]
    if mistyped:
        flags = command_flags(parser)
        hint = did_you_mean(mistyped[0], flags) or f"it takes {', '.join(flags)}"
        print(f"error: unrecognised option {mistyped[0]}: not an option of {parser.prog}; {hint}", file=sys.stderr)
        return 2
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")

    try:
        data_config = load_config(args.checkpoint).get('data', {})     # config.json: JSON, no extra needed
        source = args.data or data_config.get('source')
        if source is None:
            raise CheckpointError(f"{args.checkpoint} does not say what data it was trained on; pass --data")
        chosen = data_source(source)
        # every missing package named at once where one extra brings them all
        one_extra = chosen.extra == 'train'
        require('safetensors', 'numpy', *(chosen.requires if one_extra else ()),
                purpose='python -m vit_pytorch.evaluate')
        if not one_extra:
            require(*chosen.requires, purpose=f'python -m vit_pytorch.evaluate on {source}', extra=chosen.extra)
        model, config = load_model(args.checkpoint, device=args.device)
        data_config = config.get('data', {})
        missing = [key for key in ('channels', 'mean', 'std') + (() if args.image_size else ('image_size',))
                   if data_config.get(key) is None]
        if missing:
            raise CheckpointError(f"the configuration of {args.checkpoint} lacks the data's {', '.join(missing)} "
                                  f"(config.json, 'data'): corrupt, or not written by vit_pytorch.train?")
        split = args.split or data_config.get('test_split') or chosen.test_split
        image_size = args.image_size or data_config['image_size']
        data = chosen.load(split, image_size=image_size, channels=data_config['channels'],
                           classes=data_config.get('classes') if source != 'digits' else None)
        if args.image_size:
            check_size(model, config, data, checkpoint=args.checkpoint, image_size=image_size, device=args.device)
        result = evaluate(model, data, mean=data_config['mean'], std=data_config['std'],
                          batch_size=args.batch_size, device=args.device, amp=args.amp)
    except (CheckpointError, FileNotFoundError, NotADirectoryError, ValueError, MissingExtra) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    result.update(checkpoint=str(args.checkpoint), data=str(source), split=split, image_size=image_size)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{source} {split}: accuracy {100 * result['accuracy']:.2f}% ({result['correct']}/{result['count']}), "
              f"loss {result['loss']:.4f}")
    return 0


if __name__ == '__main__':
    sys.exit(main())
