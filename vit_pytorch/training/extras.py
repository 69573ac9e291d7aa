"""The optional packages the commands need: a missing one is named with the pip command that installs it.

The extras are not on the package index, so the command installs the extra from this checkout by its absolute
path (or, from a wheel install, the distributions themselves).
"""

import importlib
import shlex
from pathlib import Path

# the pip name of each optional module the commands import, where it differs
DISTRIBUTIONS = dict(sklearn='scikit-learn', PIL='pillow')


class MissingExtra(ImportError):
    """An optional package a command needs is not installed; the message names it and the extra that brings it."""


def checkout():
    """The root of the vit_pytorch checkout this package runs from (an editable install or PYTHONPATH),
    or None for a package installed from a wheel, which has no setup.py beside it."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / 'setup.py').is_file() else None


def install_command(extra, distributions):
    """A pip command that installs `extra` (or, without a checkout, the `distributions` it would bring),
    as written from any folder: the package is not on the package index, so the extra comes from the
    checkout by its absolute path."""
    root = checkout()
    if root is None:
        return 'pip install ' + ' '.join(shlex.quote(distribution) for distribution in distributions)
    return 'pip install -e ' + shlex.quote(f'{root}[{extra}]')


def require(*modules, purpose, extra='train'):
    """Import `modules` now, or raise a MissingExtra naming every missing one and how to install them."""
    missing = []
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(DISTRIBUTIONS.get(module, module))
    if missing:
        how = f"the {extra!r} extra" if checkout() else 'them'
        raise MissingExtra(f"{purpose} needs {', '.join(missing)}, not installed here; install {how}: "
                           f"{install_command(extra, missing)}")
