"""The package's import tiers: every import points down (or sideways within a tier), never up, with no circle and
no private name used across modules.

    tier 0  vit                      the ViT, its token blocks, checks and old layouts: one copyable file
    tier 1  multiscale, pretrained,  the blocks the multi-scale models share; the ViT's checkpoint plans and the
            sigreg                   plan runner, which other models' plans build on (deit, learnable_memory_vit);
                                     SIGReg, the loss LeJEPA and the What-Where Transformer share
    tier 2  models and wrappers      every module not named below (and the package's __init__)
    tier 3  recorder, extractor, analysis, flops, plots
    tier 4  vit_pytorch.training.*   loop, checkpoints, data sources, extras, registry, run folders
            (and the old paths models, checkpoint, run_folder, ucr, clips, which re-export from there)
    tier 5  the commands train, pretrain, experiments, evaluate

The modules are read with `ast`, not imported, so imports inside functions count as much as those at the top.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / 'vit_pytorch'

TIERS = {
    'vit': 0,
    'multiscale': 1, 'pretrained': 1, 'sigreg': 1,
    'recorder': 3, 'extractor': 3, 'analysis': 3, 'flops': 3, 'plots': 3,
    'training': 4, 'models': 4, 'checkpoint': 4, 'run_folder': 4, 'ucr': 4, 'clips': 4,
    'train': 5, 'pretrain': 5, 'experiments': 5, 'evaluate': 5,
}
MODEL_TIER = 2

# model modules that import more than one other model module today (a model may build on one family base);
# the list may only shrink
SEVERAL_BASES = {'distill'}


def module_names():
    """Every module of the package as its dotted name, `vit_pytorch` for the package's __init__."""
    names = {}
    for path in sorted(PACKAGE.rglob('*.py')):
        parts = ('vit_pytorch',) + path.relative_to(PACKAGE).with_suffix('').parts
        if parts[-1] == '__init__':
            parts = parts[:-1]
        names['.'.join(parts)] = path
    return names


MODULES = module_names()


def tier(module):
    """The tier of a dotted module name of the package."""
    parts = module.split('.')
    if len(parts) == 1:
        return MODEL_TIER
    return TIERS.get(parts[1], MODEL_TIER)


def resolve(module, name=None):
    """The package module that `from module import name` (or `import module` when `name` is None) reaches."""
    if name is not None and f'{module}.{name}' in MODULES:
        return f'{module}.{name}'
    return module if module in MODULES else None


def imports(module):
    """(line, imported module, names taken from it, local names bound to package modules) for each import."""
    tree = ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))
    package = module if MODULES[module].name == '__init__.py' else module.rpartition('.')[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = resolve(alias.name)
                if target:
                    found.append((node.lineno, target, (), {alias.asname: target} if alias.asname else {}))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                anchor = package.split('.')[:len(package.split('.')) - node.level + 1]
                base = '.'.join(anchor + ([base] if base else []))
            if not base.startswith('vit_pytorch'):
                continue
            for alias in node.names:
                target = resolve(base, alias.name)
                if target is None:
                    continue
                names = () if target == f'{base}.{alias.name}' else (alias.name,)
                bound = {alias.asname or alias.name: target} if target == f'{base}.{alias.name}' else {}
                found.append((node.lineno, target, names, bound))
    return found


def test_the_tier_table_names_only_modules_that_exist_or_are_planned():
    present = {name.split('.')[1] for name in MODULES if '.' in name}
    assert set(TIERS) - present <= {'multiscale'}


@pytest.mark.parametrize('module', sorted(MODULES))
def test_imports_point_down_or_sideways(module):
    upward = [f'line {line}: {target} (tier {tier(target)})' for line, target, _, _ in imports(module)
              if tier(target) > tier(module)]
    assert not upward, f'{module} (tier {tier(module)}) imports a higher tier: {upward}'


def test_no_import_circle():
    graph = {module: {target for _, target, _, _ in imports(module) if target != module} for module in MODULES}
    # the package's __init__ runs before any of its modules, so an edge into it closes no circle of ours
    graph = {module: targets - {'vit_pytorch', 'vit_pytorch.training'} for module, targets in graph.items()}
    circles, state = [], {}

    def visit(module, path):
        state[module] = 'open'
        for target in sorted(graph[module]):
            if state.get(target) == 'open':
                circles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = 'done'

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, f'import circles: {[" -> ".join(circle) for circle in circles]}'


def private(name):
    return name.startswith('_') and not (name.startswith('__') and name.endswith('__'))


@pytest.mark.parametrize('module', sorted(MODULES))
def test_no_private_name_used_across_modules(module):
    found = imports(module)
    used = [f'line {line}: {target}.{name}' for line, target, names, _ in found for name in names if private(name)]
    aliases = {local: target for _, _, _, bound in found for local, target in bound.items()}
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and private(node.attr) and aliases[node.value.id] != module):
            used.append(f'line {node.lineno}: {aliases[node.value.id]}.{node.attr}')
    assert not used, f'{module} uses private names of other modules: {used}'


def model_bases(module):
    """The other model modules (tier 2, not the package's __init__) that a model module imports."""
    return {target for _, target, _, _ in imports(module)
            if tier(target) == MODEL_TIER and target not in (module, 'vit_pytorch')}


def test_a_model_builds_on_at_most_one_other_model_module():
    models = [module for module in MODULES if tier(module) == MODEL_TIER and module != 'vit_pytorch']
    several = {module.split('.')[-1]: sorted(model_bases(module)) for module in models}
    several = {name: bases for name, bases in several.items() if len(bases) > 1}
    assert set(several) <= SEVERAL_BASES, f'model modules importing more than one model module: {several}'
